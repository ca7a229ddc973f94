// Arena (core/arena.h) and the sim device's use of it (Note [Sim arena]): best fit, freed
// neighbours merged whatever the order, fragmentation answered by the heap, never by a failure.
#include "core/arena.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"

namespace mw {
namespace {

constexpr int64_t kG = 4096;

TEST(Arena, BestFitSplitsAndFreedNeighboursMergeInAnyOrder) {
  Arena a(16 * kG, kG);
  char* p0 = static_cast<char*>(a.allocate(4 * kG));
  char* p1 = static_cast<char*>(a.allocate(2 * kG));
  char* p2 = static_cast<char*>(a.allocate(4 * kG));
  ASSERT_TRUE(p0 && p1 && p2);
  EXPECT_EQ(p1, p0 + 4 * kG);  // carved in order from the one free run
  EXPECT_EQ(p2, p1 + 2 * kG);
  EXPECT_EQ(a.in_use_bytes(), 10 * kG);
  a.deallocate(p1, 2 * kG);  // holes of 2 and 6 granules: a 2-granule block takes the 2-hole
  void* q = a.allocate(2 * kG);
  EXPECT_EQ(q, p1) << "best fit takes the smallest run that holds the block";
  a.deallocate(q, 2 * kG);
  a.deallocate(p0, 4 * kG);  // merges with the hole after it
  a.deallocate(p2, 4 * kG);  // merges with both neighbours: one run again
  EXPECT_EQ(a.in_use_bytes(), 0);
  EXPECT_EQ(a.largest_free_bytes(), 16 * kG);
  EXPECT_NE(a.allocate(16 * kG), nullptr);
  EXPECT_EQ(a.allocate(kG), nullptr) << "a full arena answers nullptr, not an exception";
}

// Random allocate/free against a model: blocks never overlap, stay inside, and after freeing
// everything the arena is one run again (every merge happened).
TEST(Arena, RandomTrafficKeepsBlocksDisjointAndMergesBackToOneRun) {
  const int64_t size = 256 * kG;
  Arena a(size, kG);
  std::mt19937 rng(7);
  std::vector<std::pair<char*, int64_t>> live;
  for (int i = 0; i < 5000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      const int64_t bytes = (1 + rng() % 12) * kG;
      char* p = static_cast<char*>(a.allocate(bytes));
      if (!p) continue;
      ASSERT_TRUE(a.owns(p) && a.owns(p + bytes - 1));
      for (const auto& [q, n] : live) ASSERT_TRUE(p + bytes <= q || q + n <= p) << "overlap";
      live.emplace_back(p, bytes);
    } else {
      const size_t k = rng() % live.size();
      a.deallocate(live[k].first, live[k].second);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  for (const auto& [p, n] : live) a.deallocate(p, n);
  EXPECT_EQ(a.in_use_bytes(), 0);
  EXPECT_EQ(a.largest_free_bytes(), size);
}

TEST(Arena, FreeingTwiceIsCaught) {
  Arena a(8 * kG, kG);
  void* p = a.allocate(2 * kG);
  a.deallocate(p, 2 * kG);
  EXPECT_THROW(a.deallocate(p, 2 * kG), Error);
}

// The sim device: blocks of new sizes reuse the arena's pages (the same addresses come back), the
// capacity is still exact, and a fragmented arena serves a block from the heap instead of failing.
TEST(SimArena, NewSizesReuseTheSamePagesAndFragmentationNeverFails) {
  const int sim = 6;
  set_sim_capacity(sim, 64 * kG);
  Allocator& al = allocator_for(Device::sim(sim));
  void* a = al.allocate(32 * kG);
  al.deallocate(a, 32 * kG);
  void* b = al.allocate(20 * kG);  // another size: the exact-size cache would have missed
  EXPECT_EQ(b, a) << "the block came from fresh pages, not the arena's";
  al.deallocate(b, 20 * kG);

  // Fragment: 16 blocks of 4 granules, free every other one: 32 granules free in 4-granule holes.
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

}  // namespace
}  // namespace mw
