// Device helpers shared by the core/cuda/*.cu kernels: launch geometry, precise math overloads
// for float and double, strided indexing and a deterministic block reduction.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda/kernels.h"

namespace mw::ops::cuda_kernels {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements: enough to fill any current GPU, never zero.
inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, 65535 * 8)));
}

// Blocks for a loop over rows, one block per row at a time (the kernels stride by gridDim.x):
// one per row up to 2^20, never zero.
inline unsigned row_grid(int64_t rows) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(rows, int64_t{1} << 20)));
}

#define MW_GRID_STRIDE(i, n)                                                             \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Correctly rounded library math (no --use_fast_math), overloaded so templates pick the precision.
__device__ inline float dev_exp(float x) { return expf(x); }
__device__ inline double dev_exp(double x) { return exp(x); }
__device__ inline float dev_log(float x) { return logf(x); }
__device__ inline double dev_log(double x) { return log(x); }
__device__ inline float dev_sqrt(float x) { return sqrtf(x); }
__device__ inline double dev_sqrt(double x) { return sqrt(x); }
__device__ inline float dev_tanh(float x) { return tanhf(x); }
__device__ inline double dev_tanh(double x) { return tanh(x); }

// Element offset of row-major linear index `linear` in a strided view.
__device__ inline int64_t strided_offset(int64_t linear, const StridedShape& v) {
  int64_t off = 0;
  for (int d = v.rank - 1; d >= 0; --d) {
    const int64_t idx = linear % v.shape[d];
    linear /= v.shape[d];
    off += idx * v.strides[d];
  }
  return off;
}

// Sum (or max, with Max = true) of one value per thread over a block of blockDim.x threads (a
// multiple of 32, at most 1024). The combination order is fixed by thread index, so the result is
// deterministic. Every thread gets the result. `shared` holds 32 elements.
template <typename T, bool Max = false>
__device__ T block_reduce(T v, T* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = 16; o > 0; o /= 2) {
    const T other = __shfl_down_sync(0xffffffffu, v, o);
    v = Max ? (other > v ? other : v) : v + other;
  }
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x) / 32;
  if (warp == 0) {
    v = lane < warps ? shared[lane] : (Max ? shared[0] : T(0));
    for (int o = 16; o > 0; o /= 2) {
      const T other = __shfl_down_sync(0xffffffffu, v, o);
      v = Max ? (other > v ? other : v) : v + other;
    }
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  return shared[0];
}

}  // namespace mw::ops::cuda_kernels
