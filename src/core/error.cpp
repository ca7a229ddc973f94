// errno_text: strerror_r wrapper that also names the errno symbol for the common cases.
#include "core/error.h"

#include <cstring>

namespace mw {

namespace {
const char* errno_name(int err) {
  switch (err) {
    case EIO: return "EIO";
    case ENOSPC: return "ENOSPC";
    case EFBIG: return "EFBIG";
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    case ENOENT: return "ENOENT";
    case EINVAL: return "EINVAL";
    case EROFS: return "EROFS";
    case ENOTDIR: return "ENOTDIR";
    case EEXIST: return "EEXIST";
    case ENOMEM: return "ENOMEM";
    case EAGAIN: return "EAGAIN";
    case EINTR: return "EINTR";
    case EBADF: return "EBADF";
    case ENOSYS: return "ENOSYS";
    case EDQUOT: return "EDQUOT";
    default: return nullptr;
  }
}
}  // namespace

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns a char* that may or may not point into buf.
  const char* msg = strerror_r(err, buf, sizeof buf);
  const char* name = errno_name(err);
  return name ? str(msg, " (", name, ")") : str(msg, " (errno ", err, ")");
}

}  // namespace mw
