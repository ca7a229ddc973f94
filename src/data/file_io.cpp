// Checked pread / pwrite loops, the regular-file check, the atomic tmp+fsync+rename writer and the
// write fault-injection point of file_io.h.
#include "data/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <utility>

#include "core/error.h"
#include "core/interrupt.h"
#include "core/numbers.h"
#include "core/process_limits.h"
#include "data/atomic_save.h"

namespace mw::data {

namespace {

const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

int open_regular_file(const std::string& path, const std::string& what, const std::string& hint,
                      int64_t* size_bytes) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    // Note [Open files]: the file is fine; this process has reached its limit.
    const std::string remedy =
        err == EMFILE ? str("this process has ", open_file_limit(), " files open, its limit (",
                            "`ulimit -n`): raise the limit, e.g. `ulimit -n 65536`")
                      : hint;
    throw IoError(str("cannot open ", what, " '", path, "': ", errno_text(err), "; ", remedy), path,
                  0, 0, err);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw IoError(str("cannot stat ", what, " '", path, "': ", errno_text(err)), path, 0, 0, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IoError(str(what, " '", path, "' is ", file_type_name(st.st_mode),
                      ", expected a regular file; ", hint),
                  path, 0, 0, S_ISDIR(st.st_mode) ? EISDIR : EINVAL);
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  *size_bytes = static_cast<int64_t>(st.st_size);
  return fd;
}

std::string read_text_file(const std::string& path, const std::string& what,
                           const std::string& hint, int64_t max_bytes) {
  ReadOnlyFile file(path, what, hint);
  MW_CHECK_T(FormatError, file.size_bytes() <= max_bytes, what, " '", path, "' is ",
             file.size_bytes(), " bytes, more than the ", max_bytes, " expected of it; ", hint);
  std::string text(static_cast<size_t>(file.size_bytes()), '\0');
  file.read_exact(text.data(), file.size_bytes(), 0);
  if (text.starts_with(kUtf8ByteOrderMark)) text.erase(0, kUtf8ByteOrderMark.size());
  return text;
}

ReadOnlyFile::ReadOnlyFile(const std::string& path, const std::string& what,
                           const std::string& hint)
    : path_(path), what_(what) {
  fd_ = open_regular_file(path, what, hint, &size_bytes_);
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

[[noreturn]] void throw_write_error(const std::string& action, const std::string& path,
                                    int64_t offset, int64_t length, int err,
                                    const std::string& hint) {
  std::string advice = hint;
  if (err == ENOSPC || err == EDQUOT) advice = "free disk space, or " + hint;
  if (err == EFBIG) advice = str(kFileTooLargeHint, "; raise it, or ", hint);
  throw IoError(str("cannot ", action, " '", path, "': ", errno_text(err), "; ", advice), path,
                offset, length, err);
}

struct FaultState {
  std::mutex mutex;
  bool env_read = false;
  WriteFault fault = WriteFault::kNone;
  int64_t countdown = 0;  // writes left before the fault; fires at 1
};

FaultState& faults() {
  static FaultState state;
  return state;
}

// MW_WRITE_FAULT="enospc@N" | "eio@N" | "short@N" | "stall@N": the Nth write of this process.
void read_fault_env(FaultState& f) {
  f.env_read = true;
  const char* env = std::getenv("MW_WRITE_FAULT");
  if (!env || !*env) return;
  std::string spec = env;
  size_t at = spec.find('@');
  MW_CHECK_T(InvalidArgument, at != std::string::npos, "MW_WRITE_FAULT '", spec,
             "': expected enospc@N, eio@N, short@N or stall@N");
  std::string kind = spec.substr(0, at);
  f.countdown = parse_integer(spec.substr(at + 1), "MW_WRITE_FAULT", 1, INT64_MAX);
  if (kind == "enospc")
    f.fault = WriteFault::kNoSpace;
  else if (kind == "eio")
    f.fault = WriteFault::kIoError;
  else if (kind == "short")
    f.fault = WriteFault::kShortWrite;
  else if (kind == "stall")
    f.fault = WriteFault::kStall;
  else
    throw InvalidArgument(
        str("MW_WRITE_FAULT '", spec, "': expected enospc@N, eio@N, short@N or stall@N"));
}

// The fault due at this write, if any. ENOSPC and EIO persist once they fire (a full or failed disk
// stays so); a short write happens once.
WriteFault next_write_fault() {
  FaultState& f = faults();
  std::lock_guard<std::mutex> lock(f.mutex);
  if (!f.env_read) read_fault_env(f);
  if (f.fault == WriteFault::kNone) return WriteFault::kNone;
  if (f.countdown > 1) {
    --f.countdown;
    return WriteFault::kNone;
  }
  WriteFault due = f.fault;
  if (due == WriteFault::kShortWrite || due == WriteFault::kStall) f.fault = WriteFault::kNone;
  return due;
}

}  // namespace

void set_write_fault_for_testing(WriteFault fault, int64_t nth_write) {
  FaultState& f = faults();
  std::lock_guard<std::mutex> lock(f.mutex);
  f.env_read = true;
  f.fault = fault;
  f.countdown = nth_write;
}

void write_exact(int fd, const std::string& path, const void* data, int64_t nbytes, int64_t offset,
                 const std::string& hint) {
  const char* src = static_cast<const char*>(data);
  const WriteFault fault = next_write_fault();
  if (fault == WriteFault::kNoSpace) throw_write_error("write", path, offset, nbytes, ENOSPC, hint);
  if (fault == WriteFault::kIoError) throw_write_error("write", path, offset, nbytes, EIO, hint);
  int64_t done = 0;
  while (done < nbytes) {
    if (stop_signal() != 0) throw_if_stop_requested(str("while writing '", path, "'").c_str());
    // Linux transfers at most 0x7ffff000 bytes per call; ask for at most 1 GiB at a time. A
    // short-write fault asks for half, as a kernel may give.
    int64_t want = std::min<int64_t>(nbytes - done, int64_t{1} << 30);
    const bool partial = fault == WriteFault::kShortWrite || fault == WriteFault::kStall;
    if (partial && done == 0 && want > 1) want /= 2;
    if (fault == WriteFault::kStall && done > 0) {  // half written: wait for a signal
      while (stop_signal() == 0 || stop_deferred()) ::usleep(1000);  // deferred: the second's
      continue;  // the check at the loop's top throws Interrupted
    }
    ssize_t put =
        ::pwrite(fd, src + done, static_cast<size_t>(want), static_cast<off_t>(offset + done));
    if (put < 0) {
      if (errno == EINTR) continue;
      throw_write_error("write", path, offset + done, nbytes - done, errno, hint);
    }
    if (put == 0) throw_write_error("write", path, offset + done, nbytes - done, ENOSPC, hint);
    done += put;
  }
}

std::string parent_directory(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string temporary_sibling(const std::string& path, const char* kind) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.find_last_of('/');
  const std::string name = slash == std::string::npos ? p : p.substr(slash + 1);
  const std::string dir = slash == std::string::npos ? "" : p.substr(0, slash + 1);
  return str(dir, ".", name, ".", kind, "-", ::getpid());
}

void fsync_directory(const std::string& dir) {
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

AtomicFileWriter::AtomicFileWriter(std::string path, std::string hint, bool create_parents)
    : path_(std::move(path)), tmp_(temporary_sibling(path_)), hint_(std::move(hint)) {
  std::error_code ec;  // a failure to create them is reported by open()
  if (create_parents) std::filesystem::create_directories(parent_directory(path_), ec);
  remove_stale_temporaries(path_);  // a kill -9 during an earlier save to this path
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw_write_error(str("create the temporary file for '", path_, "' at"), tmp_, 0, 0, errno,
                      hint_);
  registered_.set(tmp_);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFileWriter::append(const void* data, int64_t nbytes) {
  MW_CHECK_T(InvalidArgument, fd_ >= 0, "append to '", path_, "' after commit()");
  write_exact(fd_, tmp_, data, nbytes, offset_, hint_);
  offset_ += nbytes;
}

void AtomicFileWriter::commit() {
  MW_CHECK_T(InvalidArgument, fd_ >= 0, "commit() of '", path_, "' twice");
  throw_if_stop_requested(str("before renaming '", tmp_, "' into place").c_str());
  if (::fsync(fd_) != 0) throw_write_error("fsync", tmp_, 0, offset_, errno, hint_);
  const int fd = std::exchange(fd_, -1);
  registered_.release();  // from here on, this function removes it on failure
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp_.c_str());
    throw_write_error("close", tmp_, 0, offset_, err, hint_);
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp_.c_str());
    throw_write_error("rename the finished file onto", path_, 0, offset_, err, hint_);
  }
  fsync_directory(parent_directory(path_));
}

namespace {
ByteProducer from_pieces(const std::vector<WritePiece>& pieces) {
  return [&pieces](const ByteSink& emit) {
    for (const WritePiece& piece : pieces) emit(piece.data, piece.nbytes);
  };
}
}  // namespace

void write_file_atomically(const std::string& path, const ByteProducer& produce,
                           const std::string& hint) {
  AtomicFileWriter writer(path, hint);
  produce([&](const void* data, int64_t nbytes) { writer.append(data, nbytes); });
  writer.commit();
}

void write_file_atomically(const std::string& path, const std::vector<WritePiece>& pieces,
                           const std::string& hint) {
  write_file_atomically(path, from_pieces(pieces), hint);
}

void write_file(const std::string& path, const ByteProducer& produce, const std::string& hint) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_write_error("create", path, 0, 0, errno, hint);
  try {
    int64_t offset = 0;
    produce([&](const void* data, int64_t nbytes) {
      write_exact(fd, path, data, nbytes, offset, hint);
      offset += nbytes;
    });
    if (::fsync(fd) != 0) throw_write_error("fsync", path, 0, offset, errno, hint);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw_write_error("close", path, 0, 0, errno, hint);
}

void write_file(const std::string& path, const std::vector<WritePiece>& pieces,
                const std::string& hint) {
  write_file(path, from_pieces(pieces), hint);
}

}  // namespace mw::data
