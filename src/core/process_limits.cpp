// Note [Open files] (process_limits.h).
#include "core/process_limits.h"

#include <sys/resource.h>

#include <fstream>
#include <sstream>

namespace mw {

int64_t raise_open_file_limit() {
  struct rlimit r {};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return -1;
  if (r.rlim_cur < r.rlim_max) {
    struct rlimit raised = r;
    raised.rlim_cur = r.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) r = raised;
  }
  return r.rlim_cur == RLIM_INFINITY ? INT64_MAX : static_cast<int64_t>(r.rlim_cur);
}

int64_t open_file_limit() {
  struct rlimit r {};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return -1;
  return r.rlim_cur == RLIM_INFINITY ? INT64_MAX : static_cast<int64_t>(r.rlim_cur);
}

void for_each_cgroup_level(const std::string& v1_controller,
                           const std::function<void(const std::string& dir, bool v2)>& f) {
  std::ifstream self("/proc/self/cgroup");
  for (std::string line; std::getline(self, line);) {  // "4:memory:/docker/ab12", "0::/"
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const bool v2 = line.rfind("0::", 0) == 0;
    bool listed = false;
    std::istringstream names(controllers);
    for (std::string name; std::getline(names, name, ',');) listed |= name == v1_controller;
    if (!v2 && !listed) continue;
    const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/" + controllers;
    for (std::string path = line.substr(b + 1);;) {
      f(root + (path == "/" ? "" : path), v2);
      if (path.empty() || path == "/") break;
      const size_t slash = path.rfind('/');
      path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
    }
  }
}

}  // namespace mw
