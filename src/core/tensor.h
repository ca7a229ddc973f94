// Tensor: a view (storage, offset, shape, strides, dtype) onto a shared Storage.
//
// A Tensor is a handle: copies share one TensorImpl, so attaching autograd state (grad, grad_fn) to
// one copy is seen by all. Views (view, transpose, permute, narrow) make a new TensorImpl onto the
// same Storage. Offsets and strides are in elements; every size is int64_t.
//
// core knows nothing of autograd: TensorImpl holds an opaque AutogradMetaBase that autograd/ fills.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/storage.h"

namespace mw {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);

struct AutogradMetaBase {
  virtual ~AutogradMetaBase() = default;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  Shape strides;  // in elements
  DType dtype = DType::F32;
  std::shared_ptr<AutogradMetaBase> autograd;  // owned by autograd/, null for plain tensors
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // --- factories (contiguous) ---
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32,
                     Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu()) {
    return full(shape, 1.0, dtype, device);
  }
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            Device device = Device::cpu());
  // A view of shape/strides onto an existing storage (used by chunks and views).
  static Tensor from_storage(std::shared_ptr<Storage> storage, int64_t offset, const Shape& shape,
                             const Shape& strides, DType dtype);

  // --- metadata ---
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  const Shape& strides() const { return impl_->strides; }
  int64_t dim() const { return static_cast<int64_t>(impl_->shape.size()); }
  int64_t size(int64_t d) const { return impl_->shape[wrap_dim(d)]; }
  int64_t stride(int64_t d) const { return impl_->strides[wrap_dim(d)]; }
  int64_t numel() const { return shape_numel(impl_->shape); }
  int64_t nbytes() const { return numel() * dtype_size(impl_->dtype); }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->storage->device(); }
  int64_t offset() const { return impl_->offset; }
  bool is_contiguous() const;
  int64_t wrap_dim(int64_t d) const;
  std::string desc() const;  // "f32[4, 128] on cpu"

  // --- data access (cpu/sim only; checks dtype) ---
  template <typename T>
  T* data() const {
    MW_CHECK_T(ShapeError, dtype_of<T>::value == impl_->dtype, "tensor ", desc(), " accessed as ",
               dtype_name(dtype_of<T>::value));
    return static_cast<T*>(raw_data());
  }
  void* raw_data() const;
  const std::shared_ptr<Storage>& storage() const { return impl_->storage; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // --- views: no copy, same storage ---
  Tensor view(const Shape& shape) const;     // contiguous only; one -1 allowed
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a copy
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor detach() const;  // same storage and view, no autograd state

  // --- copies ---
  Tensor contiguous() const;  // *this when already contiguous
  Tensor clone() const;       // always a fresh contiguous copy
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  void copy_(const Tensor& src);  // same shape, any strides/dtypes/devices; bumps the version
  void fill_(double value);
  void zero_() { fill_(0.0); }
  void bump_version() const { impl_->storage->bump_version(); }

  template <typename T>
  std::vector<T> to_vector() const;
  double item() const;  // single-element tensors

  AutogradMetaBase* autograd_meta() const { return impl_->autograd.get(); }
  void set_autograd_meta(std::shared_ptr<AutogradMetaBase> meta) const {
    impl_->autograd = std::move(meta);
  }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// Throws ShapeError unless a and b have equal shapes; `op` names the caller.
void check_same_shape(const char* op, const Tensor& a, const Tensor& b);
void check_float(const char* op, const Tensor& t);

// Calls f.template operator()<T>() with T = float or double according to dtype.
template <typename F>
decltype(auto) dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F32: return f.template operator()<float>();
    case DType::F64: return f.template operator()<double>();
    default: throw ShapeError(str(op, ": expected an f32 or f64 tensor, got ", dtype_name(dtype)));
  }
}

}  // namespace mw
