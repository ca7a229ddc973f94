// Note [Copy worker]: copies run in the order they were started, wait() returns only once the
// bytes are there, and the destructor finishes every copy started (none is abandoned); on CUDA
// the copy stream's bytes are what the compute stream reads after wait().
#include "offload/gemini/copy_worker.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/allocator.h"
#include "core/cuda_stream.h"
#include "core/storage.h"

namespace mw::gemini {
namespace {

std::vector<char> pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<char>((i * 131 + static_cast<size_t>(seed)) & 0xff);
  return v;
}

TEST(CopyWorker, WaitSeesEveryByteAndALaterCopyOverwritesAnEarlierOne) {
  CopyWorker worker(Device::sim(0));
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
    CopyWorker worker(Device::sim(0));
    for (auto& d : dst) worker.copy(d.data(), src.data(), static_cast<int64_t>(n));
  }
  for (auto& d : dst) EXPECT_EQ(std::memcmp(d.data(), src.data(), n), 0);
}

// Into a device block the compute stream just used (a recycled block, as Gemini's chunk copies
// get): the copy waits for that work, and after wait() the compute stream reads the new bytes.
TEST(CopyWorker, OnCudaTheComputeStreamSeesTheCopiedBytes) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible (or a build without CUDA)";
  const Device cuda = Device::cuda(0);
  const size_t n = size_t{32} << 20;
  const std::vector<char> old_bytes = pattern(n, 4), new_bytes = pattern(n, 5);
  void* block = allocator_for(cuda).allocate(static_cast<int64_t>(n));
  copy_bytes(block, cuda, old_bytes.data(), Device::cpu(), static_cast<int64_t>(n));
  CopyWorker worker(cuda);
  std::vector<char> source = new_bytes;
  const CopyWorker::Handle h = worker.copy(block, source.data(), static_cast<int64_t>(n));
  std::fill(source.begin(), source.end(), 0);  // staged: the source may change at once
  h.wait();
  std::vector<char> back(n);
  copy_bytes(back.data(), Device::cpu(), block, cuda, static_cast<int64_t>(n));
  EXPECT_EQ(std::memcmp(back.data(), new_bytes.data(), n), 0);
  h.join();
  EXPECT_TRUE(h.done());
  allocator_for(cuda).deallocate(block, static_cast<int64_t>(n));
}

}  // namespace
}  // namespace mw::gemini
