// The AVX-512 Adam kernel: Note [Adam math] on 16 fp32 lanes, compiled per function with a target
// attribute and chosen at run time (Note [Adam ISA dispatch]); no -march flag and no __AVX512*__
// macro test, so it is always built. f16 gradients widen with vcvtph2ps, bf16 by a 16-bit left
// shift; both exact. The tail runs the same vector code under a lane mask (AVX512BW/VL give the
// masked 16-bit loads); masked-off lanes compute on zeros and are never stored.
#include <immintrin.h>

#include "optim/cpu/adam_kernels.h"

// GCC 12 reports its own _mm512_undefined_ps() (used inside _mm512_sqrt_ps) as "may be used
// uninitialized" once inlined; that value is a deliberate don't-care, so the warning is silenced
// here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define MW_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

namespace mw::optim::detail {
namespace {

template <DType kGrad>
MW_TARGET_AVX512 inline __m512 load_grad16(const void* grad, int64_t i, __mmask16 k) {
  if constexpr (kGrad == DType::F32) {
    return _mm512_maskz_loadu_ps(k, static_cast<const float*>(grad) + i);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(k, static_cast<const uint16_t*>(grad) + i);
    if constexpr (kGrad == DType::F16) {
      return _mm512_cvtph_ps(h);
    } else {  // bf16: the 16 bits are the top half of the f32
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

struct Consts512 {
  bool use_div, use_l2, use_decoupled;
  __m512 div_scale, l2_wd, neg_lr_wd, beta1, beta2, one_minus_beta1, one_minus_beta2, bc2_sqrt, eps,
      neg_step_size;
};

// 16 lanes of Note [Adam math] starting at element i; lanes outside mask k are neither read nor
// written.
template <DType kGrad>
MW_TARGET_AVX512 inline void adam_vec16(const Consts512& c, float* param, const void* grad,
                                        float* exp_avg, float* exp_avg_sq, int64_t i, __mmask16 k) {
  __m512 g = load_grad16<kGrad>(grad, i, k);
  __m512 p = _mm512_maskz_loadu_ps(k, param + i);
  __m512 m = _mm512_maskz_loadu_ps(k, exp_avg + i);
  __m512 v = _mm512_maskz_loadu_ps(k, exp_avg_sq + i);
  if (c.use_div) g = _mm512_div_ps(g, c.div_scale);
  if (c.use_l2) g = _mm512_fmadd_ps(c.l2_wd, p, g);
  if (c.use_decoupled) p = _mm512_fmadd_ps(c.neg_lr_wd, p, p);
  m = _mm512_fmadd_ps(c.beta1, m, _mm512_mul_ps(c.one_minus_beta1, g));
  v = _mm512_fmadd_ps(c.beta2, v, _mm512_mul_ps(c.one_minus_beta2, _mm512_mul_ps(g, g)));
  const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), c.bc2_sqrt), c.eps);
  p = _mm512_fmadd_ps(c.neg_step_size, _mm512_div_ps(m, denom), p);
  _mm512_mask_storeu_ps(param + i, k, p);
  _mm512_mask_storeu_ps(exp_avg + i, k, m);
  _mm512_mask_storeu_ps(exp_avg_sq + i, k, v);
}

template <DType kGrad>
MW_TARGET_AVX512 void adam_avx512_impl(const AdamStepScalars& s, float* param, const void* grad,
                                       float* exp_avg, float* exp_avg_sq, int64_t numel) {
  Consts512 c;
  c.use_div = s.div_scale > 0.f;
  c.use_l2 = s.l2_weight_decay != 0.f;
  c.use_decoupled = s.neg_lr_weight_decay != 0.f;
  c.div_scale = _mm512_set1_ps(s.div_scale);
  c.l2_wd = _mm512_set1_ps(s.l2_weight_decay);
  c.neg_lr_wd = _mm512_set1_ps(s.neg_lr_weight_decay);
  c.beta1 = _mm512_set1_ps(s.beta1);
  c.beta2 = _mm512_set1_ps(s.beta2);
  c.one_minus_beta1 = _mm512_set1_ps(s.one_minus_beta1);
  c.one_minus_beta2 = _mm512_set1_ps(s.one_minus_beta2);
  c.bc2_sqrt = _mm512_set1_ps(s.bias_correction2_sqrt);
  c.eps = _mm512_set1_ps(s.eps);
  c.neg_step_size = _mm512_set1_ps(s.neg_step_size);

  int64_t i = 0;
  for (; i + 16 <= numel; i += 16) {
    adam_vec16<kGrad>(c, param, grad, exp_avg, exp_avg_sq, i, static_cast<__mmask16>(0xffff));
  }
  if (i < numel) {
    const auto tail_mask = static_cast<__mmask16>((1u << (numel - i)) - 1u);
    adam_vec16<kGrad>(c, param, grad, exp_avg, exp_avg_sq, i, tail_mask);
  }
}

}  // namespace

void adam_kernel_avx512(const AdamStepScalars& s, float* param, const void* grad, DType grad_dtype,
                        float* exp_avg, float* exp_avg_sq, int64_t numel) {
  switch (grad_dtype) {
    case DType::F16:
      return adam_avx512_impl<DType::F16>(s, param, grad, exp_avg, exp_avg_sq, numel);
    case DType::BF16:
      return adam_avx512_impl<DType::BF16>(s, param, grad, exp_avg, exp_avg_sq, numel);
    default: return adam_avx512_impl<DType::F32>(s, param, grad, exp_avg, exp_avg_sq, numel);
  }
}

}  // namespace mw::optim::detail
