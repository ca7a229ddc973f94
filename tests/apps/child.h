// Apps run as child processes for the tests of tests/apps: a Child writes stdout+stderr to a log
// file, can be signalled and waited for with a timeout (a hang fails the test instead of blocking
// it), and reports the exit code or the killing signal.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "../data/temp_dir.h"

namespace mw::testing {

struct Outcome {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string output;
};

// A child app writing stdout+stderr to `log_path`, with `env` ("NAME=value") added.
class Child {
 public:
  // `cwd`: the child's working directory (default: the test's).
  // The stop signals start at their default action (this test binary may have been started with
  // them ignored, as a script's background job is), but those in `ignored` start ignored (nohup).
  Child(const std::string& app, const std::vector<std::string>& args, const std::string& log_path,
        const std::vector<std::string>& env = {}, const std::string& cwd = "",
        const std::vector<int>& ignored = {})
      : log_path_(log_path) {
    pid_ = ::fork();
    if (pid_ == 0) {
      for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
      for (int sig : ignored) ::signal(sig, SIG_IGN);
      if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(126);
      int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
      std::string path = std::string(MW_BINARY_DIR) + "/apps/" + app;
      std::vector<char*> argv{const_cast<char*>(path.c_str())};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(path.c_str(), argv.data());
      ::_exit(127);
    }
  }
  ~Child() {  // a failed assertion must not leave a stalled child behind
    if (!reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  std::string output() const { return data::testing::read_bytes(log_path_); }
  // Polls until `ready` holds (true) or `timeout_s` passes (false).
  template <typename F>
  bool wait_for(F ready, double timeout_s = 60) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < end) {
      if (ready()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  void signal(int sig) { ::kill(pid_, sig); }
  pid_t pid() const { return pid_; }
  // Waits for exit (SIGKILL after timeout_s: a hang fails the test instead of blocking it).
  Outcome finish(double timeout_s = 120) {
    int status = 0;
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > end) {
        ADD_FAILURE() << "the child hung; killed";
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    reaped_ = true;
    Outcome o;
    o.output = output();
    if (WIFEXITED(status)) o.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) o.signal = WTERMSIG(status);
    return o;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::string log_path_;
};

inline Outcome run_app(const data::testing::TempDir& tmp, const std::string& app,
                       const std::vector<std::string>& args,
                       const std::vector<std::string>& env = {}, double timeout_s = 120) {
  return Child(app, args, tmp.file("child.log"), env).finish(timeout_s);
}

inline std::vector<std::string> tiny(std::vector<std::string> more) {
  std::vector<std::string> a = {"--model", "tiny", "--seq", "16", "--batch", "2", "--threads", "2"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

inline bool has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// Names in `dir` starting with '.' (temporary or probe files of memwall).
inline std::vector<std::string> hidden_entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string()[0] == '.') out.push_back(e.path().filename().string());
  return out;
}

}  // namespace mw::testing
