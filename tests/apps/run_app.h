// Runs a built app (build/apps/NAME) as a user would, capturing its exit code and its output.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace mw::testing {

struct AppResult {
  int exit_code;
  std::string output;  // stdout and stderr
};

// Runs `cmd` through the shell with stderr joined to stdout.
inline AppResult run_command(const std::string& cmd) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

inline AppResult run_built_app(const std::string& app, const std::string& args) {
  return run_command(std::string(MW_BINARY_DIR) + "/apps/" + app + " " + args);
}

}  // namespace mw::testing
