// The CUDA fused Adam kernel: Note [Adam math] (optim/adam_math.h) on device memory, one thread per
// element with a grid-stride loop, fp32 parameters and states with f32, f16 or bf16 gradients.
// The element function is the very adam_element() the CPU kernels use, compiled for the device.
//
// Built from optim/cuda/adam_cuda.cu when CUDA is on; otherwise optim/nocuda/adam_cuda_stub.cpp
// throws DeviceError, so callers need no #ifdef.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "optim/adam_math.h"

namespace mw::optim {

// Enqueues one Adam step on `stream` (a cudaStream_t passed as void*; nullptr = the legacy default
// stream) and returns without synchronising:
//   param[numel], exp_avg[numel], exp_avg_sq[numel]: device fp32, updated in place;
//   grad[numel]: device grad_dtype (F32, F16 or BF16).
// Throws InvalidArgument for a bad dtype/numel/pointer, DeviceError when the launch fails or the
// build has no CUDA.
void adam_update_cuda(const AdamStepScalars& scalars, float* param, const void* grad,
                      DType grad_dtype, float* exp_avg, float* exp_avg_sq, int64_t numel,
                      void* stream);

}  // namespace mw::optim
