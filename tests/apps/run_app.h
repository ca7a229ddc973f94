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

inline AppResult run_built_app(const std::string& app, const std::string& args) {
  const std::string cmd = std::string(MW_BINARY_DIR) + "/apps/" + app + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace mw::testing
