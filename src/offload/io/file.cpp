// ensure_directory and ScratchFile of file.h.
#include "offload/io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "core/error.h"

namespace mw::io {

namespace {
std::atomic<bool> g_refuse_direct{false};
}

void set_refuse_direct_for_testing(bool refuse) { g_refuse_direct = refuse; }

void ensure_directory(const std::string& dir) {
  MW_CHECK_T(InvalidArgument, !dir.empty(), "offload directory path is empty; pass a directory");
  // Create each missing component, left to right.
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      int err = errno;
      throw IoError(str("cannot create offload directory '", dir, "' (at '", prefix,
                        "'): ", errno_text(err), "; pass a directory you can write to"),
                    prefix, 0, 0, err);
    }
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    int err = errno ? errno : ENOTDIR;
    throw IoError(str("offload path '", dir, "' is not a directory: ", errno_text(ENOTDIR),
                      "; pass a directory"),
                  dir, 0, 0, err);
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    int err = errno;
    throw IoError(str("offload directory '", dir, "' is not writable (", errno_text(err),
                      "); pass a directory you can write to"),
                  dir, 0, 0, err);
  }
}

ScratchFile::ScratchFile(const std::string& dir, const std::string& stem, bool want_direct) {
  static std::atomic<int64_t> counter{0};
  ensure_directory(dir);
  for (;;) {
    path_ = str(dir, dir.back() == '/' ? "" : "/", stem, "-", ::getpid(), "-", counter++, ".bin");
    int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
    if (want_direct && g_refuse_direct) {
      fd_ = -1;
      errno = EINVAL;
    } else {
      fd_ = want_direct ? ::open(path_.c_str(), flags | O_DIRECT, 0600) : -1;
    }
    direct_ = fd_ >= 0;
    if (fd_ < 0 && (!want_direct || errno == EINVAL || errno == EOPNOTSUPP)) {
      if (want_direct) ::unlink(path_.c_str());  // some kernels create it before refusing
      fd_ = ::open(path_.c_str(), flags, 0600);
    }
    if (fd_ >= 0) return;
    int err = errno;
    if (err == EEXIST) continue;  // a leftover of an earlier process with our pid: next name
    throw IoError(str("cannot create offload file '", path_, "': ", errno_text(err),
                      "; pass a writable directory with free space"),
                  path_, 0, 0, err);
  }
}

ScratchFile::~ScratchFile() { release(); }

void ScratchFile::release() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    if (linked_) ::unlink(path_.c_str());
    fd_ = -1;
  }
}

ScratchFile::ScratchFile(ScratchFile&& o) noexcept
    : fd_(o.fd_),
      path_(std::move(o.path_)),
      direct_(o.direct_),
      linked_(o.linked_),
      size_bytes_(o.size_bytes_) {
  o.fd_ = -1;
}

ScratchFile& ScratchFile::operator=(ScratchFile&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    direct_ = o.direct_;
    linked_ = o.linked_;
    size_bytes_ = o.size_bytes_;
    o.fd_ = -1;
  }
  return *this;
}

void ScratchFile::unlink_now() {
  if (!linked_) return;
  if (::unlink(path_.c_str()) != 0) {
    int err = errno;
    throw IoError(str("cannot unlink scratch file '", path_, "': ", errno_text(err)), path_, 0, 0,
                  err);
  }
  linked_ = false;
}

void ScratchFile::reserve(int64_t nbytes) {
  if (nbytes <= size_bytes_) return;
  int rc = ::fallocate(fd_, 0, size_bytes_, nbytes - size_bytes_);
  if (rc != 0) {
    int err = errno;
    if (err != EOPNOTSUPP && err != ENOSYS) {
      throw IoError(str("cannot grow offload file '", path_, "' from ", size_bytes_, " to ", nbytes,
                        " bytes: ", errno_text(err),
                        err == ENOSPC  ? "; free space on that drive or use another directory"
                        : err == EFBIG ? str("; ", kFileTooLargeHint)
                                       : std::string()),
                    path_, size_bytes_, nbytes - size_bytes_, err);
    }
  }
  size_bytes_ = nbytes;
}

void ScratchFile::truncate(int64_t nbytes) {
  if (nbytes >= size_bytes_) return;
  if (::ftruncate(fd_, nbytes) != 0) {
    int err = errno;
    throw IoError(
        str("cannot shrink offload file '", path_, "' to ", nbytes, " bytes: ", errno_text(err)),
        path_, nbytes, size_bytes_ - nbytes, err);
  }
  size_bytes_ = nbytes;
}

}  // namespace mw::io
