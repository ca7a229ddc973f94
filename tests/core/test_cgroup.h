// A cgroup made for one test, with one limit written, and a command run inside it: for the checks
// that read the limits of the process's cgroup (Note [CPU quota], core/threads.cpp; the memory
// check's cgroup_free_bytes, train/memory_check.cpp). It needs root and a writable cgroup file
// system (v1's controller mount, as on the development machines, or v2's unified one); ok() is
// false elsewhere, and the test skips.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

namespace mw::testing {

class TestCgroup {
 public:
  // v1: `v1_file` = `value` under /sys/fs/cgroup/`controller`; else v2: `v2_file` = `v2_value`
  // under /sys/fs/cgroup.
  TestCgroup(const std::string& controller, const std::string& v1_file, const std::string& value,
             const std::string& v2_file, const std::string& v2_value) {
    const std::string name = "/memwall-test-" + std::to_string(::getpid());
    if (make("/sys/fs/cgroup/" + controller + name, v1_file, value)) return;
    make("/sys/fs/cgroup" + name, v2_file, v2_value);
  }
  ~TestCgroup() {
    if (!dir_.empty()) ::rmdir(dir_.c_str());  // empty again once the command has exited
  }
  TestCgroup(const TestCgroup&) = delete;
  TestCgroup& operator=(const TestCgroup&) = delete;

  bool ok() const { return !dir_.empty(); }
  // Runs `command` (a shell command line) inside the cgroup: its stdout and stderr, or nullopt
  // when the process could not join the cgroup (the test then skips).
  std::optional<std::string> run(const std::string& command) const {
    const std::string cmd = "sh -c 'echo $$ > " + dir_ + "/cgroup.procs || { echo " + kJoinFailed +
                            "; exit 1; }; exec " + command + "' 2>&1";
    std::string out;
    if (FILE* pipe = ::popen(cmd.c_str(), "r")) {
      char buf[4096];
      for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
      ::pclose(pipe);
    }
    if (out.find(kJoinFailed) != std::string::npos) return std::nullopt;
    return out;
  }

 private:
  bool make(const std::string& dir, const std::string& file, const std::string& value) {
    if (::mkdir(dir.c_str(), 0755) != 0) return false;
    struct stat st {};
    // A cgroup's files are the kernel's: a plain folder (a tmpfs mount point) is not one, and
    // the file must exist already (fstream in|out does not create it).
    if (::stat((dir + "/cgroup.procs").c_str(), &st) == 0 &&
        std::fstream(dir + "/" + file, std::ios::in | std::ios::out) << value << std::flush) {
      dir_ = dir;
      return true;
    }
    ::rmdir(dir.c_str());
    return false;
  }
  static constexpr const char* kJoinFailed = "memwall-test-cgroup-join-failed";
  std::string dir_;
};

}  // namespace mw::testing
