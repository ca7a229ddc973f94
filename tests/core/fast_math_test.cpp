// fast::exp against the exact (f64 libm) value, in f32 ulps, over the whole f32
// range: every 251st bit pattern of all 2^32 (a prime stride, so every exponent and many mantissa
// patterns of both signs, ~17M inputs), plus tiny, huge, denormal and special arguments. Both code
// paths the kernels reach are checked: one scalar call and the loop the compiler vectorises (SSE2;
// the build has no -march, and fast_math.h has no ISA-specific version, so this CPU reaches no
// other).
#include "core/cpu/fast_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace mw {
namespace {

// One ulp of the f32 nearest to `exact`: 2^(e - 23) for a normal, 2^-149 for a subnormal.
double ulp_of(double exact) {
  const double a = std::abs(exact);
  if (a < std::ldexp(1.0, -126)) return std::ldexp(1.0, -149);
  int e = 0;
  std::frexp(a, &e);
  return std::ldexp(1.0, e - 1 - 23);
}

// Error of `got` in ulps of `exact`; an overflow must be +-inf exactly, a NaN must stay NaN.
double ulp_error(float got, double exact) {
  if (std::isnan(exact)) return std::isnan(got) ? 0 : 1e30;
  if (std::isinf(static_cast<float>(exact))) return got == static_cast<float>(exact) ? 0 : 1e30;
  if (std::isnan(got) || std::isinf(got)) return 1e30;
  return std::abs(static_cast<double>(got) - exact) / ulp_of(exact);
}

std::vector<float> sampled_inputs() {
  std::vector<float> x;
  x.reserve((uint64_t{1} << 32) / 251 + 64);
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 251) {
    const uint32_t b = static_cast<uint32_t>(bits);
    float f;
    std::memcpy(&f, &b, sizeof f);
    x.push_back(f);
  }
  const float inf = std::numeric_limits<float>::infinity();
  const float denorm_min = std::numeric_limits<float>::denorm_min();
  for (float f : {0.0f,
                  -0.0f,
                  1e-30f,
                  -1e-30f,
                  denorm_min,
                  -denorm_min,
                  1e-40f,
                  -1e-40f,
                  std::numeric_limits<float>::min(),
                  1e-6f,
                  -1e-6f,
                  0.625f,
                  -0.625f,
                  0.62499994f,
                  1.0f,
                  10.0f,
                  -10.0f,
                  87.0f,
                  -87.0f,
                  88.72f,
                  88.73f,
                  -87.34f,
                  -103.0f,
                  -103.97f,
                  -104.0f,
                  -105.0f,
                  89.0f,
                  100.0f,
                  -100.0f,
                  1e30f,
                  -1e30f,
                  std::numeric_limits<float>::max(),
                  -std::numeric_limits<float>::max(),
                  inf,
                  -inf,
                  std::numeric_limits<float>::quiet_NaN()})
    x.push_back(f);
  return x;
}

__attribute__((noinline)) float scalar_exp(float x) { return ops::fast::exp(x); }

// The kernels' shape: a plain loop over arrays, which -O3 vectorises.
__attribute__((noinline)) void vector_exp(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = ops::fast::exp(x[i]);
}

struct Worst {
  double ulp = 0;
  float at = 0;
  void add(float x, double err) {
    if (err > ulp) ulp = err, at = x;
  }
};

template <typename Vector, typename Scalar, typename Exact>
void check_all(const char* name, Vector vec, Scalar scalar, Exact exact, double bound_ulp) {
  const std::vector<float> x = sampled_inputs();
  std::vector<float> y(x.size());
  vec(x.data(), y.data(), static_cast<int64_t>(x.size()));
  Worst wv, ws;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = exact(static_cast<double>(x[i]));
    wv.add(x[i], ulp_error(y[i], want));
    if (i % 16 == 0 || i + 64 >= x.size()) ws.add(x[i], ulp_error(scalar(x[i]), want));
  }
  std::printf("  %s: worst %.3f ulp at %.9g (vectorised loop), %.3f ulp at %.9g (scalar)\n", name,
              wv.ulp, wv.at, ws.ulp, ws.at);
  EXPECT_LE(wv.ulp, bound_ulp) << name << " vectorised, at x = " << wv.at;
  EXPECT_LE(ws.ulp, bound_ulp) << name << " scalar, at x = " << ws.at;
}

TEST(FastMath, ExpWithinOneAndAHalfUlpOverTheWholeRange) {
  // Cephes' minimax polynomial plus the rounding of its f32 evaluation measured 0.96 ulp; 1.5 ulp
  // leaves room and still fails the clamp at -87 used before (exp(-100) was 1.6e-38, ~1e30 ulp)
  // and any flush of subnormal results.
  check_all(
      "exp", vector_exp, scalar_exp, [](double x) { return std::exp(x); }, 1.5);
}

TEST(FastMath, SpecialValuesAreExact) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(ops::fast::exp(0.0f), 1.0f);
  EXPECT_EQ(ops::fast::exp(-0.0f), 1.0f);
  EXPECT_EQ(ops::fast::exp(-1e-40f), 1.0f);  // a denormal argument
  EXPECT_EQ(ops::fast::exp(-inf), 0.0f);
  EXPECT_EQ(ops::fast::exp(inf), inf);
  EXPECT_EQ(ops::fast::exp(100.0f), inf);
  EXPECT_TRUE(std::isnan(ops::fast::exp(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
}  // namespace mw
