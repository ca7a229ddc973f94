// Activation offload on a CUDA device (Note [CUDA activation offload]). Every test here needs a
// GPU and is skipped without one (GTEST_SKIP), and in a build without CUDA only the skip is
// compiled.
//
// These tests check the offloader on raw device tensors (the GPT-2 steps with offload on CUDA are
// the trainer's; tests/gpt2):
//  - round trips through pack/unpack are bitwise, for views and shared storages, in background and
//    synchronous modes, with prefetch cycling;
//  - the device bytes are held until the device->host copy has finished, then freed;
//  - ordering: the copy sees compute-stream work enqueued before pack, and compute-stream work
//    enqueued after unpack sees the host->device copy (a fetch and a prefetch);
//  - an unpack while the copy is in flight serves the device bytes;
//  - the pinned allocator's statistics show exactly the offloaded bytes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "core/cuda_stream.h"
#include "offload/activation/activation_offload.h"
#include "recompute_test_util.h"

#ifdef MW_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace mw {
namespace {

#ifdef MW_HAVE_CUDA

using offload::ActivationOffloader;
using offload::ActivationOffloadOptions;

const Device kCuda = Device::cuda(0);

int64_t cuda_current() { return allocator_for(kCuda).stats().current_bytes; }

// The whole storage of t, copied to the host (cudaMemcpy: waits for the compute stream).
std::vector<unsigned char> storage_bytes(const Tensor& t) {
  std::vector<unsigned char> out(static_cast<size_t>(t.storage()->nbytes()));
  copy_bytes(out.data(), Device::cpu(), t.storage()->data(), t.device(), t.storage()->nbytes());
  return out;
}

// Reports the first mismatching bytes and how many differ.
void expect_same_bytes(const std::string& what, const std::vector<unsigned char>& got,
                       const std::vector<unsigned char>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && bad++ < 3)
      ADD_FAILURE() << what << " byte " << i << ": " << int(got[i]) << " vs " << int(want[i]);
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " bytes differ";
}

Tensor cuda_random(int64_t numel, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(numel));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& x : v) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    x = static_cast<float>(static_cast<int64_t>(s >> 40) - (int64_t{1} << 23)) / 4096.f;
  }
  return Tensor::from_vector(v, {numel}, kCuda);
}

// A cuda tensor of n bytes (as f32), zeroed, then every byte set to `value` by a memset enqueued
// on the compute stream after ~8 ms of other compute work (24 x 1 GiB memsets at ~3 TB/s): a copy
// that does not wait for the compute stream reads the zeros.
// Holds the compute stream (the legacy default stream) at a host function from close() until
// open(): work enqueued after close() cannot start, so "the copy is still in flight" is a fact
// rather than a race between the GPU and this thread (a busy GPU alone was not enough: on an idle
// H100 under a parallel ctest, the 8 ms of memsets below finished before the test's next line).
// The host function gives up after 5 s and says so, so an implementation that waits for the copy
// fails the test instead of hanging it.
class StreamGate {
 public:
  void close() { EXPECT_EQ(cudaLaunchHostFunc(nullptr, &StreamGate::hold, this), cudaSuccess); }
  void open() { open_ = true; }
  bool gave_up() const { return gave_up_; }
  ~StreamGate() {
    open();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }

 private:
  static void hold(void* self) {  // runs on CUDA's callback thread; calls no CUDA function
    auto* gate = static_cast<StreamGate*>(self);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!gate->open_) {
      if (std::chrono::steady_clock::now() > deadline) {
        gate->gave_up_ = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  std::atomic<bool> open_{false}, gave_up_{false};
};

Tensor filled_late(int64_t nbytes, unsigned char value, const std::shared_ptr<Storage>& scratch,
                   StreamGate* gate = nullptr) {
  Tensor t = Tensor::empty({nbytes / 4}, DType::F32, kCuda);
  EXPECT_EQ(cudaMemset(t.storage()->data(), 0, static_cast<size_t>(nbytes)), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (gate) gate->close();
  for (int i = 0; i < 24; ++i)
    EXPECT_EQ(cudaMemsetAsync(scratch->data(), i, static_cast<size_t>(scratch->nbytes()), nullptr),
              cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(t.storage()->data(), value, static_cast<size_t>(nbytes), nullptr),
            cudaSuccess);
  return t;
}

std::shared_ptr<Storage> busy_scratch() { return Storage::create(int64_t{1} << 30, kCuda); }

TEST(ActivationOffloadCuda, RoundTripsAreBitwiseInBackgroundAndSynchronousModes) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  for (bool background : {true, false}) {
    SCOPED_TRACE(background ? "background" : "synchronous");
    const int64_t device_before = cuda_current();
    ActivationOffloadOptions opts;
    opts.background = background;
    opts.prefetch_bytes = 3 << 20;     // a few tensors ahead: prefetch cycles many times
    opts.max_pending_bytes = 4 << 20;  // pack waits for the copies now and then
    ActivationOffloader off(opts);
    // Forward order: a [64, 1024] tensor, a transposed and a narrowed view of it (one host copy
    // for the three), then tensors of 1 KiB .. 2 MiB.
    std::vector<Tensor> saved;
    Tensor base = cuda_random(64 * 1024, 99).reshape({64, 1024});
    saved.push_back(base);
    saved.push_back(base.transpose(0, 1));
    saved.push_back(base.narrow(0, 5, 7));
    for (int i = 0; i < 12; ++i) saved.push_back(cuda_random(int64_t{256} << (i % 12), i));
    struct View {
      Shape shape, strides;
      int64_t offset;
    };
    std::vector<View> views;
    std::vector<std::vector<unsigned char>> want;
    std::vector<std::shared_ptr<void>> handles;
    int64_t distinct_bytes = 0;
    for (size_t i = 0; i < saved.size(); ++i) {
      views.push_back({saved[i].shape(), saved[i].strides(), saved[i].offset()});
      want.push_back(storage_bytes(saved[i]));
      if (i == 0 || i >= 3) distinct_bytes += saved[i].storage()->nbytes();
      handles.push_back(off.pack(saved[i]));
    }
    saved.clear();  // forward's references go: only the offloader holds device bytes now
    base = Tensor();
    off.wait_idle();
    EXPECT_EQ(cuda_current(), device_before) << "copied tensors must leave the device";
    EXPECT_EQ(off.stats().offloaded, 13);
    EXPECT_EQ(off.stats().shared, 2);
    EXPECT_EQ(off.stats().to_host_bytes, distinct_bytes);
    // Backward order. Each unpack returns the same view onto a fresh storage with the same bytes.
    for (size_t k = handles.size(); k-- > 0;) {
      Tensor back = off.unpack(handles[k]);
      EXPECT_TRUE(back.device() == kCuda);
      EXPECT_EQ(back.shape(), views[k].shape);
      EXPECT_EQ(back.strides(), views[k].strides);
      EXPECT_EQ(back.offset(), views[k].offset);
      expect_same_bytes("tensor " + std::to_string(k), storage_bytes(back), want[k]);
    }
    const auto st = off.stats();
    EXPECT_EQ(st.prefetch_hits + st.prefetch_waits + st.sync_fetches + st.cancelled,
              static_cast<int64_t>(handles.size()));
    EXPECT_GT(st.to_device_bytes, 0);
    if (background) {
      EXPECT_GT(st.prefetch_hits + st.prefetch_waits, 0) << "no prefetch was used";
    }
    std::printf("cuda %s: hits %lld waits %lld sync %lld cancelled %lld, unpack wait %.3f ms\n",
                background ? "background" : "synchronous", (long long)st.prefetch_hits,
                (long long)st.prefetch_waits, (long long)st.sync_fetches, (long long)st.cancelled,
                st.unpack_wait_ms);
    handles.clear();
    off.wait_idle();
    EXPECT_EQ(cuda_current(), device_before) << "the offloader must hold no device bytes now";
  }
}

TEST(ActivationOffloadCuda, DeviceBytesAreHeldUntilTheCopyHasReadThem) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  auto scratch = busy_scratch();
  const int64_t n = int64_t{64} << 20;
  ActivationOffloader off;  // background
  const int64_t before = cuda_current();
  StreamGate gate;
  Tensor x = filled_late(n, 0x5A, scratch, &gate);
  auto handle = off.pack(x);
  x = Tensor();
  // The copy waits behind the held compute stream, so the worker cannot have dropped the device
  // storage yet: its bytes are still allocated although forward's reference is gone.
  EXPECT_GE(cuda_current() - before, n) << "device bytes freed while the copy may still read them";
  gate.open();
  off.wait_idle();
  EXPECT_EQ(cuda_current(), before) << "after the copy the device bytes must be freed";
  EXPECT_EQ(off.stats().to_host_bytes, n);
  Tensor back = off.unpack(handle);
  expect_same_bytes("x", storage_bytes(back), std::vector<unsigned char>(n, 0x5A));
}

TEST(ActivationOffloadCuda, AnUnpackWhileTheCopyIsInFlightServesTheDeviceBytes) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  auto scratch = busy_scratch();
  const int64_t n = int64_t{16} << 20;
  ActivationOffloader off;
  StreamGate gate;
  Tensor x = filled_late(n, 0x77, scratch, &gate);
  auto handle = off.pack(x);
  Tensor back = off.unpack(handle);  // the copy cannot be done: the compute stream is held
  EXPECT_FALSE(gate.gave_up()) << "unpack waited for the device->host copy";
  gate.open();
  EXPECT_EQ(back.storage().get(), x.storage().get());
  EXPECT_EQ(off.stats().cancelled, 1);
  EXPECT_EQ(off.stats().to_device_bytes, 0);
  expect_same_bytes("x", storage_bytes(back), std::vector<unsigned char>(n, 0x77));
  off.wait_idle();
}

// A compute-stream read enqueued right after unpack must see the host->device copy, both when
// unpack fetches (synchronous mode) and when it takes a prefetch that may still be in flight. The
// tensor is 512 MiB, so its host->device copy takes milliseconds: a read that did not wait would
// see the block's previous contents. Each run writes a byte value used nowhere else in this
// process, so no earlier contents of a recycled block can pass for the copied bytes.
TEST(ActivationOffloadCuda, ComputeStreamWorkAfterUnpackSeesTheCopiedBytes) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  auto scratch = busy_scratch();
  const int64_t n = int64_t{512} << 20;
  for (bool background : {false, true}) {
    SCOPED_TRACE(background ? "prefetch" : "fetch in unpack");
    const unsigned char value = background ? 0xE2 : 0xD1;
    ActivationOffloadOptions opts;
    opts.background = background;
    opts.prefetch_bytes = 2 * n;
    ActivationOffloader off(opts);
    Tensor x = filled_late(n, value, scratch);
    auto hx = off.pack(x);
    Tensor later = cuda_random(1024, 5);  // packed after x: its unpack prefetches x
    auto hl = off.pack(later);
    x = Tensor();
    later = Tensor();
    off.wait_idle();
    // Hold a block of x's size with other contents, so x's fetch gets another block.
    Tensor spoiler = Tensor::empty({n / 4}, DType::F32, kCuda);
    ASSERT_EQ(cudaMemset(spoiler.storage()->data(), 0x11, static_cast<size_t>(n)), cudaSuccess);
    off.unpack(hl);  // background: queues the prefetch of x
    // The worker enqueues x's copy within microseconds and the copy itself takes milliseconds, so
    // after 2 ms x is normally prefetched with its copy still running.
    if (background) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    Tensor back = off.unpack(hx);
    PinnedHostBuffer seen(n);
    ASSERT_EQ(cudaMemcpyAsync(seen.data(), back.storage()->data(), static_cast<size_t>(n),
                              cudaMemcpyDefault, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
    const auto* p = static_cast<const unsigned char*>(seen.data());
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += p[i] != value;
    EXPECT_EQ(bad, 0) << "the compute stream read the tensor before its copy finished";
    if (background) {
      const auto st = off.stats();
      EXPECT_EQ(st.prefetch_hits + st.prefetch_waits, 1) << "x should come from the prefetch";
    }
  }
}

TEST(ActivationOffloadCuda, PinnedAllocatorStatisticsShowTheOffloadedBytes) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  Allocator& pinned = pinned_host_allocator();
  pinned.empty_cache();  // so every block below is fresh and exactly its rounded size
  pinned.reset_peak();
  const int64_t before = pinned.stats().current_bytes;
  const int64_t cpu_before = allocator_for(Device::cpu()).stats().current_bytes;
  ActivationOffloadOptions opts;
  opts.background = false;
  ActivationOffloader off(opts);
  std::vector<std::shared_ptr<void>> handles;
  int64_t expected = 0;
  for (int64_t numel : {1000, 4096, 250000, 1 << 20}) {
    Tensor t = cuda_random(numel, numel);
    expected += round_up(numel * 4, 4096);
    handles.push_back(off.pack(t));
  }
  EXPECT_EQ(pinned.stats().current_bytes - before, expected);
  EXPECT_GE(pinned.stats().peak_bytes, before + expected);
  EXPECT_EQ(allocator_for(Device::cpu()).stats().current_bytes, cpu_before)
      << "the host copies of cuda tensors are pinned, not cpu-allocator bytes";
  handles.clear();
  EXPECT_EQ(pinned.stats().current_bytes, before);
  EXPECT_GE(pinned.stats().cached_bytes, expected) << "freed pinned blocks are kept for reuse";
}

#else

TEST(ActivationOffloadCuda, RoundTripsAreBitwiseInBackgroundAndSynchronousModes) {
  GTEST_SKIP() << "built without CUDA (-DMW_CUDA=ON with nvcc present builds it)";
}

#endif  // MW_HAVE_CUDA

}  // namespace
}  // namespace mw
