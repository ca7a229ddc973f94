// Branch-free exp for f32 kernels, written so the compiler vectorises the loops that call it
// (glibc's expf is a scalar call; GELU and cross-entropy spend most of their time there). Within
// 1.5 ulp of the exact result over the whole f32 range, specials included
// (tests/core/fast_math_test.cpp checks every 251st f32 bit pattern).
//
// fast::exp: exp(x) = 2^k * e^r with k = round(x / ln 2), r = x - k ln 2 split in two parts
// (Cody-Waite), e^r = 1 + r + r^2 p(r) with Cephes expf's minimax p of degree 5 on |r| <= ln2/2
// (measured 0.96 ulp). 2^k is applied as two factors 2^(k/2) and 2^(k-k/2), each a normal float,
// so results in the subnormal range (x < -87.3) are rounded once instead of clamped, and
// x > 88.73 gives +inf. NaN propagates.
//
// There is no fast tanh: GELU, its only user, is computed with a sigmoid (Note [GELU as a
// sigmoid], layers.cpp). The 1 - 2/(e^2x + 1) tanh used before had ~1e6 ulp of relative error
// near 0 (tanh(1e-6) was off by ~1.2e-7).
//
// f64 callers use std::exp: the gradient checks need full double precision.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

// Note [Wider clones of f32 loops]: the library is compiled for the x86-64 baseline (SSE2: four
// f32 lanes). The elementwise loops that call exp (GELU, cross-entropy) are cloned for AVX2 (eight
// lanes), the clone chosen once at load time by CPUID (GCC/clang target_clones). The AVX2 clone
// runs the same IEEE operations lane by lane, and no FMA is enabled, so nothing is contracted: its
// results are bitwise those of the baseline (sums keep their explicit lanes, whatever the width).
#define MW_F32_CLONES __attribute__((target_clones("avx2", "default")))

namespace mw::ops::fast {

inline float exp(float x) {
  // Below -104 the result rounds to 0; above 89 it overflows to inf (k = 128). NaN passes through.
  x = x < -104.0f ? -104.0f : x;
  x = x > 89.0f ? 89.0f : x;
  // Round to nearest by the 1.5 * 2^23 trick (plain SSE2; nearbyint would be a libm call).
  const float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - k * 0.693145751953125f) - k * 1.428606765330187045e-06f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = (p * r * r + r) + 1.0f;
  // k in [-150, 128]; both halves in [-75, 64], so each 2^half is a normal float. A NaN k is
  // converted as 0 (float->int of NaN is undefined behaviour, found by UBSan); r and so the
  // result are NaN anyway. The select vectorises like the clamps above.
  const float k_finite = k == k ? k : 0.0f;
  const uint32_t ki = static_cast<uint32_t>(static_cast<int32_t>(k_finite));
  const uint32_t k1 = static_cast<uint32_t>(static_cast<int32_t>(ki) >> 1), k2 = ki - k1;
  const float s1 = std::bit_cast<float>((k1 + 127u) << 23);
  const float s2 = std::bit_cast<float>((k2 + 127u) << 23);
  return (er * s1) * s2;
}

// Dispatch: fast in f32, exact in f64.
template <typename T>
inline T exp_t(T x) {
  if constexpr (std::is_same_v<T, float>)
    return exp(x);
  else
    return std::exp(x);
}
}  // namespace mw::ops::fast
