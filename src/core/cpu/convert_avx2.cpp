// The AVX2 + F16C body of the f32 <-> bf16/f16 conversions (Note [Low-precision conversions],
// convert.h), compiled per function with a target attribute and chosen at run time.
#include <immintrin.h>

#include "core/convert.h"

#define MW_TARGET_AVX2 __attribute__((target("avx2,f16c")))

namespace mw::detail {

namespace {
// Eight f32 -> eight bf16 with ties to even; NaN -> its top 16 bits with the quiet bit set.
MW_TARGET_AVX2 inline __m128i f32x8_to_bf16(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb);
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
  const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  r = _mm256_blendv_epi8(r, quiet, is_nan);
  // Every lane is <= 0xffff, so the unsigned saturating pack keeps it exactly.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}
}  // namespace

MW_TARGET_AVX2 int64_t convert_avx2(DType from, const void* src, DType to, void* dst,
                                    int64_t numel) {
  const int64_t n = numel / 8 * 8;
  if (from == DType::F32) {
    const float* s = static_cast<const float*>(src);
    __m128i* d = static_cast<__m128i*>(dst);
    if (to == DType::BF16) {
      for (int64_t i = 0; i < n; i += 8)
        _mm_storeu_si128(d + i / 8, f32x8_to_bf16(_mm256_loadu_ps(s + i)));
    } else {
      for (int64_t i = 0; i < n; i += 8)
        _mm_storeu_si128(d + i / 8,
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    }
    return n;
  }
  const __m128i* s = static_cast<const __m128i*>(src);
  float* d = static_cast<float*>(dst);
  if (from == DType::BF16) {
    for (int64_t i = 0; i < n; i += 8) {
      const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(s + i / 8));
      _mm256_storeu_ps(d + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
    }
  } else {
    for (int64_t i = 0; i < n; i += 8)
      _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(s + i / 8)));
  }
  return n;
}

}  // namespace mw::detail
