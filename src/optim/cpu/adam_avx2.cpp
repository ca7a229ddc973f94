// The AVX2 + FMA + F16C Adam kernel: Note [Adam math] on 8 fp32 lanes, compiled per function with
// a target attribute and chosen at run time (Note [Adam ISA dispatch]); no -march flag needed.
// f16 gradients widen with F16C (vcvtph2ps), bf16 by a 16-bit left shift; both are exact. The tail
// of fewer than 8 elements runs adam_element(), which is the same correctly rounded arithmetic.
#include <immintrin.h>

#include "optim/cpu/adam_kernels.h"

#define MW_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace mw::optim::detail {
namespace {

template <DType kGrad>
MW_TARGET_AVX2 inline __m256 load_grad8(const void* grad, int64_t i) {
  if constexpr (kGrad == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(grad) + i);
  } else {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(grad) + i));
    if constexpr (kGrad == DType::F16) {
      return _mm256_cvtph_ps(h);
    } else {  // bf16: the 16 bits are the top half of the f32
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

template <DType kGrad>
MW_TARGET_AVX2 void adam_avx2_impl(const AdamStepScalars& s, float* param, const void* grad,
                                   float* exp_avg, float* exp_avg_sq, int64_t numel) {
  const bool use_div = s.div_scale > 0.f;
  const bool use_l2 = s.l2_weight_decay != 0.f;
  const bool use_decoupled = s.neg_lr_weight_decay != 0.f;
  const __m256 div_scale = _mm256_set1_ps(s.div_scale);
  const __m256 l2_wd = _mm256_set1_ps(s.l2_weight_decay);
  const __m256 neg_lr_wd = _mm256_set1_ps(s.neg_lr_weight_decay);
  const __m256 beta1 = _mm256_set1_ps(s.beta1);
  const __m256 beta2 = _mm256_set1_ps(s.beta2);
  const __m256 one_minus_beta1 = _mm256_set1_ps(s.one_minus_beta1);
  const __m256 one_minus_beta2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 bc2_sqrt = _mm256_set1_ps(s.bias_correction2_sqrt);
  const __m256 eps = _mm256_set1_ps(s.eps);
  const __m256 neg_step_size = _mm256_set1_ps(s.neg_step_size);

  int64_t i = 0;
  for (; i + 8 <= numel; i += 8) {
    __m256 g = load_grad8<kGrad>(grad, i);
    __m256 p = _mm256_loadu_ps(param + i);
    __m256 m = _mm256_loadu_ps(exp_avg + i);
    __m256 v = _mm256_loadu_ps(exp_avg_sq + i);
    if (use_div) g = _mm256_div_ps(g, div_scale);
    if (use_l2) g = _mm256_fmadd_ps(l2_wd, p, g);
    if (use_decoupled) p = _mm256_fmadd_ps(neg_lr_wd, p, p);
    m = _mm256_fmadd_ps(beta1, m, _mm256_mul_ps(one_minus_beta1, g));
    v = _mm256_fmadd_ps(beta2, v, _mm256_mul_ps(one_minus_beta2, _mm256_mul_ps(g, g)));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), bc2_sqrt), eps);
    p = _mm256_fmadd_ps(neg_step_size, _mm256_div_ps(m, denom), p);
    _mm256_storeu_ps(param + i, p);
    _mm256_storeu_ps(exp_avg + i, m);
    _mm256_storeu_ps(exp_avg_sq + i, v);
  }
  for (; i < numel; ++i) {
    adam_element(s, load_grad_element(grad, kGrad, i), param[i], exp_avg[i], exp_avg_sq[i]);
  }
}

}  // namespace

void adam_kernel_avx2(const AdamStepScalars& s, float* param, const void* grad, DType grad_dtype,
                      float* exp_avg, float* exp_avg_sq, int64_t numel) {
  switch (grad_dtype) {
    case DType::F16: return adam_avx2_impl<DType::F16>(s, param, grad, exp_avg, exp_avg_sq, numel);
    case DType::BF16:
      return adam_avx2_impl<DType::BF16>(s, param, grad, exp_avg, exp_avg_sq, numel);
    default: return adam_avx2_impl<DType::F32>(s, param, grad, exp_avg, exp_avg_sq, numel);
  }
}

}  // namespace mw::optim::detail
