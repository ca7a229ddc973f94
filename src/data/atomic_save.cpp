// The staged folder swap and the output pre-flight checks of atomic_save.h (Note [Atomic folder
// save]).
#include "data/atomic_save.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "core/interrupt.h"
#include "data/file_io.h"

namespace mw::data {

namespace fs = std::filesystem;

namespace {

std::string base_name(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

// A folder replaced by a sibling needs a name of its own: not ".", ".." or "/".
void check_replaceable_name(const std::string& path, const std::string& what) {
  const std::string base = base_name(path);
  MW_CHECK_T(IoError, !base.empty() && base != "." && base != ".." && base != "/", what, " '", path,
             "': a folder that is replaced as a whole needs a name of its own (e.g. out/model), "
             "not '",
             base, "'");
}

// True when `name` is ".<base>.<kind>-<digits>" with <digits> the id of a process that is gone.
bool is_stale(const std::string& name, const std::string& base, const std::string& kind) {
  const std::string prefix = "." + base + "." + kind + "-";
  if (name.compare(0, prefix.size(), prefix) != 0 || name.size() == prefix.size()) return false;
  const std::string digits = name.substr(prefix.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9)
    return false;
  const pid_t pid = static_cast<pid_t>(std::stol(digits));
  return pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH;
}

std::atomic<bool> g_refuse_exchange{false};  // set_refuse_rename_exchange_for_testing

int rename_exchange(const std::string& a, const std::string& b) {
  if (g_refuse_exchange) {
    errno = EINVAL;  // what a file system without RENAME_EXCHANGE answers
    return -1;
  }
  return ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE);
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);  // best effort: cleanup must not mask the error that led here
}

}  // namespace

int remove_stale_temporaries(const std::string& path) {
  const std::string dir = parent_directory(path), base = base_name(path);
  std::vector<std::string> tmps, olds;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (is_stale(e->d_name, base, "tmp")) tmps.push_back(dir + "/" + e->d_name);
      if (is_stale(e->d_name, base, "old")) olds.push_back(dir + "/" + e->d_name);
    }
    ::closedir(d);
  }
  int removed = 0;
  std::error_code ec;
  if (!olds.empty() && !fs::exists(path, ec)) {  // killed between the fallback's two renames
    if (::rename(olds.front().c_str(), path.c_str()) == 0) olds.erase(olds.begin());
  }
  for (const auto& p : tmps) remove_tree(p), ++removed;
  for (const auto& p : olds) remove_tree(p), ++removed;
  if (removed > 0) fsync_directory(dir);
  return removed;
}

void check_only_saved_entries(const std::string& dir, const std::string& option,
                              const SavedEntries& saved) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  std::vector<std::string> foreign;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!saved(name)) foreign.push_back(name);
  }
  if (foreign.empty()) return;
  std::sort(foreign.begin(), foreign.end());
  std::string list;
  for (size_t i = 0; i < foreign.size() && i < 5; ++i)
    list += str(i ? ", " : "", "'", foreign[i], "'");
  if (foreign.size() > 5) list += str(" and ", foreign.size() - 5, " more");
  throw IoError(str(option, " '", dir, "' holds ", list,
                    ", which a save there would delete: the folder is replaced as a whole. Pass a "
                    "new folder (e.g. '",
                    (fs::path(dir) / "model").string(),
                    "'), or one that an earlier save wrote; nothing was written"),
                dir, 0, 0, EEXIST);
}

StagedDirectory::StagedDirectory(std::string final_dir, std::string hint, SavedEntries saved)
    : final_(std::move(final_dir)),
      tmp_(temporary_sibling(final_)),
      hint_(std::move(hint)),
      saved_(std::move(saved)) {
  check_replaceable_name(final_, "saving to");
  std::error_code ec;
  fs::create_directories(parent_directory(final_), ec);
  remove_stale_temporaries(final_);
  MW_CHECK_T(IoError, !fs::exists(final_, ec) || fs::is_directory(final_, ec), "'", final_,
             "' exists and is not a directory; ", hint_);
  check_only_saved_entries(final_, "saving to", saved_);
  remove_tree(tmp_);  // this process's own, from an earlier failed attempt
  if (::mkdir(tmp_.c_str(), 0755) != 0) {
    int err = errno;
    throw IoError(
        str("cannot create the temporary folder '", tmp_, "': ", errno_text(err), "; ", hint_),
        tmp_, 0, 0, err);
  }
  registered_.set(tmp_);
}

StagedDirectory::~StagedDirectory() {
  if (!committed_) remove_tree(tmp_);
}

std::string StagedDirectory::file(const std::string& name) const { return tmp_ + "/" + name; }

void StagedDirectory::commit() {
  throw_if_stop_requested(str("before moving '", tmp_, "' into place").c_str());
  check_only_saved_entries(final_, "saving to", saved_);  // again: files may have come meanwhile
  fsync_directory(tmp_);
  std::error_code ec;
  std::string old;  // where the replaced folder ends up, to be removed; empty when none
  if (!fs::exists(final_, ec)) {
    if (::rename(tmp_.c_str(), final_.c_str()) != 0) fail_move(errno);
  } else if (rename_exchange(tmp_, final_) == 0) {
    old = tmp_;  // the swap put the old folder under the temporary name
  } else {       // no RENAME_EXCHANGE here: the old folder aside first, then the new one in
    old = temporary_sibling(final_, "old");
    remove_tree(old);
    if (::rename(final_.c_str(), old.c_str()) != 0) fail_move(errno);
    if (::rename(tmp_.c_str(), final_.c_str()) != 0) {
      const int err = errno;
      ::rename(old.c_str(), final_.c_str());  // put it back
      fail_move(err);
    }
  }
  committed_ = true;
  fsync_directory(parent_directory(final_));
  if (!old.empty()) remove_tree(old);
}

void StagedDirectory::fail_move(int err) const {
  throw IoError(
      str("cannot move '", tmp_, "' into place as '", final_, "': ", errno_text(err), "; ", hint_),
      final_, 0, 0, err);
}

void set_refuse_rename_exchange_for_testing(bool refuse) { g_refuse_exchange = refuse; }

void check_output_path(const std::string& path, const std::string& option, bool as_directory,
                       const SavedEntries& saved) {
  std::error_code ec;
  const bool exists = fs::exists(path, ec);
  if (as_directory) {
    check_replaceable_name(path, option);
    MW_CHECK_T(IoError, !exists || fs::is_directory(path, ec), option, " '", path,
               "' exists and is not a directory; pass a folder path (it is created or replaced)");
    if (saved) check_only_saved_entries(path, option, saved);
  } else {
    MW_CHECK_T(IoError, !fs::is_directory(path, ec), option, " '", path,
               "' is a directory; pass a file path");
  }
  // A FIFO or device (--log /dev/stdout, a named pipe): it must accept a writer now, or the run
  // would block opening it (a FIFO without a reader answers ENXIO to a non-blocking open).
  struct stat st;
  if (!as_directory && ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      throw IoError(str(option, " '", path, "' cannot be written: ", errno_text(err),
                        err == ENXIO ? " (a FIFO with no reader)" : "",
                        "; pass a regular file path, or start the reader first"),
                    path, 0, 0, err);
    }
    ::close(fd);
    return;
  }
  // Missing directories are created by the save itself; here the nearest existing ancestor must
  // accept new entries, so nothing is created before the run starts.
  std::string dir = parent_directory(path);
  while (!fs::exists(dir, ec) && dir != parent_directory(dir)) dir = parent_directory(dir);
  MW_CHECK_T(IoError, fs::is_directory(dir, ec), option, " '", path, "': '", dir,
             "' is not a directory; pass a path in a writable directory");
  const std::string probe = str(dir, "/.memwall-probe-", ::getpid());
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    int err = errno;
    throw IoError(str(option, " '", path, "' cannot be written: creating a file in '", dir,
                      "' failed: ", errno_text(err), "; pass a path in a writable directory"),
                  probe, 0, 0, err);
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace mw::data
