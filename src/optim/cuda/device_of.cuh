// The optimizer kernels' launches run on the device that holds their data.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

namespace mw::optim {

// Makes the device holding `p` (device memory) current on this thread, so that a launch on a null
// stream goes to that device's legacy stream: the thread's current device may be another GPU's
// (each op of core/cuda sets its own; these launches came from the optimizer with whatever was
// current, which only one GPU per process made safe).
inline void use_device_holding(const void* p, const char* what) {
  cudaPointerAttributes a{};
  const cudaError_t err = cudaPointerGetAttributes(&a, p);
  MW_CHECK_T(DeviceError, err == cudaSuccess && a.type == cudaMemoryTypeDevice, what,
             ": expected device memory, ",
             err == cudaSuccess ? "got memory of another kind" : cudaGetErrorString(err));
  const cudaError_t set = cudaSetDevice(a.device);
  MW_CHECK_T(DeviceError, set == cudaSuccess, what, ": cudaSetDevice(", a.device,
             ") failed: ", cudaGetErrorString(set));
}

}  // namespace mw::optim
