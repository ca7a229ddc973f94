// The names in a directory, for tests that check a run left no file behind.
#pragma once

#include <dirent.h>

#include <string>
#include <vector>

namespace mw::testing {

// The names in `dir` (without . and ..); empty when it cannot be opened.
inline std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") out.push_back(e->d_name);
    ::closedir(d);
  }
  return out;
}

}  // namespace mw::testing
