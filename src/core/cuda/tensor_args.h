// Helpers of the Tensor-level CUDA wrappers (core/cuda/ops_cuda.cpp, layers_cuda.cpp): device
// checks, kernel views of tensors, typed device pointers.
#pragma once

#include <initializer_list>

#include "core/cuda/kernels.h"
#include "core/tensor.h"

namespace mw::ops::cuda {

// Makes t's device current for the kernels that follow, after checking that t and every tensor
// in `others` (undefined ones skipped) is on that one CUDA device. Throws DeviceError naming op.
void use_device_of(const char* op, const Tensor& t,
                   std::initializer_list<const Tensor*> others = {});

// t's shape and strides for a kernel; ShapeError past cuda_kernels::kMaxRank dims.
cuda_kernels::StridedShape strided_view(const char* op, const Tensor& t);
// t's strides aligned to the broadcast shape `out` (0 where t is broadcast).
cuda_kernels::StridedShape broadcast_view(const char* op, const Tensor& t, const Shape& out);

template <typename T>
const T* cptr(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}
template <typename T>
T* mptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

}  // namespace mw::ops::cuda
