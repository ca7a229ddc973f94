// Tensor factories, views and copies.
#include "core/tensor.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <sstream>

#include "core/convert.h"
#include "core/ops_cuda.h"
#include "core/parallel.h"

namespace mw {

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    MW_CHECK_T(ShapeError, s >= 0, "shape ", shape_str(shape), " has a negative size");
    // {2^32, 2^32} wrapped to 0 elements, a tensor of that shape with no bytes
    MW_CHECK_T(ShapeError, s == 0 || n <= std::numeric_limits<int64_t>::max() / s, "shape ",
               shape_str(shape), " has more elements than an int64_t counts");
    n *= s;
  }
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, int64_t offset, const Shape& shape,
                            const Shape& strides, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->offset = offset;
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t s : shape)
    MW_CHECK_T(ShapeError, s >= 0, "empty: negative dimension in shape ", shape_str(shape));
  const int64_t numel = shape_numel(shape);
  MW_CHECK_T(ShapeError, numel <= std::numeric_limits<int64_t>::max() / dtype_size(dtype),
             "empty: ", shape_str(shape), " of ", dtype_name(dtype),
             " has more bytes than an int64_t counts");
  auto storage = Storage::create(numel * dtype_size(dtype), device);
  return from_storage(std::move(storage), 0, shape, contiguous_strides(shape), dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(0.0);
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  MW_CHECK_T(ShapeError, static_cast<int64_t>(values.size()) == shape_numel(shape),
             "from_vector: ", values.size(), " values do not fill shape ", shape_str(shape));
  Tensor t = empty(shape, dtype_of<T>::value, device);
  copy_bytes(t.raw_data(), device, values.data(), Device::cpu(), t.nbytes());
  return t;
}
template Tensor Tensor::from_vector(const std::vector<float>&, const Shape&, Device);
template Tensor Tensor::from_vector(const std::vector<double>&, const Shape&, Device);
template Tensor Tensor::from_vector(const std::vector<int32_t>&, const Shape&, Device);
template Tensor Tensor::from_vector(const std::vector<int64_t>&, const Shape&, Device);
template Tensor Tensor::from_vector(const std::vector<uint16_t>&, const Shape&, Device);

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->shape[i];
  }
  return true;
}

int64_t Tensor::wrap_dim(int64_t d) const {
  int64_t n = dim();
  int64_t w = d < 0 ? d + n : d;
  MW_CHECK_T(ShapeError, w >= 0 && w < n, "dimension ", d, " out of range for ", desc());
  return w;
}

std::string Tensor::desc() const {
  if (!impl_) return "undefined tensor";
  return str(dtype_name(dtype()), shape_str(shape()), " on ", device().str());
}

void* Tensor::raw_data() const {
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * dtype_size(impl_->dtype);
}

Tensor Tensor::view(const Shape& shape_in) const {
  Shape shape = shape_in;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      MW_CHECK_T(ShapeError, infer < 0, "view: more than one -1 in ", shape_str(shape_in));
      infer = static_cast<int64_t>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    MW_CHECK_T(ShapeError, known > 0 && numel() % known == 0, "view: cannot infer -1 in ",
               shape_str(shape_in), " for ", desc());
    shape[infer] = numel() / known;
  }
  MW_CHECK_T(ShapeError, shape_numel(shape) == numel(), "view: shape ", shape_str(shape_in),
             " does not match ", desc(), " (", numel(), " elements)");
  MW_CHECK_T(ShapeError, is_contiguous(), "view: ", desc(),
             " is not contiguous; call reshape() or contiguous() first");
  return from_storage(impl_->storage, impl_->offset, shape, contiguous_strides(shape), dtype());
}

Tensor Tensor::reshape(const Shape& shape) const {
  return is_contiguous() ? view(shape) : contiguous().view(shape);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  std::vector<int64_t> dims(dim());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[wrap_dim(d0)], dims[wrap_dim(d1)]);
  return permute(dims);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  MW_CHECK_T(ShapeError, static_cast<int64_t>(dims.size()) == dim(), "permute: ", dims.size(),
             " dims given for ", desc());
  Shape shape(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i]);
    MW_CHECK_T(ShapeError, !seen[d], "permute: dimension ", d, " repeated");
    seen[d] = true;
    shape[i] = impl_->shape[d];
    strides[i] = impl_->strides[d];
  }
  return from_storage(impl_->storage, impl_->offset, shape, strides, dtype());
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_dim(d);
  MW_CHECK_T(ShapeError, start >= 0 && length >= 0 && start + length <= impl_->shape[d],
             "narrow: range [", start, ", ", start + length, ") outside dimension ", d, " of ",
             desc());
  Shape shape = impl_->shape;
  shape[d] = length;
  return from_storage(impl_->storage, impl_->offset + start * impl_->strides[d], shape,
                      impl_->strides, dtype());
}

Tensor Tensor::detach() const {
  return from_storage(impl_->storage, impl_->offset, impl_->shape, impl_->strides, dtype());
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  Tensor src = contiguous();
  Tensor out = empty(shape(), dtype(), device);
  copy_bytes(out.raw_data(), device, src.raw_data(), src.device(), src.nbytes());
  return out;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == this->dtype()) return *this;
  Tensor out = empty(shape(), dtype, device());
  out.copy_(*this);
  return out;
}

namespace {

template <typename D, typename S>
inline D convert(S v) {
  if constexpr (std::is_same_v<D, S>)
    return v;
  else
    return static_cast<D>(v);
}

double load_as_double(const void* base, int64_t index, DType t) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(base)[index];
    case DType::F64: return static_cast<const double*>(base)[index];
    case DType::F16: return half_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::I32: return static_cast<const int32_t*>(base)[index];
    case DType::I64: return static_cast<double>(static_cast<const int64_t*>(base)[index]);
    case DType::U16: return static_cast<const uint16_t*>(base)[index];
  }
  return 0;
}

void store_from_double(void* base, int64_t index, DType t, double v) {
  switch (t) {
    case DType::F32: static_cast<float*>(base)[index] = static_cast<float>(v); break;
    case DType::F64: static_cast<double*>(base)[index] = v; break;
    case DType::F16:
      static_cast<uint16_t*>(base)[index] = float_to_half(static_cast<float>(v));
      break;
    case DType::BF16:
      static_cast<uint16_t*>(base)[index] = float_to_bf16(static_cast<float>(v));
      break;
    case DType::I32: static_cast<int32_t*>(base)[index] = static_cast<int32_t>(v); break;
    case DType::I64: static_cast<int64_t*>(base)[index] = static_cast<int64_t>(v); break;
    case DType::U16: static_cast<uint16_t*>(base)[index] = static_cast<uint16_t>(v); break;
  }
}

// Element offsets (in elements, relative to each tensor's data pointer) of row-major index i.
inline int64_t strided_offset(int64_t linear, const Shape& shape, const Shape& strides) {
  int64_t off = 0;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    int64_t idx = linear % shape[d];
    linear /= shape[d];
    off += idx * strides[d];
  }
  return off;
}

}  // namespace

void Tensor::copy_(const Tensor& src) {
  check_same_shape("copy_", *this, src);
  if (!device().is_host_addressable() || !src.device().is_host_addressable())
    return ops::cuda::copy_(*this, src);
  bump_version();
  const int64_t n = numel();
  if (n == 0) return;
  if (dtype() == src.dtype() && is_contiguous() && src.is_contiguous()) {
    const char* s = static_cast<const char*>(src.raw_data());
    char* d = static_cast<char*>(raw_data());
    const int64_t esize = dtype_size(dtype());
    parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
      std::memcpy(d + b * esize, s + b * esize, static_cast<size_t>((e - b) * esize));
    });
    return;
  }
  const bool f32_and_low = (dtype() == DType::F32 && is_low_precision(src.dtype())) ||
                           (is_low_precision(dtype()) && src.dtype() == DType::F32);
  if (f32_and_low && is_contiguous() && src.is_contiguous()) {  // the SIMD kernels (convert.h)
    const char* s = static_cast<const char*>(src.raw_data());
    char* d = static_cast<char*>(raw_data());
    const int64_t ssize = dtype_size(src.dtype()), dsize = dtype_size(dtype());
    parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
      convert_floats(src.dtype(), s + b * ssize, dtype(), d + b * dsize, e - b);
    });
    return;
  }
  if (f32_and_low && dim() >= 1 && stride(-1) == 1 && src.stride(-1) == 1 && size(-1) > 0) {
    // Row by row: blocks of a matrix (mixed-precision gemm) convert whole row segments.
    const int64_t row = size(-1), rows = n / row;
    const Shape outer(shape().begin(), shape().end() - 1);
    const Shape so(src.strides().begin(), src.strides().end() - 1);
    const Shape dso(strides().begin(), strides().end() - 1);
    const char* s = static_cast<const char*>(src.raw_data());
    char* d = static_cast<char*>(raw_data());
    const int64_t ssize = dtype_size(src.dtype()), dsize = dtype_size(dtype());
    parallel_for(rows, std::max<int64_t>(1, (int64_t{1} << 16) / row), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        convert_floats(src.dtype(), s + strided_offset(r, outer, so) * ssize, dtype(),
                       d + strided_offset(r, outer, dso) * dsize, row);
    });
    return;
  }
  const void* s = src.raw_data();
  void* d = raw_data();
  const Shape& shape = this->shape();
  const Shape& ss = src.strides();
  const Shape& ds = strides();
  const DType st = src.dtype(), dt = dtype();
  auto copy_range = [&]<typename T>(int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int64_t so = strided_offset(i, shape, ss), doff = strided_offset(i, shape, ds);
      static_cast<T*>(d)[doff] = static_cast<const T*>(s)[so];
    }
  };
  if (st == dt && (dt == DType::F32 || dt == DType::I32)) {
    parallel_for(n, 1 << 14,
                 [&](int64_t b, int64_t e) { copy_range.template operator()<uint32_t>(b, e); });
  } else if (st == dt && (dt == DType::F64 || dt == DType::I64)) {
    parallel_for(n, 1 << 14,
                 [&](int64_t b, int64_t e) { copy_range.template operator()<uint64_t>(b, e); });
  } else if (st == dt) {
    parallel_for(n, 1 << 14,
                 [&](int64_t b, int64_t e) { copy_range.template operator()<uint16_t>(b, e); });
  } else {
    parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        store_from_double(d, strided_offset(i, shape, ds), dt,
                          load_as_double(s, strided_offset(i, shape, ss), st));
    });
  }
}

void Tensor::fill_(double value) {
  if (device().is_cuda()) return ops::cuda::fill_(*this, value);
  bump_version();
  if (is_contiguous()) {
    void* d = raw_data();
    const DType t = dtype();
    auto fill_typed = [&]<typename T>(T v) {
      T* p = static_cast<T*>(d);
      parallel_for(numel(), 1 << 16, [&](int64_t b, int64_t e) { std::fill(p + b, p + e, v); });
    };
    switch (t) {
      case DType::F32: fill_typed(static_cast<float>(value)); return;
      case DType::F64: fill_typed(value); return;
      case DType::I32: fill_typed(static_cast<int32_t>(value)); return;
      case DType::I64: fill_typed(static_cast<int64_t>(value)); return;
      case DType::F16: fill_typed(float_to_half(static_cast<float>(value))); return;
      case DType::BF16: fill_typed(float_to_bf16(static_cast<float>(value))); return;
      case DType::U16: fill_typed(static_cast<uint16_t>(value)); return;
    }
  }
  void* d = raw_data();
  for (int64_t i = 0; i < numel(); ++i)
    store_from_double(d, strided_offset(i, shape(), strides()), dtype(), value);
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = to(Device::cpu()).contiguous();
  if (c.dtype() != dtype_of<T>::value) c = c.to(dtype_of<T>::value);
  std::vector<T> out(static_cast<size_t>(c.numel()));
  std::memcpy(out.data(), c.raw_data(), static_cast<size_t>(c.nbytes()));
  return out;
}
template std::vector<float> Tensor::to_vector() const;
template std::vector<double> Tensor::to_vector() const;
template std::vector<int32_t> Tensor::to_vector() const;
template std::vector<int64_t> Tensor::to_vector() const;
template std::vector<uint16_t> Tensor::to_vector() const;

double Tensor::item() const {
  MW_CHECK_T(ShapeError, numel() == 1, "item: expected one element, got ", desc());
  Tensor c = to(Device::cpu());
  return load_as_double(c.raw_data(), 0, c.dtype());
}

void check_same_shape(const char* op, const Tensor& a, const Tensor& b) {
  MW_CHECK_T(ShapeError, a.shape() == b.shape(), op, ": shapes differ: ", a.desc(), " vs ",
             b.desc());
}

void check_float(const char* op, const Tensor& t) {
  MW_CHECK_T(ShapeError, t.dtype() == DType::F32 || t.dtype() == DType::F64, op,
             ": expected an f32 or f64 tensor, got ", t.desc());
}

}  // namespace mw
