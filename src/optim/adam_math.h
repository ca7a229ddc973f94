// The Adam update, defined once. Every Adam kernel in memwall (scalar, AVX2, AVX-512, CUDA)
// computes the function written in adam_element() below, with the same operations in the same
// order.
//
// Note [Adam math]: per element, in fp32, with the per-step scalars of AdamStepScalars:
//   g = grad                                    (f32, or f16/bf16 widened exactly to f32)
//   if div_scale > 0:  g = g / div_scale        (loss scale and clipping folded into one divisor)
//   L2 mode:           g = fma(wd, p, g)        (g += wd * p)
//   AdamW mode:        p = fma(-lr*wd, p, p)    (p -= lr * wd * p, decoupled decay)
//   m = fma(b1, m, (1-b1) * g)
//   v = fma(b2, v, (1-b2) * (g * g))
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps      (eps added after the bias-corrected root)
//   p = fma(-(lr / (1 - b1^t)), m / denom, p)
// With bias_correction off both corrections are 1. Every step is an IEEE correctly rounded
// operation (fma, +, *, /, sqrt; no rsqrt or reciprocal approximations), and every mul+add that
// could be fused is an explicit fma. So compilers have nothing left to contract, and the SIMD and
// CUDA kernels give the scalar kernel's result bit for bit (tests/optim checks this).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/error.h"

#if defined(__CUDACC__)
#define MW_ADAM_HD __host__ __device__
#else
#define MW_ADAM_HD
#endif

namespace mw::optim {

// The user-facing hyperparameters, with ColossalAI HybridAdam / torch.optim.AdamW defaults.
struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.f;
  bool adamw_mode = true;       // true: decoupled decay (AdamW); false: L2 added to the gradient
  bool bias_correction = true;  // divide by (1 - beta^t)
};

// Everything a kernel needs for one step, derived once per step by make_adam_step_scalars() so
// that every kernel and every chunk of a step uses identical float constants.
struct AdamStepScalars {
  int64_t step = 1;               // t, 1-based
  float beta1 = 0.9f;             // b1
  float beta2 = 0.999f;           // b2
  float one_minus_beta1 = 0.1f;   // 1 - b1
  float one_minus_beta2 = 1e-3f;  // 1 - b2
  float eps = 1e-8f;
  float neg_step_size = -1e-3f;       // -(lr / (1 - b1^t)), or -lr without bias correction
  float bias_correction2_sqrt = 1.f;  // sqrt(1 - b2^t), or 1 without bias correction
  float l2_weight_decay = 0.f;        // wd in L2 mode, else 0
  float neg_lr_weight_decay = 0.f;    // -(lr * wd) in AdamW mode, else 0
  float div_scale = -1.f;             // > 0: gradients are divided by it; <= 0: unused
};

// Derives the per-step scalars. The powers and quotients are computed in double and rounded once
// to float. Throws InvalidArgument for step < 1 or hyperparameters outside their domain.
inline AdamStepScalars make_adam_step_scalars(const AdamHyper& h, int64_t step, float div_scale) {
  MW_CHECK_T(InvalidArgument, step >= 1,
             "Adam step must be >= 1 (1-based, used in 1 - beta^t); got ", step,
             ". Increment the step counter before the first update.");
  MW_CHECK_T(InvalidArgument, h.beta1 >= 0.f && h.beta1 < 1.f && h.beta2 >= 0.f && h.beta2 < 1.f,
             "Adam betas must lie in [0, 1); got (", h.beta1, ", ", h.beta2, ").");
  MW_CHECK_T(InvalidArgument, h.lr >= 0.f && h.eps >= 0.f && h.weight_decay >= 0.f,
             "Adam lr, eps and weight_decay must be >= 0; got lr ", h.lr, ", eps ", h.eps,
             ", weight_decay ", h.weight_decay, ".");
  AdamStepScalars s;
  s.step = step;
  s.beta1 = h.beta1;
  s.beta2 = h.beta2;
  s.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(h.beta1));
  s.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(h.beta2));
  s.eps = h.eps;
  double bc1 = 1.0, bc2 = 1.0;
  if (h.bias_correction) {
    bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(step));
    bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(step));
    MW_CHECK_T(InvalidArgument, bc1 > 0.0 && bc2 > 0.0,
               "Adam bias correction 1 - beta^t is zero (betas ", h.beta1, ", ", h.beta2, ", step ",
               step, "); use betas > 0 or turn bias_correction off.");
  }
  s.neg_step_size = static_cast<float>(-static_cast<double>(h.lr) / bc1);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bc2));
  if (h.adamw_mode) {
    s.neg_lr_weight_decay = static_cast<float>(-static_cast<double>(h.lr) * h.weight_decay);
  } else {
    s.l2_weight_decay = h.weight_decay;
  }
  s.div_scale = div_scale;
  return s;
}

// One element of Note [Adam math]. p, m, v are updated in place. This is the scalar reference;
// the SIMD kernels mirror it line by line.
MW_ADAM_HD inline void adam_element(const AdamStepScalars& s, float g, float& p, float& m,
                                    float& v) {
  if (s.div_scale > 0.f) g = g / s.div_scale;
  if (s.l2_weight_decay != 0.f) g = fmaf(s.l2_weight_decay, p, g);
  if (s.neg_lr_weight_decay != 0.f) p = fmaf(s.neg_lr_weight_decay, p, p);
  m = fmaf(s.beta1, m, s.one_minus_beta1 * g);
  v = fmaf(s.beta2, v, s.one_minus_beta2 * (g * g));
  const float denom = sqrtf(v) / s.bias_correction2_sqrt + s.eps;
  p = fmaf(s.neg_step_size, m / denom, p);
}

}  // namespace mw::optim
