// Counter-based random numbers: reproducible by index, independent of how a range is split.
#include "core/random.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace mw {
namespace {

TEST(Random, FillNormalEqualsElementwiseDrawsForAnySplit) {
  RngState rng{42, 1000};
  std::vector<double> whole(1001);
  fill_normal(whole.data(), 0, whole.size(), rng, 1.0);
  for (uint64_t i = 0; i < whole.size(); ++i) ASSERT_EQ(whole[i], random_normal(rng, i)) << i;
  std::vector<double> part(500);
  fill_normal(part.data(), 333, 833, rng, 1.0);  // odd start: the split must not change values
  for (uint64_t i = 0; i < part.size(); ++i) ASSERT_EQ(part[i], whole[333 + i]) << i;
}

TEST(Random, NormalMomentsAndUniformRange) {
  RngState rng{7, 0};
  const int n = 1 << 20;
  double s = 0, s2 = 0, s4 = 0;
  for (int i = 0; i < n; ++i) {
    double x = random_normal(rng, static_cast<uint64_t>(i));
    s += x, s2 += x * x, s4 += x * x * x * x;
    double u = random_uniform(rng, static_cast<uint64_t>(i));
    ASSERT_TRUE(u >= 0.0 && u < 1.0);
  }
  // 2^20 draws: the sample mean has std 1e-3, the variance ~1.4e-3, the 4th moment ~1e-2; 5 sigma.
  EXPECT_NEAR(s / n, 0.0, 5e-3);
  EXPECT_NEAR(s2 / n, 1.0, 7e-3);
  EXPECT_NEAR(s4 / n, 3.0, 5e-2);
}

TEST(Random, GeneratorReservesDisjointRanges) {
  Generator g(3);
  RngState a = g.reserve(10), b = g.reserve(5);
  EXPECT_EQ(a.offset, 0u);
  EXPECT_EQ(b.offset, 10u);
  EXPECT_EQ(random_bits(a, 10), random_bits(b, 0));  // same counter, same number
  g.set_state(a);
  EXPECT_EQ(g.reserve(1).offset, 0u);
}

}  // namespace
}  // namespace mw
