// Internal to mw_optim: the per-ISA Adam kernels behind adam_update() (optim/adam_cpu.h).
// Arguments are already validated: numel >= 0, pointers valid, grad_dtype one of F32/F16/BF16, and
// the CPU supports the kernel's ISA. Each computes Note [Adam math] exactly.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "optim/adam_math.h"

namespace mw::optim::detail {

// Reads gradient element i of an f32/f16/bf16 array as f32 (all three widen exactly).
inline float load_grad_element(const void* grad, DType grad_dtype, int64_t i) {
  switch (grad_dtype) {
    case DType::F16: return half_to_float(static_cast<const uint16_t*>(grad)[i]);
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(grad)[i]);
    default: return static_cast<const float*>(grad)[i];
  }
}

void adam_kernel_scalar(const AdamStepScalars& s, float* param, const void* grad, DType grad_dtype,
                        float* exp_avg, float* exp_avg_sq, int64_t numel);
void adam_kernel_avx2(const AdamStepScalars& s, float* param, const void* grad, DType grad_dtype,
                      float* exp_avg, float* exp_avg_sq, int64_t numel);
void adam_kernel_avx512(const AdamStepScalars& s, float* param, const void* grad, DType grad_dtype,
                        float* exp_avg, float* exp_avg_sq, int64_t numel);

}  // namespace mw::optim::detail
