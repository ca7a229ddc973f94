// block_squares_cuda (optim/grad_norm.h): the gradient norm's block partials on the device, in the
// order of Note [Norm order]: one warp per block of kNormBlock elements, lane l summing elements l,
// l + 32, ... (coalesced: a warp reads 32 consecutive floats at a time), then lane 0 adding the 32
// lane sums in lane order. Each square is exact in double, so the result is the CPU's bit for bit.
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "optim/cuda/device_of.cuh"
#include "optim/grad_norm.h"

namespace mw::optim {
namespace {

static_assert(kNormLanes == 32, "the lanes of Note [Norm order] are a warp's");

__global__ void block_squares_kernel(const float* __restrict__ x, int64_t n, int64_t blocks,
                                     double* __restrict__ partials) {
  const int lane = static_cast<int>(threadIdx.x) % kNormLanes;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kNormLanes;
  // The loop bound is the same for every lane of a warp, so the shuffles below see all 32.
  for (int64_t b = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kNormLanes;
       b < blocks; b += warps) {
    const int64_t end = (b + 1) * kNormBlock < n ? (b + 1) * kNormBlock : n;
    double acc = 0;
    for (int64_t i = b * kNormBlock + lane; i < end; i += kNormLanes) {
      const double v = x[i];
      acc = __dadd_rn(acc, __dmul_rn(v, v));
    }
    double sum = 0;
    for (int l = 0; l < kNormLanes; ++l) sum = __dadd_rn(sum, __shfl_sync(0xffffffffu, acc, l));
    if (lane == 0) partials[b] = sum;
  }
}

}  // namespace

void block_squares_cuda(const float* x, int64_t n, double* partials, void* stream) {
  MW_CHECK_T(InvalidArgument, n >= 0 && (n == 0 || (x != nullptr && partials != nullptr)),
             "block_squares_cuda: expected n >= 0 and device pointers, got n = ", n);
  if (n == 0) return;
  use_device_holding(x, "block_squares_cuda");
  const int64_t blocks = (n + kNormBlock - 1) / kNormBlock;
  constexpr int kThreads = 256;  // 8 warps, 8 norm blocks per thread block
  constexpr int64_t kWarpsPerBlock = kThreads / kNormLanes;
  const int64_t grid = std::min<int64_t>((blocks + kWarpsPerBlock - 1) / kWarpsPerBlock, 65535);
  block_squares_kernel<<<static_cast<unsigned>(grid), kThreads, 0,
                         static_cast<cudaStream_t>(stream)>>>(x, n, blocks, partials);
  const cudaError_t err = cudaGetLastError();
  MW_CHECK_T(DeviceError, err == cudaSuccess, "block_squares_cuda: kernel launch failed for ", n,
             " elements: ", cudaGetErrorString(err));
}

}  // namespace mw::optim
