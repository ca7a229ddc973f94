// SpaceAllocator: best fit, coalescing on both sides, the tail cases, and a randomized comparison
// against a plain byte map of which granules are in use.
#include "offload/io/space_allocator.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "core/error.h"

namespace mw::io {
namespace {

constexpr int64_t kG = 4096;

TEST(SpaceAllocator, RoundsToGranuleAndGrowsTail) {
  SpaceAllocator a;
  EXPECT_EQ(a.allocate(1), 0);
  EXPECT_EQ(a.allocate(kG + 1), kG);
  EXPECT_EQ(a.end_bytes(), 3 * kG);
  EXPECT_EQ(a.hole_bytes(), 0);
}

TEST(SpaceAllocator, CoalescesBothNeighbours) {
  SpaceAllocator a;
  int64_t x = a.allocate(kG), y = a.allocate(kG), z = a.allocate(kG);
  a.allocate(kG);  // keeps the three away from the tail
  a.free(x, kG);
  a.free(z, kG);
  EXPECT_EQ(a.holes().size(), 2u);
  a.free(y, kG);  // joins x's hole and z's hole
  ASSERT_EQ(a.holes().size(), 1u);
  EXPECT_EQ(a.holes()[0], std::make_pair(int64_t{0}, 3 * kG));
  EXPECT_EQ(a.allocate(3 * kG), 0) << "the merged hole must serve a 3-granule request";
}

// The TensorNVMe leak: freeing the tail block when a hole sits just before it must give back both,
// not leave the hole stranded below a shrunken tail.
TEST(SpaceAllocator, TailFreeMergesTheHoleBeforeIt) {
  SpaceAllocator a;
  int64_t x = a.allocate(kG);
  int64_t y = a.allocate(2 * kG);
  int64_t z = a.allocate(kG);
  (void)x;
  a.free(y, 2 * kG);  // hole [4096, 12288)
  a.free(z, kG);      // tail block: merges with the hole, tail drops to 4096
  EXPECT_EQ(a.end_bytes(), kG);
  EXPECT_EQ(a.hole_bytes(), 0);
  EXPECT_TRUE(a.holes().empty());
  a.free(x, kG);
  EXPECT_EQ(a.end_bytes(), 0);
}

TEST(SpaceAllocator, RepeatedFillAndDrainDoesNotGrow) {
  SpaceAllocator a;
  std::vector<int64_t> offs;
  for (int round = 0; round < 50; ++round) {
    offs.clear();
    for (int i = 0; i < 10; ++i) offs.push_back(a.allocate((i % 3 + 1) * kG));
    // Free in an order that leaves holes before the tail goes.
    for (int i : {1, 3, 5, 7, 9, 0, 2, 4, 6, 8}) a.free(offs[i], (i % 3 + 1) * kG);
    ASSERT_EQ(a.end_bytes(), 0) << "round " << round;
  }
}

TEST(SpaceAllocator, BestFitPicksSmallestHole) {
  SpaceAllocator a;
  int64_t big = a.allocate(4 * kG);
  a.allocate(kG);
  int64_t small = a.allocate(2 * kG);
  a.allocate(kG);
  a.free(big, 4 * kG);
  a.free(small, 2 * kG);
  EXPECT_EQ(a.allocate(2 * kG), small);
  EXPECT_EQ(a.allocate(kG), big);  // splits the big hole from its start
  EXPECT_EQ(a.holes()[0], std::make_pair(big + kG, 3 * kG));
}

TEST(SpaceAllocator, RejectsDoubleFreeAndForeignRanges) {
  SpaceAllocator a;
  int64_t x = a.allocate(kG);
  a.allocate(kG);
  a.free(x, kG);
  EXPECT_THROW(a.free(x, kG), InvalidArgument);
  EXPECT_THROW(a.free(10 * kG, kG), InvalidArgument);
  EXPECT_THROW(a.free(1, kG), InvalidArgument);
}

// Random allocate/free against a map of granule owners: no two live ranges overlap, holes are
// exactly the unowned granules below the end, no hole touches another or the tail.
TEST(SpaceAllocator, RandomizedAgainstGranuleMap) {
  std::mt19937_64 rng(7);
  SpaceAllocator a;
  std::map<int64_t, int64_t> live;  // offset -> granules
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 100 < 55) {
      int64_t granules = 1 + rng() % 16;
      int64_t off = a.allocate(granules * kG - static_cast<int64_t>(rng() % kG));
      ASSERT_EQ(off % kG, 0);
      auto next = live.lower_bound(off);
      ASSERT_TRUE(next == live.end() || next->first >= off + granules * kG)
          << "overlap at step " << step;
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second * kG, off) << "overlap at step " << step;
      }
      live[off] = granules;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      a.free(it->first, it->second * kG);
      live.erase(it);
    }
    // Reference: owned granules; the end is the end of the last live range.
    int64_t owned = 0, end = 0;
    for (auto& [off, g] : live) owned += g * kG, end = std::max(end, off + g * kG);
    ASSERT_EQ(a.end_bytes(), end) << "step " << step;
    ASSERT_EQ(a.used_bytes(), owned) << "step " << step;
    auto holes = a.holes();
    for (size_t i = 0; i < holes.size(); ++i) {
      ASSERT_LT(holes[i].first + holes[i].second, a.end_bytes()) << "hole touches the tail";
      if (i > 0) {
        ASSERT_LT(holes[i - 1].first + holes[i - 1].second, holes[i].first);
      }
    }
  }
}

}  // namespace
}  // namespace mw::io
