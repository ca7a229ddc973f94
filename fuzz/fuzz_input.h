// Shared by the libFuzzer targets of fuzz/: the readers under test take a path, so each input is
// written to one file in a private temporary directory (made once per process, removed at exit).
// A target catches mw::Error (every typed error is a correct answer to bad input); anything else,
// a crash, a sanitizer report or another exception type, is a finding.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace mw::fuzz {

class InputFile {
 public:
  InputFile() {
    char pattern[] = "/tmp/mw_fuzz_XXXXXX";
    const char* dir = ::mkdtemp(pattern);
    if (!dir) throw std::runtime_error("mkdtemp failed for the fuzz input directory");
    dir_ = dir;
    path_ = dir_ + "/input";
  }
  ~InputFile() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const std::string& dir() const { return dir_; }
  // Replaces the file's content with the input bytes and returns its path.
  const std::string& write(const uint8_t* data, size_t size) {
    FILE* f = std::fopen(path_.c_str(), "wb");
    if (!f) throw std::runtime_error("cannot write the fuzz input " + path_);
    if (size > 0 && std::fwrite(data, 1, size, f) != size) throw std::runtime_error("short write");
    std::fclose(f);
    return path_;
  }

 private:
  std::string dir_, path_;
};

// One per process: a function-local static is destroyed at exit, so the directory goes with it.
inline InputFile& input_file() {
  static InputFile file;
  return file;
}

}  // namespace mw::fuzz
