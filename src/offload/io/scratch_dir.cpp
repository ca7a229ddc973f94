// make_private_dir (scratch_dir.h).
#include "offload/io/scratch_dir.h"

#include <cerrno>
#include <cstdlib>

#include "core/error.h"

namespace mw::io {

std::string make_private_dir(const std::string& stem) {
  const char* base = ::getenv("TMPDIR");
  std::string pattern = str(base && *base ? base : "/tmp", "/memwall-", stem, "-XXXXXX");
  if (::mkdtemp(pattern.data()) == nullptr) {
    const int err = errno;
    throw IoError(str("cannot create a private offload directory '", pattern, "': ",
                      errno_text(err), "; pass --nvme-dir to a writable directory on a disk"),
                  pattern, 0, 0, err);
  }
  return pattern;
}

}  // namespace mw::io
