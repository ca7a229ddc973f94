// One writer per output (output_lock.h, Note [One writer per output]).
#include "data/output_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/numbers.h"

namespace mw::data {

namespace fs = std::filesystem;

namespace {

// The folders of `dir` that do not exist yet, outermost first, after creating them.
std::vector<std::string> create_missing_dirs(const fs::path& dir) {
  std::vector<std::string> missing;
  for (fs::path p = dir; !p.empty() && !fs::exists(p); p = p.parent_path()) {
    missing.insert(missing.begin(), p.string());
    if (p == p.parent_path()) break;
  }
  std::error_code ec;
  fs::create_directories(dir, ec);  // a failure shows in the open that follows
  return missing;
}

// The process holding a flock on the file behind `fd`, from /proc/locks ("1: FLOCK  ADVISORY
// WRITE 4242 00:2d:131 0 EOF"); 0 when it cannot be told (another pid namespace, no /proc).
long lock_holder(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return 0;
  std::ifstream in("/proc/locks");
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string id, kind, mode, access, dev_ino;
    long pid = 0;
    if (!(words >> id >> kind >> mode >> access >> pid >> dev_ino) || kind != "FLOCK") continue;
    unsigned major = 0, minor = 0;
    unsigned long long ino = 0;
    if (std::sscanf(dev_ino.c_str(), "%x:%x:%llu", &major, &minor, &ino) != 3) continue;
    if (ino == st.st_ino && major == ::major(st.st_dev) && minor == ::minor(st.st_dev) &&
        pid != ::getpid())
      return pid;
  }
  return 0;
}

bool is_empty_dir(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::is_empty(dir, ec) && !ec;
}

}  // namespace

OutputLock::OutputLock(const std::string& path, bool directory, const std::string& what,
                       const std::string& harm) {
  const fs::path p(path);
  created_dirs_ = create_missing_dirs(directory ? p : p.parent_path());
  if (directory) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  } else {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ >= 0)
      created_file_ = path;
    else if (errno == EEXIST)
      fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  }
  // What cannot be opened is left to the run's own checks and writes, which name the cause; and
  // a log on a device (/dev/null, /dev/stdout: a terminal two runs may share) is not locked.
  struct stat st {};
  if (fd_ >= 0 && !directory && (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode))) {
    ::close(fd_);
    fd_ = -1;
  }
  if (fd_ < 0) {
    release();
    return;
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return;
  const int err = errno;
  if (err != EWOULDBLOCK) {  // no flock here (Note [One writer per output]): unlocked
    release();
    return;
  }
  const long pid = lock_holder(fd_);
  release();
  throw InvalidArgument(str(what, " '", path, "' is being written by another run (",
                            pid > 0 ? str("process ", pid) : "a process",
                            " holds its lock): two runs on one ", what, " ", harm,
                            ". Wait for that run to end (or stop it), or pass another ", what));
}

OutputLock::~OutputLock() { release(); }

OutputLock::OutputLock(OutputLock&& other) noexcept { *this = std::move(other); }

OutputLock& OutputLock::operator=(OutputLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
    created_file_ = std::exchange(other.created_file_, {});
    created_dirs_ = std::exchange(other.created_dirs_, {});
  }
  return *this;
}

void OutputLock::release() {
  if (fd_ >= 0) {
    struct stat mine {};
    struct stat now {};
    // The file this lock created, still empty and still the one at its path: nothing was logged.
    if (!created_file_.empty() && ::fstat(fd_, &mine) == 0 && mine.st_size == 0 &&
        ::stat(created_file_.c_str(), &now) == 0 && now.st_ino == mine.st_ino &&
        now.st_dev == mine.st_dev)
      ::unlink(created_file_.c_str());
    ::close(fd_);  // drops the flock
    fd_ = -1;
  }
  created_file_.clear();
  for (auto it = created_dirs_.rbegin(); it != created_dirs_.rend(); ++it) {
    if (!is_empty_dir(*it)) break;
    std::error_code ec;
    fs::remove(*it, ec);
  }
  created_dirs_.clear();
}

}  // namespace mw::data
