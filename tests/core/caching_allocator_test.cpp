// The caching-allocator core (core/caching_allocator.h) once, over a fake source that hands out
// addresses it never backs: rounding, best-fit reuse, the cache bound, the capacity (and the cache
// inside it, Note [Freeing just enough]), empty-the-cache-and-retry, statistics. Then each host
// backend's hook (core/host_memory.h) and AlignedBuffer. The CUDA and pinned sources are tested in
// tests/core/cuda_stream_test.cpp and tests/cuda, which skip without a GPU.
#include "core/caching_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/host_memory.h"

namespace mw {
namespace {

constexpr int64_t kG = 4096;

// Addresses from a counter (never dereferenced). Refuses a block when the bytes it has out would
// pass limit_bytes (0: never), as a system out of memory does.
class FakeSource final : public MemorySource {
 public:
  explicit FakeSource(int64_t limit_bytes = 0) : limit_bytes_(limit_bytes) {}
  void* acquire(int64_t bytes) override {
    ++acquires;
    if (limit_bytes_ > 0 && out_bytes + bytes > limit_bytes_) return nullptr;
    out_bytes += bytes;
    void* p = reinterpret_cast<void*>(next_);
    next_ += static_cast<uintptr_t>(bytes);
    return p;
  }
  void release(void* ptr, int64_t bytes) override {
    released.push_back(ptr);
    out_bytes -= bytes;
  }
  OutOfMemory refused(int64_t bytes, const AllocatorStats& s) const override {
    return OutOfMemory(str("fake source refused ", bytes, " bytes"), bytes, 0, s.capacity_bytes);
  }
  int64_t acquires = 0, out_bytes = 0;
  std::vector<void*> released;

 private:
  int64_t limit_bytes_;
  uintptr_t next_ = uintptr_t{1} << 32;
};

struct Fixture {
  FakeSource* source;
  std::unique_ptr<CachingAllocator> allocator;
};

Fixture make(CachePolicy policy, int64_t capacity = 0, bool hard = false, int64_t limit = 0) {
  auto source = std::make_unique<FakeSource>(limit);
  FakeSource* raw = source.get();
  return {raw, std::make_unique<CachingAllocator>(Device::sim(7), std::move(source), policy,
                                                  capacity, hard)};
}

TEST(CachingAllocator, RoundsToTheGranuleAndServesTheSmallestCachedBlockThatFits) {
  auto [src, a] = make({kG, int64_t{1} << 30, reuse_up_to_twice});
  void* small = a->allocate(5000);  // rounds to 2 granules
  void* mid = a->allocate(3 * kG);
  void* big = a->allocate(8 * kG);
  EXPECT_EQ(a->stats().current_bytes, 13 * kG);
  a->deallocate(big, 8 * kG);
  a->deallocate(mid, 3 * kG);
  a->deallocate(small, 5000);
  EXPECT_EQ(a->stats().cached_bytes, 13 * kG);
  // 3 granules fit in 3 (best fit), not 8; 1 granule takes the 2-granule block (at most twice).
  EXPECT_EQ(a->allocate(3 * kG), mid);
  EXPECT_EQ(a->allocate(kG), small);
  EXPECT_EQ(a->stats().current_bytes, 5 * kG) << "a reused block counts its full size";
  // 3 granules again: only the 8-granule block is cached, more than twice: a fresh block.
  const int64_t acquires = src->acquires;
  void* fresh = a->allocate(3 * kG);
  EXPECT_NE(fresh, big);
  EXPECT_EQ(src->acquires, acquires + 1);
  const AllocatorStats s = a->stats();
  EXPECT_EQ(s.alloc_count, 6);
  EXPECT_EQ(s.cache_hits, 2);
  EXPECT_EQ(s.miss_bytes, 16 * kG);
  EXPECT_EQ(s.peak_bytes, 13 * kG);
  a->reset_peak();
  EXPECT_EQ(a->stats().peak_bytes, 8 * kG);
}

TEST(CachingAllocator, ExactSizeReuseNeverHandsOutALargerBlock) {
  auto [src, a] = make({kG, int64_t{1} << 30, reuse_exact_size});
  void* p = a->allocate(2 * kG);
  a->deallocate(p, 2 * kG);
  void* q = a->allocate(kG);
  EXPECT_NE(q, p);
  EXPECT_EQ(a->stats().current_bytes, kG) << "the accounting is exactly what was asked for";
  EXPECT_EQ(a->allocate(2 * kG), p);
}

TEST(CachingAllocator, TheCacheBoundReleasesWhatWouldPassIt) {
  auto [src, a] = make({kG, 3 * kG, reuse_up_to_twice});
  void* p = a->allocate(2 * kG);
  void* q = a->allocate(2 * kG);
  a->deallocate(p, 2 * kG);
  a->deallocate(q, 2 * kG);  // 4 granules would pass the 3-granule bound
  EXPECT_EQ(a->stats().cached_bytes, 2 * kG);
  ASSERT_EQ(src->released.size(), 1u);
  EXPECT_EQ(src->released[0], q);
  a->set_max_cached_bytes(kG);
  EXPECT_EQ(a->stats().cached_bytes, 0);
  EXPECT_EQ(src->out_bytes, 0);
}

TEST(CachingAllocator, ARefusedBlockEmptiesTheCacheAndRetriesOnceThenNamesTheRequest) {
  // The system has 8 granules; 6 sit in the cache when a 4-granule block is asked for.
  auto [src, a] = make({kG, int64_t{1} << 30, reuse_exact_size}, 0, false, 8 * kG);
  void* p = a->allocate(2 * kG);
  void* q = a->allocate(4 * kG);
  a->deallocate(p, 2 * kG);
  a->deallocate(q, 4 * kG);
  void* r = a->allocate(3 * kG);  // exact size only: a miss, and 6 + 3 > 8
  EXPECT_NE(r, nullptr);
  EXPECT_EQ(a->stats().retries, 1);
  EXPECT_EQ(a->stats().cached_bytes, 0) << "the whole cache went back before the retry";
  EXPECT_EQ(src->released.size(), 2u);
  try {
    a->allocate(6 * kG);  // 3 + 6 > 8 even with an empty cache
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.requested_bytes, 6 * kG);
    EXPECT_NE(std::string(e.what()).find("fake source refused"), std::string::npos);
  }
  EXPECT_EQ(a->stats().retries, 2);
  EXPECT_EQ(a->stats().current_bytes, 3 * kG) << "a failed request changes nothing";
}

TEST(CachingAllocator, AHardCapacityRefusesWithTheBytesNeededFreeAndTheCapacity) {
  auto [src, a] = make({kG, int64_t{1} << 30, reuse_exact_size}, 16 * kG, true);
  void* p = a->allocate(10 * kG);
  try {
    a->allocate(7 * kG);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.requested_bytes, 7 * kG);
    EXPECT_EQ(e.free_bytes, 6 * kG);
    EXPECT_EQ(e.capacity_bytes, 16 * kG);
    EXPECT_NE(std::string(e.what()).find("--device sim:SIZE"), std::string::npos) << e.what();
  }
  a->deallocate(p, 10 * kG);
  EXPECT_NO_THROW(a->deallocate(a->allocate(16 * kG), 16 * kG)) << "all of it is usable";
}

// Note [Freeing just enough]: the cache lives inside the capacity, and a miss that does not fit
// beside it frees the smallest cached block that covers the shortfall, not the whole cache.
TEST(CachingAllocator, AMissBesideAFullCacheFreesJustEnoughOfIt) {
  auto [src, a] = make({kG, int64_t{1} << 30, reuse_exact_size}, 32 * kG, true);
  std::vector<std::pair<void*, int64_t>> blocks;
  for (int64_t g : {2, 4, 8, 10}) blocks.push_back({a->allocate(g * kG), g * kG});
  for (auto& [p, n] : blocks) a->deallocate(p, n);
  EXPECT_EQ(a->stats().cached_bytes, 24 * kG);
  a->allocate(12 * kG);  // 24 + 12 = 36 > 32: 4 granules short, so the 4-granule block goes
  ASSERT_EQ(src->released.size(), 1u);
  EXPECT_EQ(src->released[0], blocks[1].first);
  EXPECT_EQ(a->stats().cached_bytes, 20 * kG);
  EXPECT_LE(a->stats().current_bytes + a->stats().cached_bytes, 32 * kG);
  a->set_capacity(0);
  EXPECT_EQ(a->stats().cached_bytes, 0) << "a new capacity starts with an empty cache";
}

TEST(CachingAllocator, ForeignPointersAndNegativeSizesAreRefused) {
  auto [src, a] = make({kG, int64_t{1} << 30, reuse_exact_size});
  int x = 0;
  EXPECT_THROW(a->deallocate(&x, 4), Error);
  EXPECT_THROW(a->allocate(-1), InvalidArgument);
  a->deallocate(nullptr, 0);  // a no-op, as free(nullptr)
}

// ---- the host backends' hooks ----

TEST(HostMemory, HeapBlocksAreAlignedForODirectAndTheHostReuseRuleBoundsLargeBlocks) {
  HeapSource heap(Device::cpu());
  void* p = heap.acquire(3 * kG);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHostAlignment, 0u);
  std::memset(p, 1, 3 * kG);
  heap.release(p, 3 * kG);
  EXPECT_EQ(reuse_host_block(kG), 2 * kG) << "small blocks: up to twice";
  const int64_t big = int64_t{64} << 20;
  EXPECT_EQ(reuse_host_block(big), big + big / 8) << "32 MiB and up: at most 1/8 more";
  const OutOfMemory e = heap.refused(5 * kG, AllocatorStats{});
  EXPECT_EQ(e.requested_bytes, 5 * kG);
  EXPECT_NE(std::string(e.what()).find("lower the batch"), std::string::npos);
}

TEST(HostMemory, TheSimSourceCachesHeapBlocksButNeverArenaBlocks) {
  SimSource sim(Device::sim(7));
  void* heap_block = sim.acquire(kG);
  EXPECT_TRUE(sim.cacheable(heap_block));
  sim.capacity_changed(8 * kG);
  void* arena_block = sim.acquire(2 * kG);
  EXPECT_FALSE(sim.cacheable(arena_block)) << "the arena reuses its pages at any size";
  EXPECT_FALSE(sim.cacheable(heap_block)) << "nothing is cached while the arena serves";
  void* fallback = sim.acquire(16 * kG);  // larger than the arena: from the heap
  AllocatorStats s;
  sim.add_stats(s);
  EXPECT_EQ(s.arena_fallbacks, 1);
  sim.release(fallback, 16 * kG);
  sim.release(heap_block, kG);
  sim.capacity_changed(0);
  EXPECT_FALSE(sim.cacheable(arena_block)) << "the old arena still owns its live block";
  sim.release(arena_block, 2 * kG);
}

TEST(HostMemory, TheCpuAllocatorReusesAFreedBlockOfTheSameSize) {
  Allocator& cpu = allocator_for(Device::cpu());
  void* p = cpu.allocate(5 * kG + 1);
  cpu.deallocate(p, 5 * kG + 1);
  const int64_t hits = cpu.stats().cache_hits;
  void* q = cpu.allocate(5 * kG + 1);
  EXPECT_EQ(q, p);
  EXPECT_EQ(cpu.stats().cache_hits, hits + 1);
  cpu.deallocate(q, 5 * kG + 1);
}

TEST(AlignedBuffer, HeapOrAllocatorBlocksAlignedAndMovable) {
  AlignedBuffer heap(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(heap.data()) % kHostAlignment, 0u);
  EXPECT_EQ(heap.size(), 100);
  std::memset(heap.data(), 7, 100);
  CachingAllocator counted(Device::cpu(), std::make_unique<HeapSource>(Device::cpu()),
                           CachePolicy{kHostAlignment, 0, reuse_exact_size}, 0, false);
  {
    AlignedBuffer from(kG + 1, counted);
    EXPECT_EQ(counted.stats().current_bytes, 2 * kG) << "counted by the allocator it came from";
    AlignedBuffer moved = std::move(from);
    EXPECT_EQ(from.data(), nullptr);
    EXPECT_EQ(moved.size(), kG + 1);
    moved = AlignedBuffer(kG, counted);  // the old block goes back
    EXPECT_EQ(counted.stats().current_bytes, kG);
  }
  EXPECT_EQ(counted.stats().current_bytes, 0);
}

}  // namespace
}  // namespace mw
