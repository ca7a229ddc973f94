// The CUDA fused Adam kernel (optim/adam_cuda.h): one thread per element, grid-stride, computing
// the shared adam_element() of Note [Adam math]. nvcc's defaults (-prec-div=true, -prec-sqrt=true,
// no --use_fast_math) keep division and sqrt correctly rounded, and every mul+add in the math is an
// explicit fmaf, so the device result equals the CPU scalar kernel bit for bit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "optim/adam_cuda.h"
#include "optim/cuda/device_of.cuh"

namespace mw::optim {
namespace {

template <typename GradT>
__device__ inline float grad_to_float(GradT g);
template <>
__device__ inline float grad_to_float<float>(float g) {
  return g;
}
template <>
__device__ inline float grad_to_float<__half>(__half g) {
  return __half2float(g);
}
template <>
__device__ inline float grad_to_float<__nv_bfloat16>(__nv_bfloat16 g) {
  return __bfloat162float(g);
}

template <typename GradT>
__global__ void adam_kernel(AdamStepScalars s, float* __restrict__ param,
                            const GradT* __restrict__ grad, float* __restrict__ exp_avg,
                            float* __restrict__ exp_avg_sq, int64_t numel) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel;
       i += stride) {
    float p = param[i], m = exp_avg[i], v = exp_avg_sq[i];
    adam_element(s, grad_to_float<GradT>(grad[i]), p, m, v);
    param[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
  }
}

template <typename GradT>
void launch(const AdamStepScalars& s, float* param, const void* grad, float* exp_avg,
            float* exp_avg_sq, int64_t numel, cudaStream_t stream) {
  constexpr int kThreads = 256;
  // Enough blocks to fill any current GPU several times over; the grid-stride loop covers the rest.
  const int64_t blocks = std::min<int64_t>((numel + kThreads - 1) / kThreads, int64_t{65535} * 8);
  adam_kernel<GradT><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      s, param, static_cast<const GradT*>(grad), exp_avg, exp_avg_sq, numel);
}

}  // namespace

void adam_update_cuda(const AdamStepScalars& scalars, float* param, const void* grad,
                      DType grad_dtype, float* exp_avg, float* exp_avg_sq, int64_t numel,
                      void* stream) {
  MW_CHECK_T(InvalidArgument, numel >= 0, "adam_update_cuda: numel must be >= 0; got ", numel);
  if (numel == 0) return;
  MW_CHECK_T(InvalidArgument,
             param != nullptr && grad != nullptr && exp_avg != nullptr && exp_avg_sq != nullptr,
             "adam_update_cuda: null device pointer for ", numel, " elements");
  use_device_holding(param, "adam_update_cuda");
  auto s = static_cast<cudaStream_t>(stream);
  switch (grad_dtype) {
    case DType::F32: launch<float>(scalars, param, grad, exp_avg, exp_avg_sq, numel, s); break;
    case DType::F16: launch<__half>(scalars, param, grad, exp_avg, exp_avg_sq, numel, s); break;
    case DType::BF16:
      launch<__nv_bfloat16>(scalars, param, grad, exp_avg, exp_avg_sq, numel, s);
      break;
    default:
      throw InvalidArgument(str("adam_update_cuda: gradients must be f32, f16 or bf16; got ",
                                dtype_name(grad_dtype), ". Cast the gradient first."));
  }
  const cudaError_t err = cudaGetLastError();
  MW_CHECK_T(DeviceError, err == cudaSuccess, "adam_update_cuda: kernel launch failed for ", numel,
             " elements: ", cudaGetErrorString(err));
}

}  // namespace mw::optim
