// fast::exp and fast::tanh against libm over their whole useful range.
#include "core/cpu/fast_math.h"

#include <gtest/gtest.h>

#include <cmath>

namespace mw {
namespace {

TEST(FastMath, ExpRelativeErrorBelowTwoUlpWhereRepresentable) {
  double worst = 0;
  for (double x = -87.0; x <= 88.0; x += 1e-3) {
    float f = static_cast<float>(x);
    double ref = std::exp(static_cast<double>(f));
    worst = std::max(worst, std::abs(ops::fast::exp(f) - ref) / ref);
  }
  // 2.4e-7 is two f32 ulps at the top of a binade: the polynomial's truncation (~1e-8) plus the
  // rounding of its f32 evaluation.
  EXPECT_LT(worst, 2.4e-7);
}

TEST(FastMath, TanhAbsoluteErrorBelow2e7) {
  double worst = 0;
  for (double x = -12.0; x <= 12.0; x += 1e-4) {
    float f = static_cast<float>(x);
    worst = std::max(worst, std::abs(ops::fast::tanh(f) - std::tanh(static_cast<double>(f))));
  }
  // 1 - 2/(e+1) loses relative accuracy near 0 but keeps absolute error at f32 epsilon scale; GELU
  // uses 0.5x(1 + tanh), where an absolute 2e-7 is below the f32 rounding of the sum.
  EXPECT_LT(worst, 2e-7);
  EXPECT_EQ(ops::fast::tanh(0.0f), 0.0f);
  EXPECT_EQ(ops::fast::tanh(100.0f), 1.0f);
  EXPECT_EQ(ops::fast::tanh(-100.0f), -1.0f);
}

}  // namespace
}  // namespace mw
