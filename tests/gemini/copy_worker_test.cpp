// Note [Copy worker]: copies run in the order they were started, wait() returns only once the
// bytes are there, and the destructor finishes every copy started (none is abandoned).
#include "offload/gemini/copy_worker.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace mw::gemini {
namespace {

std::vector<char> pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<char>((i * 131 + static_cast<size_t>(seed)) & 0xff);
  return v;
}

TEST(CopyWorker, WaitSeesEveryByteAndALaterCopyOverwritesAnEarlierOne) {
  CopyWorker worker;
  const size_t n = size_t{8} << 20;
  const std::vector<char> a = pattern(n, 1), b = pattern(n, 2);
  std::vector<char> dst(n, 0);
  const CopyWorker::Handle first = worker.copy(dst.data(), a.data(), static_cast<int64_t>(n));
  const CopyWorker::Handle second = worker.copy(dst.data(), b.data(), static_cast<int64_t>(n / 2));
  second.wait();
  EXPECT_TRUE(first.done()) << "copies run in the order they were started";
  EXPECT_EQ(std::memcmp(dst.data(), b.data(), n / 2), 0);
  EXPECT_EQ(std::memcmp(dst.data() + n / 2, a.data() + n / 2, n / 2), 0);
  EXPECT_EQ(worker.bytes_copied(), static_cast<int64_t>(n + n / 2));
  EXPECT_TRUE(CopyWorker::Handle().done());
  CopyWorker::Handle().wait();  // a default handle is a finished copy of nothing
}

TEST(CopyWorker, DestructionFinishesEveryCopyStarted) {
  const size_t n = size_t{1} << 20;
  const std::vector<char> src = pattern(n, 3);
  std::vector<std::vector<char>> dst(16, std::vector<char>(n, 0));
  {
    CopyWorker worker;
    for (auto& d : dst) worker.copy(d.data(), src.data(), static_cast<int64_t>(n));
  }
  for (auto& d : dst) EXPECT_EQ(std::memcmp(d.data(), src.data(), n), 0);
}

}  // namespace
}  // namespace mw::gemini
