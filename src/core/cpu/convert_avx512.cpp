// The AVX-512 (F + BW) body of the f32 <-> bf16/f16 conversions (Note [Low-precision
// conversions], convert.h): the AVX2 algorithm on 16 lanes, compiled per function with a target
// attribute and chosen at run time only on CPUs that report avx512f and avx512bw.
#include <immintrin.h>

#include "core/convert.h"

// GCC 12's AVX-512 intrinsics read an "undefined" register it then warns about (a known false
// positive in avx512fintrin.h, as in optim/cpu/adam_avx512.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define MW_TARGET_AVX512 __attribute__((target("avx512f,avx512bw")))

namespace mw::detail {

namespace {
MW_TARGET_AVX512 inline __m256i f32x16_to_bf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb);
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
  const __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(magnitude, _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet));
}
}  // namespace

MW_TARGET_AVX512 int64_t convert_avx512(DType from, const void* src, DType to, void* dst,
                                        int64_t numel) {
  const int64_t n = numel / 16 * 16;
  if (from == DType::F32) {
    const float* s = static_cast<const float*>(src);
    __m256i* d = static_cast<__m256i*>(dst);
    if (to == DType::BF16) {
      for (int64_t i = 0; i < n; i += 16)
        _mm256_storeu_si256(d + i / 16, f32x16_to_bf16(_mm512_loadu_ps(s + i)));
    } else {
      for (int64_t i = 0; i < n; i += 16)
        _mm256_storeu_si256(d + i / 16,
                            _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    }
    return n;
  }
  const __m256i* s = static_cast<const __m256i*>(src);
  float* d = static_cast<float*>(dst);
  if (from == DType::BF16) {
    for (int64_t i = 0; i < n; i += 16) {
      const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(s + i / 16));
      _mm512_storeu_ps(d + i, _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
    }
  } else {
    for (int64_t i = 0; i < n; i += 16)
      _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256(s + i / 16)));
  }
  return n;
}

}  // namespace mw::detail
