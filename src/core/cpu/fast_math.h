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

namespace mw::ops {

// Note [Wider versions of f32 loops]: the library is compiled for the x86-64 baseline (SSE2: four
// f32 lanes). The elementwise loops that call exp (GELU, cross-entropy, the attention's softmax)
// also have AVX2 (eight lanes) and AVX-512 (sixteen) versions, compiled from the same body with a
// target attribute (MW_F32_VERSIONS) and chosen per call by f32_isa(): the widest this CPU runs,
// or the one MW_F32_ISA=baseline|avx2|avx512 names (as MW_CONVERT_ISA and MW_ADAM_ISA do for
// theirs), so every version this CPU can run is tested on it (tests/core/f32_versions_test.cpp).
// Every version runs the same IEEE operations lane by lane and nothing is contracted (the
// library is built with -ffp-contract=off: AVX-512F has FMAs of its own, and contracting them
// made the AVX-512 version differ), so the results are bitwise those of the baseline (sums keep
// their explicit lanes, whatever the width). A body's helpers must be
// inlined into each version (MW_F32_BODY), or the version calls their baseline copy: the test
// F32Versions.EveryWideVersionRunsItsOwnCode reads the machine code for such calls. Measured on a
// Zen 4 (GPT-2 small B4 T128, cross-entropy forward + backward per step): 29.3 ms with GCC's
// target_clones before (its AVX2 forward was a jump to the baseline code), 18.7 with AVX2 bodies,
// 13.0 with AVX-512.
enum class F32Isa : uint8_t { Baseline, AVX2, AVX512 };
const char* f32_isa_name(F32Isa isa);
bool f32_isa_supported(F32Isa isa);
// The version the f32 loops run: MW_F32_ISA if set (InvalidArgument if unknown or unsupported),
// else the widest this CPU supports. Read once; set_f32_isa changes it (tests and benchmarks).
F32Isa f32_isa();
void set_f32_isa(F32Isa isa);

#define MW_F32_BODY [[gnu::always_inline]] inline
// Defines `ret name params` that runs name##_body args in the version f32_isa() picks.
#define MW_F32_VERSIONS(ret, name, params, args)                                                \
  [[gnu::noinline, gnu::target("avx512f")]] ret name##_on_avx512 params {                       \
    return name##_body args;                                                                    \
  }                                                                                             \
  [[gnu::noinline, gnu::target("avx2")]] ret name##_on_avx2 params { return name##_body args; } \
  [[gnu::noinline]] ret name##_on_baseline params { return name##_body args; }                  \
  ret name params {                                                                             \
    switch (::mw::ops::f32_isa()) {                                                             \
      case ::mw::ops::F32Isa::AVX512: return name##_on_avx512 args;                             \
      case ::mw::ops::F32Isa::AVX2: return name##_on_avx2 args;                                 \
      default: return name##_on_baseline args;                                                  \
    }                                                                                           \
  }

}  // namespace mw::ops

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
