// Helpers shared by the I/O tests: a private temporary directory, open-descriptor counting, and a
// deterministic byte pattern whose first mismatch is reported.
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "offload/io/io_engine.h"

namespace mw::io::testing {

// Number of entries in /proc/self/fd (the opendir's own descriptor counted consistently).
inline int count_open_fds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (readdir(d)) ++n;
  closedir(d);
  return n;
}

// A fresh directory under `root` (default /tmp: ext4 here, so O_DIRECT works), removed with its
// content when the test ends.
class TempDir {
 public:
  explicit TempDir(const std::string& root = "/tmp") {
    static std::atomic<int> counter{0};
    path_ = root + "/mw-io-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  // Regular files directly inside the directory.
  int file_count() const {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(path_))
      if (e.is_regular_file()) ++n;
    return n;
  }

 private:
  std::string path_;
};

// Byte i of pattern `seed`: varies with both, so a chunk written to the wrong place is caught.
inline uint8_t pattern_byte(uint64_t seed, int64_t i) {
  uint64_t x =
      (seed + 1) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(i) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  return static_cast<uint8_t>(x);
}
inline void fill_pattern(void* buf, int64_t nbytes, uint64_t seed) {
  auto* p = static_cast<uint8_t*>(buf);
  for (int64_t i = 0; i < nbytes; ++i) p[i] = pattern_byte(seed, i);
}
// Compares the first nbytes of buf with pattern `seed`; reports the first mismatches.
inline ::testing::AssertionResult matches_pattern(const void* buf, int64_t nbytes, uint64_t seed) {
  const auto* p = static_cast<const uint8_t*>(buf);
  int64_t bad = 0, first = -1;
  std::string detail;
  for (int64_t i = 0; i < nbytes; ++i) {
    uint8_t want = pattern_byte(seed, i);
    if (p[i] != want) {
      if (first < 0) first = i;
      if (++bad <= 5)
        detail += " [" + std::to_string(i) + "]=" + std::to_string(p[i]) + " want " +
                  std::to_string(want);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << nbytes << " bytes differ (seed " << seed
                                       << "), first at " << first << ":" << detail;
}

// Fixture for tests run on both backends (the parameter): make() starts an engine of that backend.
class BackendTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  std::unique_ptr<IoEngine> make(int depth) {
    IoOptions o;
    o.backend = GetParam();
    o.queue_depth = depth;
    return IoEngine::create(o);
  }
};

}  // namespace mw::io::testing
