// check_cuda: turns a failed CUDA runtime call into mw::DeviceError. Used by every file in
// core/cuda, so that each message names the call and what it was doing, the CUDA error, and what
// to do about it.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

namespace mw {

// Unless err is cudaSuccess, throws DeviceError
//   "<what...> failed: <CUDA error text> (<code>); check nvidia-smi and CUDA_VISIBLE_DEVICES, ..."
// The message pieces are only formatted on failure. The error state of the failed call is cleared
// (cudaGetLastError), so the next call does not report it again.
template <typename... Args>
void check_cuda(cudaError_t err, const Args&... what) {
  if (err == cudaSuccess) [[likely]]
    return;
  cudaGetLastError();
  throw DeviceError(str(what..., " failed: ", cudaGetErrorString(err), " (", static_cast<int>(err),
                        "); check that a GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES) and "
                        "that the driver supports this CUDA runtime, or use --device cpu or sim"));
}

}  // namespace mw
