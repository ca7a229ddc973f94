// Branch-free exp and tanh for f32 kernels, written so the compiler vectorises the loops that call
// them (glibc's expf/tanhf are scalar calls; GELU and cross-entropy spend most of their time
// there).
//
// fast_exp: exp(x) = 2^k * e^r with k = round(x / ln 2), r = x - k ln 2 split in two parts
// (Cody-Waite), e^r by a degree-6 polynomial on |r| <= ln2/2. Relative error below 2e-7 (about 2
// f32 ulp) for x in [-87, 88]; inputs are clamped to that range (exp underflows to ~1e-38 there).
// fast_tanh: 1 - 2 / (e^{2|x|} + 1) with the sign restored; absolute error below 2e-7, which is
// what GELU needs (its output is 0.5 x (1 + tanh)).
//
// f64 callers use std::exp / std::tanh: the gradient checks need full double precision.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace mw::ops::fast {

inline float exp(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  // Round to nearest by the 1.5 * 2^23 trick (plain SSE2; nearbyint would be a libm call).
  const float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - k * 0.693145751953125f) - k * 1.428606765330187045e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

inline float tanh(float x) {
  const float ax = std::fabs(x) > 10.0f ? 10.0f : std::fabs(x);  // tanh(10) rounds to 1 in f32
  const float t = 1.0f - 2.0f / (exp(2.0f * ax) + 1.0f);
  return std::copysign(t, x);
}

// Dispatch: fast in f32, exact in f64.
template <typename T>
inline T exp_t(T x) {
  if constexpr (std::is_same_v<T, float>)
    return exp(x);
  else
    return std::exp(x);
}
template <typename T>
inline T tanh_t(T x) {
  if constexpr (std::is_same_v<T, float>)
    return tanh(x);
  else
    return std::tanh(x);
}

}  // namespace mw::ops::fast
