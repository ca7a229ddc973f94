// Checked pread / pwrite loops and the atomic tmp+fsync+rename writer of file_io.h.
#include "data/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "core/error.h"

namespace mw::data {

ReadOnlyFile::ReadOnlyFile(const std::string& path, const std::string& what,
                           const std::string& hint)
    : path_(path), what_(what) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    int err = errno;
    throw IoError(str("cannot open ", what, " '", path, "': ", errno_text(err), "; ", hint), path,
                  0, 0, err);
  }
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw IoError(str("cannot stat ", what, " '", path, "': ", errno_text(err)), path, 0, 0, err);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw IoError(str(what, " '", path, "' is a directory, expected a file; ", hint), path, 0, 0,
                  EISDIR);
  }
  size_bytes_ = static_cast<int64_t>(st.st_size);
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

ReadOnlyFile::ReadOnlyFile(ReadOnlyFile&& other) noexcept
    : path_(std::move(other.path_)),
      what_(std::move(other.what_)),
      fd_(std::exchange(other.fd_, -1)),
      size_bytes_(other.size_bytes_) {}

ReadOnlyFile& ReadOnlyFile::operator=(ReadOnlyFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    what_ = std::move(other.what_);
    fd_ = std::exchange(other.fd_, -1);
    size_bytes_ = other.size_bytes_;
  }
  return *this;
}

void ReadOnlyFile::read_exact(void* dst, int64_t nbytes, int64_t offset) const {
  MW_CHECK_T(InvalidArgument, nbytes >= 0 && offset >= 0, "read of ", nbytes, " bytes at offset ",
             offset, " from '", path_, "': size and offset must be non-negative");
  char* out = static_cast<char*>(dst);
  int64_t done = 0;
  while (done < nbytes) {
    // Linux transfers at most 0x7ffff000 bytes per call; ask for at most 1 GiB at a time.
    size_t want = static_cast<size_t>(std::min<int64_t>(nbytes - done, int64_t{1} << 30));
    ssize_t got = ::pread(fd_, out + done, want, static_cast<off_t>(offset + done));
    if (got < 0) {
      int err = errno;
      if (err == EINTR) continue;
      throw IoError(str("read of ", what_, " '", path_, "' failed at offset ", offset + done, " (",
                        nbytes - done, " bytes left): ", errno_text(err)),
                    path_, offset + done, nbytes - done, err);
    }
    if (got == 0) {
      throw FormatError(str(what_, " '", path_, "' ended at byte ", offset + done, " but ",
                            nbytes - done, " more bytes were expected there: the file is ",
                            "truncated (or shrank while being read)"));
    }
    done += got;
  }
}

namespace {

std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

[[noreturn]] void throw_write_error(const std::string& action, const std::string& path,
                                    int64_t offset, int64_t length, int err,
                                    const std::string& hint) {
  std::string advice = hint;
  if (err == ENOSPC || err == EDQUOT) advice = "free disk space, or " + hint;
  throw IoError(str("cannot ", action, " '", path, "': ", errno_text(err), "; ", advice), path,
                offset, length, err);
}

}  // namespace

void write_file_atomically(const std::string& path, const std::vector<WritePiece>& pieces,
                           const std::string& hint) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_write_error("create", tmp, 0, 0, errno, hint);
  // From here on, any failure closes and removes tmp before throwing.
  auto fail = [&](const std::string& action, int64_t offset, int64_t length, int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw_write_error(action, tmp, offset, length, err, hint);
  };
  int64_t offset = 0;
  for (const WritePiece& piece : pieces) {
    const char* src = static_cast<const char*>(piece.data);
    int64_t done = 0;
    while (done < piece.nbytes) {
      size_t want = static_cast<size_t>(std::min<int64_t>(piece.nbytes - done, int64_t{1} << 30));
      ssize_t put = ::pwrite(fd, src + done, want, static_cast<off_t>(offset + done));
      if (put < 0) {
        if (errno == EINTR) continue;
        fail("write", offset + done, piece.nbytes - done, errno);
      }
      if (put == 0) fail("write", offset + done, piece.nbytes - done, ENOSPC);
      done += put;
    }
    offset += piece.nbytes;
  }
  if (::fsync(fd) != 0) fail("fsync", 0, offset, errno);
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw_write_error("close", tmp, 0, offset, err, hint);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw_write_error("rename the finished file onto", path, 0, offset, err, hint);
  }
  // Make the rename durable. Failure to open the directory (unusual permissions) is not fatal:
  // the data itself is already on disk.
  int dir_fd = ::open(parent_dir(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

}  // namespace mw::data
