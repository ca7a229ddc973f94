// The caching-allocator core (core/caching_allocator.h) once, over a fake source that hands out
// addresses it never backs: rounding, best-fit reuse, size classes, splitting and merging (against
// a model under random traffic), the cache bound, the capacity (and the cache inside it, Note
// [Freeing just enough]), the reserved capacity of a sim device (Note [Sim arena]),
// return-the-cache-and-retry, statistics. Then the host sources (core/host_memory.h), the sim
// device itself, and AlignedBuffer. The CUDA and pinned sources are tested in
// tests/core/cuda_stream_test.cpp and tests/cuda, which skip without a GPU.
#include "core/caching_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <random>
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

// Blocks never split: a segment per request, reused whole (the cpu device's policy).
CachePolicy whole_blocks(int64_t max_cached_bytes, int64_t (*max_reuse)(int64_t)) {
  return {.granule_bytes = kG, .max_cached_bytes = max_cached_bytes, .max_reuse_bytes = max_reuse};
}

Fixture make(CachePolicy policy, int64_t capacity = 0, bool hard = false, int64_t limit = 0) {
  auto source = std::make_unique<FakeSource>(limit);
  FakeSource* raw = source.get();
  return {raw, std::make_unique<CachingAllocator>(Device::sim(7), std::move(source), policy,
                                                  capacity, hard)};
}

TEST(CachingAllocator, RoundsToTheGranuleAndServesTheSmallestCachedBlockThatFits) {
  auto [src, a] = make(whole_blocks(int64_t{1} << 30, reuse_up_to_twice));
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

// The window watermark resets on its own: a caller sampling short windows (Gemini's warmup) leaves
// the run's peak as it was.
TEST(CachingAllocator, WindowPeakResetsWithoutTouchingThePeak) {
  auto [src, a] = make(whole_blocks(int64_t{1} << 30, reuse_exact_size));
  void* p = a->allocate(4 * kG);
  a->deallocate(p, 4 * kG);
  a->reset_window_peak();
  EXPECT_EQ(a->stats().window_peak_bytes, 0);
  void* q = a->allocate(kG);
  EXPECT_EQ(a->stats().window_peak_bytes, kG);
  EXPECT_EQ(a->stats().peak_bytes, 4 * kG) << "reset_window_peak must not lower the run's peak";
  a->deallocate(q, kG);
  a->reset_peak();
  EXPECT_EQ(a->stats().peak_bytes, 0);
  EXPECT_EQ(a->stats().window_peak_bytes, kG) << "and reset_peak leaves the window's";
}

TEST(CachingAllocator, ExactSizeReuseNeverHandsOutALargerBlock) {
  auto [src, a] = make(whole_blocks(int64_t{1} << 30, reuse_exact_size));
  void* p = a->allocate(2 * kG);
  a->deallocate(p, 2 * kG);
  void* q = a->allocate(kG);
  EXPECT_NE(q, p);
  EXPECT_EQ(a->stats().current_bytes, kG) << "the accounting is exactly what was asked for";
  EXPECT_EQ(a->allocate(2 * kG), p);
}

TEST(CachingAllocator, TheCacheBoundReleasesWhatWouldPassIt) {
  auto [src, a] = make(whole_blocks(3 * kG, reuse_up_to_twice));
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
  auto [src, a] = make(whole_blocks(int64_t{1} << 30, reuse_exact_size), 0, false, 8 * kG);
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
  auto [src, a] = make(whole_blocks(int64_t{1} << 30, reuse_exact_size), 16 * kG, true);
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

// A GPU's cap (--device cuda:SIZE, CachingAllocator::set_limit): a reported-only capacity becomes
// hard at the limit, the cache is held inside it, and lifting it restores the device's size.
TEST(CachingAllocator, ALimitMakesAGpusReportedCapacityHardUntilLifted) {
  auto [src, a] = make(gpu_cache_policy(512, int64_t{1} << 40), int64_t{64} << 20, false);
  void* big = a->allocate(int64_t{40} << 20);
  a->deallocate(big, int64_t{40} << 20);  // cached: 40 MiB of segment
  a->set_limit(int64_t{16} << 20);
  EXPECT_EQ(a->stats().capacity_bytes, int64_t{16} << 20);
  EXPECT_LE(src->out_bytes, int64_t{16} << 20) << "the cache beyond the limit was returned";
  void* p = a->allocate(int64_t{10} << 20);
  EXPECT_THROW(a->allocate(int64_t{8} << 20), OutOfMemory) << "10 + 8 MiB passes 16";
  a->deallocate(p, int64_t{10} << 20);
  EXPECT_THROW(a->set_limit(int64_t{65} << 20), InvalidArgument) << "above the device's memory";
  a->set_limit(0);
  EXPECT_EQ(a->stats().capacity_bytes, int64_t{64} << 20);
  void* q = a->allocate(int64_t{48} << 20);  // reported only again: the source is the bound
  a->deallocate(q, int64_t{48} << 20);
}

// cuda:SIZE is a smaller GPU: what it reserves stays inside the cap. A 2 MiB request took a 20 MiB
// segment; a 19 MiB one passed the in-use check (21 <= 32) but fit no free block, and its new 20
// MiB segment was taken although nothing cached could be freed: 40 MiB reserved under 32. Now
// refused, as cudaMalloc would be; a request whose own size fits gets a segment of its size.
TEST(CachingAllocator, AGpusLimitBoundsWhatIsReservedNotOnlyWhatIsInUse) {
  auto [src, a] = make(gpu_cache_policy(512, int64_t{1} << 40), int64_t{64} << 20, false);
  a->set_limit(int64_t{32} << 20);
  void* small = a->allocate(int64_t{2} << 20);
  EXPECT_EQ(src->out_bytes, int64_t{20} << 20) << "small requests share a 20 MiB segment";
  EXPECT_THROW(a->allocate(int64_t{19} << 20), OutOfMemory);
  EXPECT_LE(src->out_bytes, int64_t{32} << 20);
  void* fits = a->allocate(int64_t{11} << 20);  // 20 + 11 <= 32: a segment of its own size
  EXPECT_LE(src->out_bytes, int64_t{32} << 20);
  a->deallocate(fits, int64_t{11} << 20);
  a->deallocate(small, int64_t{2} << 20);
  a->set_limit(0);
}

// Note [Freeing just enough]: the cache lives inside the capacity, and a miss that does not fit
// beside it frees the smallest cached block that covers the shortfall, not the whole cache.
TEST(CachingAllocator, AMissBesideAFullCacheFreesJustEnoughOfIt) {
  auto [src, a] = make(whole_blocks(int64_t{1} << 30, reuse_exact_size), 32 * kG, true);
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
  auto [src, a] = make(whole_blocks(int64_t{1} << 30, reuse_exact_size));
  int x = 0;
  EXPECT_THROW(a->deallocate(&x, 4), Error);
  EXPECT_THROW(a->allocate(-1), InvalidArgument);
  a->deallocate(nullptr, 0);  // a no-op, as free(nullptr)
}

// ---- size classes, splitting and merging ----

CachePolicy split_to_granule(int64_t max_cached_bytes = int64_t{1} << 30) {
  return {.granule_bytes = kG, .max_cached_bytes = max_cached_bytes, .min_split_bytes = kG};
}

TEST(CachingAllocator, AFreeBlockIsSplitForASmallerRequestAndFreedNeighboursMergeInAnyOrder) {
  auto [src, a] = make(split_to_granule());
  char* p = static_cast<char*>(a->allocate(8 * kG));
  a->deallocate(p, 8 * kG);
  char* q = static_cast<char*>(a->allocate(3 * kG));
  EXPECT_EQ(q, p) << "the cached block is cut, not left for a larger request";
  EXPECT_EQ(a->stats().current_bytes, 3 * kG) << "the accounting is exactly what was asked for";
  EXPECT_EQ(a->stats().cached_bytes, 5 * kG) << "the rest stays free for other requests";
  char* r = static_cast<char*>(a->allocate(5 * kG));
  EXPECT_EQ(r, p + 3 * kG) << "the rest serves the next request that fits";
  EXPECT_EQ(src->acquires, 1);
  for (int order = 0; order < 2; ++order) {  // q then r, then r then q: one block again
    a->deallocate(order ? r : q, 0);
    a->deallocate(order ? q : r, 0);
    EXPECT_EQ(a->segment_count(), 1);
    EXPECT_EQ(a->allocate(8 * kG), p) << "the pieces merged back into the whole segment";
    a->deallocate(p, 8 * kG);
    q = static_cast<char*>(a->allocate(3 * kG));
    r = static_cast<char*>(a->allocate(5 * kG));
  }
  EXPECT_EQ(src->acquires, 1);
  EXPECT_THROW(a->deallocate(p + kG, 0), Error) << "a pointer inside a block is not a block";
}

// Only a wholly free segment can go back to the system: the cache bound and empty_cache() leave a
// segment with a live block alone, and return it once its last block is freed.
TEST(CachingAllocator, ASegmentGoesBackOnlyWhenWhollyFree) {
  auto [src, a] = make(split_to_granule(0));  // nothing kept once wholly free
  void* p = a->allocate(8 * kG);
  a->deallocate(p, 8 * kG);
  EXPECT_EQ(src->released.size(), 1u);
  void* q = a->allocate(8 * kG);
  a->deallocate(q, 8 * kG);
  void* r = a->allocate(2 * kG);  // a fresh segment; its block is live
  a->empty_cache();
  EXPECT_EQ(a->segment_count(), 1);
  a->deallocate(r, 2 * kG);
  EXPECT_EQ(a->segment_count(), 0);
  EXPECT_EQ(src->out_bytes, 0);
}

TEST(CachingAllocator, GpuSizeClassesShareSegmentsAndNeverMixSmallWithLarge) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  EXPECT_EQ(gpu_large_segment_bytes(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(gpu_large_segment_bytes(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(gpu_large_segment_bytes(11 * kMiB + 1), 12 * kMiB);
  auto [src, a] = make(gpu_cache_policy(512, int64_t{1} << 40));
  std::vector<void*> small;
  for (int i = 0; i < 100; ++i) small.push_back(a->allocate(1000));  // 1024 each, 100 KiB
  EXPECT_EQ(src->acquires, 1) << "a hundred small blocks share one 2 MiB segment";
  EXPECT_EQ(src->out_bytes, 2 * kMiB);
  EXPECT_EQ(a->stats().current_bytes, 100 * 1024);
  void* mid1 = a->allocate(3 * kMiB);
  void* mid2 = a->allocate(5 * kMiB);
  EXPECT_EQ(src->acquires, 2) << "mid-sized blocks share one 20 MiB segment";
  EXPECT_EQ(static_cast<char*>(mid2), static_cast<char*>(mid1) + 3 * kMiB);
  void* big = a->allocate(16 * kMiB);  // 12 MiB are left of the 20: a segment of its own
  EXPECT_EQ(src->acquires, 3);
  a->deallocate(big, 16 * kMiB);
  void* almost = a->allocate(15 * kMiB + kMiB / 2);  // 0.5 MiB left: not worth a split
  EXPECT_EQ(almost, big);
  EXPECT_EQ(a->stats().current_bytes, 100 * 1024 + 8 * kMiB + 16 * kMiB) << "handed out whole";
  a->deallocate(almost, 0);
  for (void* p : small) a->deallocate(p, 1000);
  a->deallocate(mid1, 0);
  a->deallocate(mid2, 0);
  const int64_t acquires = src->acquires;
  void* tiny = a->allocate(100);
  EXPECT_EQ(src->acquires, acquires) << "the small segment serves again";
  void* large = a->allocate(2 * kMiB);
  EXPECT_EQ(src->acquires, acquires) << "a large request splits a free large block";
  EXPECT_EQ(large, big) << "best fit: the 16 MiB block, not the 20 MiB one";
  a->deallocate(tiny, 0);
  a->deallocate(large, 0);
  a->empty_cache();
  EXPECT_EQ(src->out_bytes, 0);
}

// Random traffic of small and large requests against a model: live blocks never overlap and lie
// inside the segments the source gave; the accounting matches the model; once everything is freed
// every segment is one free block again (every merge happened) and empty_cache() returns it all.
TEST(CachingAllocator, RandomTrafficKeepsBlocksDisjointAndMergesEverySegmentBack) {
  auto [src, a] = make(gpu_cache_policy(512, int64_t{1} << 40));
  std::mt19937 rng(7);
  std::map<char*, int64_t> live;  // address -> rounded bytes
  int64_t live_bytes = 0;
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      const int64_t bytes = rng() % 4 == 0 ? 1 + static_cast<int64_t>(rng() % (24 << 20))
                                           : 1 + static_cast<int64_t>(rng() % (1 << 20));
      char* p = static_cast<char*>(a->allocate(bytes));
      const int64_t rounded = round_up(bytes, 512);
      auto next = live.lower_bound(p);
      ASSERT_TRUE(next == live.end() || p + rounded <= next->first) << "overlaps the next block";
      ASSERT_TRUE(next == live.begin() || std::prev(next)->first + std::prev(next)->second <= p)
          << "overlaps the previous block";
      live.emplace(p, rounded);
      live_bytes += rounded;
    } else {
      auto it = std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
      a->deallocate(it->first, it->second);
      live_bytes -= it->second;
      live.erase(it);
    }
    const AllocatorStats s = a->stats();
    ASSERT_GE(s.current_bytes, live_bytes);
    ASSERT_LE(s.current_bytes, live_bytes + static_cast<int64_t>(live.size()) * (1 << 20))
        << "an unsplit block is at most 1 MiB over its request";
    ASSERT_EQ(s.current_bytes + s.cached_bytes, src->out_bytes);
  }
  for (const auto& [p, n] : live) a->deallocate(p, n);
  EXPECT_EQ(a->stats().current_bytes, 0);
  a->empty_cache();
  EXPECT_EQ(src->out_bytes, 0) << "every segment merged back to one free block";
  EXPECT_EQ(a->segment_count(), 0);
}

// Note [Sim arena]: with reserve_capacity the capacity is one segment, got when it is set; blocks
// of any size are carved from it; a fragmented segment serves from an overflow one (counted,
// returned when freed, its pages kept for the next overflow of its size) rather than failing; a
// new capacity retires the old segment, which goes back once its last block is freed.
TEST(CachingAllocator, AReservedCapacityIsOneSegmentCarvedAtAnySize) {
  CachePolicy policy = split_to_granule();
  policy.reserve_capacity = true;
  auto [src, a] = make(policy, 16 * kG, true);
  EXPECT_EQ(src->acquires, 1);
  EXPECT_EQ(src->out_bytes, 16 * kG);
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(a->allocate(2 * kG));
  EXPECT_EQ(src->acquires, 1);
  for (int i = 0; i < 8; i += 2) a->deallocate(blocks[static_cast<size_t>(i)], 2 * kG);
  void* wide = a->allocate(4 * kG);  // 8 granules free in 2-granule holes
  EXPECT_EQ(a->stats().arena_fallbacks, 1);
  EXPECT_EQ(src->acquires, 2);
  EXPECT_EQ(a->stats().current_bytes, 12 * kG);
  EXPECT_THROW(a->allocate(6 * kG), OutOfMemory) << "the capacity still counts every block";
  a->deallocate(wide, 4 * kG);
  EXPECT_EQ(src->released.size(), 0u) << "the overflow's pages are kept as the spare";
  EXPECT_EQ(a->stats().current_bytes + a->stats().cached_bytes, 16 * kG) << "not as a segment";
  wide = a->allocate(4 * kG);  // the same overflow again: the spare's pages, nothing acquired
  EXPECT_EQ(a->stats().arena_fallbacks, 2);
  EXPECT_EQ(src->acquires, 2);
  a->deallocate(wide, 4 * kG);
  a->set_capacity(32 * kG);  // blocks of the old segment are still live
  EXPECT_EQ(src->released.size(), 1u) << "a new capacity returns the spare";
  EXPECT_EQ(src->out_bytes, 48 * kG);
  for (int i = 1; i < 8; i += 2) a->deallocate(blocks[static_cast<size_t>(i)], 2 * kG);
  EXPECT_EQ(src->out_bytes, 32 * kG) << "the old capacity's segment went back with its last block";
  a->set_capacity(0);
  EXPECT_EQ(src->out_bytes, 0);
}

// The spare overflow segment is cache: a bound below it (Gemini's three tiers on sim, whose pages
// are host RAM) returns it, and keeps the next one from staying.
TEST(CachingAllocator, TheSpareOverflowSegmentKeepsToTheCacheBound) {
  CachePolicy policy = split_to_granule();
  policy.reserve_capacity = true;
  policy.max_cached_bytes = 64 * kG;
  auto [src, a] = make(policy, 8 * kG, true);
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(a->allocate(2 * kG));
  a->deallocate(blocks[0], 2 * kG);
  a->deallocate(blocks[2], 2 * kG);
  void* wide = a->allocate(4 * kG);  // two 2-granule holes: an overflow
  a->deallocate(wide, 4 * kG);
  EXPECT_EQ(src->released.size(), 0u) << "kept as the spare";
  a->set_max_cached_bytes(0);
  EXPECT_EQ(src->released.size(), 1u) << "a bound below it returns it";
  wide = a->allocate(4 * kG);
  a->deallocate(wide, 4 * kG);
  EXPECT_EQ(src->released.size(), 2u) << "and the next overflow goes back when freed";
  a->deallocate(blocks[1], 2 * kG);
  a->deallocate(blocks[3], 2 * kG);
}

// ---- the host sources and the sim device ----

TEST(HostMemory, HeapBlocksAreAlignedForODirect) {
  HeapSource heap(Device::cpu());
  void* p = heap.acquire(3 * kG);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHostAlignment, 0u);
  std::memset(p, 1, 3 * kG);
  heap.release(p, 3 * kG);
  const OutOfMemory e = heap.refused(5 * kG, AllocatorStats{});
  EXPECT_EQ(e.requested_bytes, 5 * kG);
  EXPECT_NE(std::string(e.what()).find("lower the batch"), std::string::npos);
}

// Large sim segments are address space only: mapping more than the machine has costs nothing
// until touched (a sim:80GiB on this 23 GiB machine), and a refusal names the sim size to change.
TEST(HostMemory, TheSimSourceMapsLargeSegmentsWithoutReservingThem) {
  SimSource sim(Device::sim(7));
  const int64_t huge = int64_t{64} << 30;
  void* p = sim.acquire(huge);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHostAlignment, 0u);
  static_cast<char*>(p)[huge - 1] = 1;  // one page backed
  sim.release(p, huge);
  void* small = sim.acquire(kG);
  ASSERT_NE(small, nullptr);
  sim.release(small, kG);
  const OutOfMemory e = sim.refused(huge, AllocatorStats{});
  EXPECT_NE(std::string(e.what()).find("--device sim:SIZE"), std::string::npos) << e.what();
}

// The sim device: blocks of new sizes reuse the same pages (the same addresses come back), the
// capacity is still exact, and a fragmented device serves a block from outside instead of failing.
TEST(SimDevice, NewSizesReuseTheSamePagesAndFragmentationNeverFails) {
  const int sim = 6;
  set_sim_capacity(sim, 64 * kG);
  Allocator& al = allocator_for(Device::sim(sim));
  void* a = al.allocate(32 * kG);
  al.deallocate(a, 32 * kG);
  void* b = al.allocate(20 * kG);  // another size: an exact-size cache would have missed
  EXPECT_EQ(b, a) << "the block came from fresh pages, not the device's";
  al.deallocate(b, 20 * kG);
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(al.allocate(4 * kG));
  for (int i = 0; i < 16; i += 2) al.deallocate(blocks[static_cast<size_t>(i)], 4 * kG);
  const int64_t fallbacks = al.stats().arena_fallbacks;
  void* big = al.allocate(16 * kG);  // fits the capacity, no hole holds it
  EXPECT_EQ(al.stats().arena_fallbacks, fallbacks + 1);
  EXPECT_EQ(al.stats().current_bytes, 48 * kG);
  EXPECT_THROW(al.allocate(20 * kG), OutOfMemory) << "the capacity is still enforced";
  al.deallocate(big, 16 * kG);
  for (int i = 1; i < 16; i += 2) al.deallocate(blocks[static_cast<size_t>(i)], 4 * kG);
  EXPECT_EQ(al.stats().current_bytes, 0);
  set_sim_capacity(sim, 0);
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
                           whole_blocks(0, reuse_exact_size), 0, false);
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
