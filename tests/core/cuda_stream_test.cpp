// Tests of core/cuda_stream.h.
//  - Everywhere: the errors a build without CUDA, or a machine without a GPU, gives (typed, saying
//    what to do).
//  - With a GPU (skipped otherwise): events order a copy stream after the compute stream and the
//    compute stream after a copy, and the pinned allocator counts and reuses its bytes.
#include "core/cuda_stream.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../data/temp_dir.h"
#include "core/error.h"
#include "core/storage.h"

#ifdef MW_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace mw {
namespace {

using data::testing::expect_throw_with;

// Without a GPU every entry point throws DeviceError whose message says what to do instead. In a
// build without CUDA the message says so; in a CUDA build on a machine without a GPU (or driver)
// it names the call and the device.
TEST(CudaAvailability, WithoutAGpuEveryEntryPointThrowsDeviceErrorSayingWhatToDo) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible; the GPU tests below run instead";
#ifdef MW_HAVE_CUDA
  const std::vector<std::string> stream_needles = {
      "creating a copy stream on cuda:0", "expected a visible CUDA device", "--device cpu or sim"};
  const std::vector<std::string> event_needles = {"creating an event on cuda:0",
                                                  "--device cpu or sim"};
  const std::vector<std::string> pinned_needles = {"cudaHostAlloc", "--device cpu or sim"};
#else
  const std::vector<std::string> stream_needles = {"built without CUDA", "--device cpu or sim"};
  const std::vector<std::string> event_needles = stream_needles;
  const std::vector<std::string> pinned_needles = stream_needles;
#endif
  expect_throw_with<DeviceError>([] { CudaStream::create(0); }, stream_needles);
  expect_throw_with<DeviceError>([] { CudaEvent event(0); }, event_needles);
  expect_throw_with<DeviceError>([] { PinnedHostBuffer buffer(4096); }, pinned_needles);
}

TEST(CudaAvailability, ADeviceIndexPastTheVisibleOnesIsNamed) {
  const int index = cuda_device_count() + 3;
#ifdef MW_HAVE_CUDA
  const std::vector<std::string> needles = {"on cuda:" + std::to_string(index),
                                            "expected a visible CUDA device"};
#else
  const std::vector<std::string> needles = {"built without CUDA"};
#endif
  expect_throw_with<DeviceError>([&] { CudaStream::create(index); }, needles);
  expect_throw_with<DeviceError>([&] { CudaEvent event(index); }, needles);
}

#ifdef MW_HAVE_CUDA

// Enqueues about `bytes` x `times` of memset work on the legacy default stream (the compute
// stream), so that whatever is enqueued after it can only run milliseconds later: at ~3 TB/s, 24 x
// 1 GiB is about 8 ms, while the host reaches its next call within microseconds.
void keep_compute_stream_busy(void* scratch, int64_t bytes, int times) {
  for (int i = 0; i < times; ++i)
    ASSERT_EQ(cudaMemsetAsync(scratch, i, static_cast<size_t>(bytes), nullptr), cudaSuccess);
}

int64_t count_bytes_not(const void* data, int64_t n, unsigned char value) {
  const auto* p = static_cast<const unsigned char*>(data);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += p[i] != value;
  return bad;
}

TEST(CudaEvent, TheCopyStreamWaitsForTheComputeStreamAndTheComputeStreamForTheCopy) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  const int64_t n = int64_t{64} << 20, scratch_bytes = int64_t{1} << 30;
  auto x = Storage::create(n, Device::cuda(0));
  auto scratch = Storage::create(scratch_bytes, Device::cuda(0));
  ASSERT_EQ(cudaMemset(x->data(), 0, static_cast<size_t>(n)), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  CudaStream compute = CudaStream::borrow(0, nullptr);
  CudaStream copy = CudaStream::create(0);
  PinnedHostBuffer host(n);
  std::memset(host.data(), 0xEE, static_cast<size_t>(n));

  // Device -> host: x becomes 0x5A only after ~8 ms of compute work. Without the wait the copy
  // stream (non-blocking) would copy the zeros at once.
  keep_compute_stream_busy(scratch->data(), scratch_bytes, 24);
  ASSERT_EQ(cudaMemsetAsync(x->data(), 0x5A, static_cast<size_t>(n), nullptr), cudaSuccess);
  CudaEvent produced(0), to_host_done(0);
  produced.record(compute);
  copy.wait(produced);
  copy.copy_async(host.data(), x->data(), n);
  to_host_done.record(copy);
  EXPECT_FALSE(to_host_done.query()) << "query must not block, and the copy cannot be done yet: "
                                        "it waits behind ~8 ms of compute work";
  to_host_done.synchronize();
  EXPECT_TRUE(to_host_done.query());
  EXPECT_EQ(count_bytes_not(host.data(), n, 0x5A), 0) << "the copy ran before the memset";

  // Host -> device: the copy stream is kept busy with 1 GiB of host->device copies (tens of ms)
  // before it writes 0xC3 into x; a compute-stream read of x that waits on the copy's event sees
  // 0xC3, one that did not wait would see 0x5A.
  PinnedHostBuffer big(scratch_bytes);
  copy.copy_async(scratch->data(), big.data(), scratch_bytes);
  std::memset(host.data(), 0xC3, static_cast<size_t>(n));
  copy.copy_async(x->data(), host.data(), n);
  CudaEvent to_device_done(0);
  to_device_done.record(copy);
  compute.wait(to_device_done);
  PinnedHostBuffer back(n);
  ASSERT_EQ(
      cudaMemcpyAsync(back.data(), x->data(), static_cast<size_t>(n), cudaMemcpyDefault, nullptr),
      cudaSuccess);
  compute.synchronize();
  EXPECT_EQ(count_bytes_not(back.data(), n, 0xC3), 0) << "the compute stream did not wait";
  copy.synchronize();
}

TEST(PinnedHostAllocator, CountsItsBytesApartAndReusesFreedBlocks) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  Allocator& pinned = pinned_host_allocator();
  EXPECT_TRUE(pinned.device().is_cpu());
  pinned.empty_cache();
  const AllocatorStats s0 = pinned.stats();
  const int64_t cpu_before = allocator_for(Device::cpu()).stats().current_bytes;
  void* first = nullptr;
  AllocatorStats s1;
  {
    PinnedHostBuffer a(10000);  // rounded to 12288 (4096-byte granules)
    first = a.data();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 4096, 0u);
    s1 = pinned.stats();
    EXPECT_EQ(s1.current_bytes - s0.current_bytes, 12288);
    EXPECT_GE(s1.peak_bytes, s0.current_bytes + 12288);
    EXPECT_EQ(allocator_for(Device::cpu()).stats().current_bytes, cpu_before)
        << "pinned bytes are counted by the pinned allocator, not the cpu one";
  }
  const AllocatorStats s2 = pinned.stats();
  EXPECT_EQ(s2.current_bytes, s0.current_bytes);
  EXPECT_EQ(s2.cached_bytes, s1.cached_bytes + 12288) << "a freed block is kept for reuse";
  {
    PinnedHostBuffer b(9000);  // 12288 again: served from the cache
    EXPECT_EQ(b.data(), first);
    EXPECT_EQ(pinned.stats().cache_hits, s2.cache_hits + 1);
  }
  pinned.empty_cache();
  EXPECT_EQ(pinned.stats().cached_bytes, 0);
}

#endif  // MW_HAVE_CUDA

}  // namespace
}  // namespace mw
