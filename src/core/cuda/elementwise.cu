// CUDA elementwise kernels: broadcasting binary ops, affine maps, axpy, the reductions that undo
// broadcasting (sum_to_shape, sum_dim, expand_dim, sum_all), and strided copies and fills with
// dtype conversion (Tensor::copy_, fill_, contiguous, to(dtype) on CUDA tensors).
//
// Determinism: every reduction gives each output element to one thread that adds its inputs in
// element order, in double as the CPU does (so sum_to_shape and sum_dim match the CPU bit for bit;
// accumulating in T they did not, which the first GPU run showed), except sum_all, which is a
// single block combining in a fixed order (deterministic, but not the CPU's order).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "core/cuda/common.cuh"
#include "core/dtype.h"
#include "core/error.h"

namespace mw::ops::cuda_kernels {
namespace {

template <typename T>
__global__ void binary_kernel(int op, const T* a, StridedShape av, const T* b, StridedShape bv,
                              T* out, int64_t n) {
  MW_GRID_STRIDE(i, n) {
    const T x = a[strided_offset(i, av)], y = b[strided_offset(i, bv)];
    T r;
    switch (op) {
      case 0: r = x + y; break;
      case 1: r = x - y; break;
      case 2: r = x * y; break;
      default: r = x / y; break;
    }
    out[i] = r;
  }
}

template <typename T>
__global__ void affine_kernel(const T* a, T* out, int64_t n, T alpha, T beta) {
  MW_GRID_STRIDE(i, n) out[i] = a[i] * alpha + beta;
}

template <typename T>
__global__ void axpy_kernel(T* y, const T* x, int64_t n, T alpha) {
  // alpha == 1 adds without the multiply, as the CPU kernel does, so the result is bitwise equal.
  MW_GRID_STRIDE(i, n) y[i] = alpha == T(1) ? y[i] + x[i] : y[i] + alpha * x[i];
}

template <typename T>
__global__ void scale_kernel(T* x, int64_t n, T alpha) {
  MW_GRID_STRIDE(i, n) x[i] *= alpha;
}

template <typename T>
__global__ void sum_to_shape_kernel(const T* grad, StridedShape to_out, StridedShape walk,
                                    int64_t walk_numel, T* out, int64_t out_numel) {
  MW_GRID_STRIDE(o, out_numel) {
    const int64_t base = strided_offset(o, to_out);
    double acc = 0;  // as the CPU: Note [Reductions accumulate in double] (layers.cpp)
    for (int64_t k = 0; k < walk_numel; ++k)
      acc += static_cast<double>(grad[base + strided_offset(k, walk)]);
    out[o] = static_cast<T>(acc);
  }
}

constexpr int kSumAllThreads = 1024;

template <typename T>
__global__ void sum_all_kernel(const T* x, int64_t n, T* out) {
  __shared__ double shared[32];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += static_cast<double>(x[i]);
  acc = block_reduce<double>(acc, shared);
  if (threadIdx.x == 0) out[0] = static_cast<T>(acc);
}

template <typename T>
__global__ void sum_dim_kernel(const T* x, int64_t outer, int64_t n, int64_t inner, T* out) {
  MW_GRID_STRIDE(idx, outer * inner) {
    const int64_t o = idx / inner, i = idx % inner;
    double acc = 0;  // as the CPU: Note [Reductions accumulate in double] (layers.cpp)
    for (int64_t k = 0; k < n; ++k) acc += static_cast<double>(x[(o * n + k) * inner + i]);
    out[idx] = static_cast<T>(acc);
  }
}

template <typename T>
__global__ void expand_dim_kernel(const T* g, int64_t outer, int64_t n, int64_t inner, T* out) {
  MW_GRID_STRIDE(idx, outer * n * inner) {
    const int64_t o = idx / (n * inner), i = idx % inner;
    out[idx] = g[o * inner + i];
  }
}

// ---- copies and fills through double (the CPU's load_as_double/store_from_double) ----

__device__ double load_as_double(const void* base, int64_t i, int t) {
  switch (static_cast<DType>(t)) {
    case DType::F32: return static_cast<const float*>(base)[i];
    case DType::F64: return static_cast<const double*>(base)[i];
    case DType::F16: return __half2float(static_cast<const __half*>(base)[i]);
    case DType::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::I32: return static_cast<const int32_t*>(base)[i];
    case DType::I64: return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::U16: return static_cast<const uint16_t*>(base)[i];
  }
  return 0;
}

__device__ void store_from_double(void* base, int64_t i, int t, double v) {
  switch (static_cast<DType>(t)) {
    case DType::F32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DType::F64: static_cast<double*>(base)[i] = v; break;
    case DType::F16: static_cast<__half*>(base)[i] = __float2half_rn(static_cast<float>(v)); break;
    case DType::BF16:
      static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(static_cast<float>(v));
      break;
    case DType::I32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); break;
    case DType::I64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); break;
    case DType::U16: static_cast<uint16_t*>(base)[i] = static_cast<uint16_t>(v); break;
  }
}

// Same dtype: a bit copy through an unsigned type of the element's size.
template <typename U>
__global__ void copy_bits_kernel(U* dst, StridedShape dv, const U* src, StridedShape sv,
                                 int64_t n) {
  MW_GRID_STRIDE(i, n) dst[strided_offset(i, dv)] = src[strided_offset(i, sv)];
}

__global__ void copy_convert_kernel(void* dst, StridedShape dv, int dt, const void* src,
                                    StridedShape sv, int st, int64_t n) {
  MW_GRID_STRIDE(i, n) {
    store_from_double(dst, strided_offset(i, dv), dt,
                      load_as_double(src, strided_offset(i, sv), st));
  }
}

template <typename Low>
__global__ void f32_to_low_kernel(Low* dst, const float* src, int64_t n) {
  MW_GRID_STRIDE(i, n) {
    if constexpr (std::is_same_v<Low, __half>)
      dst[i] = __float2half_rn(src[i]);
    else
      dst[i] = __float2bfloat16_rn(src[i]);
  }
}

template <typename Low>
__global__ void low_to_f32_kernel(float* dst, const Low* src, int64_t n) {
  MW_GRID_STRIDE(i, n) {
    if constexpr (std::is_same_v<Low, __half>)
      dst[i] = __half2float(src[i]);
    else
      dst[i] = __bfloat162float(src[i]);
  }
}

__global__ void fill_kernel(void* dst, StridedShape dv, int dt, double value, int64_t n) {
  MW_GRID_STRIDE(i, n) store_from_double(dst, strided_offset(i, dv), dt, value);
}

}  // namespace

template <typename T>
void binary(int op, const T* a, StridedShape av, const T* b, StridedShape bv, T* out, int64_t n) {
  if (n == 0) return;
  binary_kernel<T><<<grid_for(n), kThreads>>>(op, a, av, b, bv, out, n);
  check_kernel_launch("binary op");
}

template <typename T>
void affine(const T* a, T* out, int64_t n, double alpha, double beta) {
  if (n == 0) return;
  affine_kernel<T>
      <<<grid_for(n), kThreads>>>(a, out, n, static_cast<T>(alpha), static_cast<T>(beta));
  check_kernel_launch("scalar op");
}

template <typename T>
void axpy(T* y, const T* x, int64_t n, double alpha) {
  if (n == 0) return;
  axpy_kernel<T><<<grid_for(n), kThreads>>>(y, x, n, static_cast<T>(alpha));
  check_kernel_launch("axpy_");
}

template <typename T>
void scale(T* x, int64_t n, double alpha) {
  if (n == 0) return;
  scale_kernel<T><<<grid_for(n), kThreads>>>(x, n, static_cast<T>(alpha));
  check_kernel_launch("scale_");
}

template <typename T>
void sum_to_shape(const T* grad, StridedShape to_out, StridedShape walk, T* out,
                  int64_t out_numel) {
  if (out_numel == 0) return;
  int64_t walk_numel = 1;
  for (int d = 0; d < walk.rank; ++d) walk_numel *= walk.shape[d];
  sum_to_shape_kernel<T>
      <<<grid_for(out_numel), kThreads>>>(grad, to_out, walk, walk_numel, out, out_numel);
  check_kernel_launch("sum_to_shape");
}

template <typename T>
void sum_all(const T* x, int64_t n, T* out) {
  sum_all_kernel<T><<<1, kSumAllThreads>>>(x, n, out);
  check_kernel_launch("sum");
}

template <typename T>
void sum_dim(const T* x, int64_t outer, int64_t n, int64_t inner, T* out) {
  if (outer * inner == 0) return;
  sum_dim_kernel<T><<<grid_for(outer * inner), kThreads>>>(x, outer, n, inner, out);
  check_kernel_launch("sum");
}

template <typename T>
void expand_dim(const T* g, int64_t outer, int64_t n, int64_t inner, T* out) {
  if (outer * n * inner == 0) return;
  expand_dim_kernel<T><<<grid_for(outer * n * inner), kThreads>>>(g, outer, n, inner, out);
  check_kernel_launch("expand");
}

void convert_floats(void* dst, int dst_dtype, const void* src, int src_dtype, int64_t n) {
  if (n == 0) return;
  const DType dt = static_cast<DType>(dst_dtype), st = static_cast<DType>(src_dtype);
  if (st == DType::F32 && dt == DType::BF16) {
    f32_to_low_kernel<<<grid_for(n), kThreads>>>(static_cast<__nv_bfloat16*>(dst),
                                                 static_cast<const float*>(src), n);
  } else if (st == DType::F32 && dt == DType::F16) {
    f32_to_low_kernel<<<grid_for(n), kThreads>>>(static_cast<__half*>(dst),
                                                 static_cast<const float*>(src), n);
  } else if (st == DType::BF16 && dt == DType::F32) {
    low_to_f32_kernel<<<grid_for(n), kThreads>>>(static_cast<float*>(dst),
                                                 static_cast<const __nv_bfloat16*>(src), n);
  } else if (st == DType::F16 && dt == DType::F32) {
    low_to_f32_kernel<<<grid_for(n), kThreads>>>(static_cast<float*>(dst),
                                                 static_cast<const __half*>(src), n);
  } else {
    throw InvalidArgument(str("convert_floats (CUDA): converts f32 to bf16/f16 and back, not ",
                              dtype_name(st), " to ", dtype_name(dt)));
  }
  check_kernel_launch("convert_floats");
}

void copy_strided(void* dst, StridedShape dv, int dt, const void* src, StridedShape sv, int st,
                  int64_t n) {
  if (n == 0) return;
  if (dt == st) {
    switch (dtype_size(static_cast<DType>(dt))) {
      case 2:
        copy_bits_kernel<uint16_t><<<grid_for(n), kThreads>>>(
            static_cast<uint16_t*>(dst), dv, static_cast<const uint16_t*>(src), sv, n);
        break;
      case 4:
        copy_bits_kernel<uint32_t><<<grid_for(n), kThreads>>>(
            static_cast<uint32_t*>(dst), dv, static_cast<const uint32_t*>(src), sv, n);
        break;
      default:
        copy_bits_kernel<uint64_t><<<grid_for(n), kThreads>>>(
            static_cast<uint64_t*>(dst), dv, static_cast<const uint64_t*>(src), sv, n);
        break;
    }
  } else {
    copy_convert_kernel<<<grid_for(n), kThreads>>>(dst, dv, dt, src, sv, st, n);
  }
  check_kernel_launch("copy_");
}

void fill(void* dst, StridedShape dv, int dt, double value, int64_t n) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n), kThreads>>>(dst, dv, dt, value, n);
  check_kernel_launch("fill_");
}

#define MW_INSTANTIATE(T)                                                                    \
  template void binary<T>(int, const T*, StridedShape, const T*, StridedShape, T*, int64_t); \
  template void affine<T>(const T*, T*, int64_t, double, double);                            \
  template void axpy<T>(T*, const T*, int64_t, double);                                      \
  template void scale<T>(T*, int64_t, double);                                               \
  template void sum_to_shape<T>(const T*, StridedShape, StridedShape, T*, int64_t);          \
  template void sum_all<T>(const T*, int64_t, T*);                                           \
  template void sum_dim<T>(const T*, int64_t, int64_t, int64_t, T*);                         \
  template void expand_dim<T>(const T*, int64_t, int64_t, int64_t, T*);
MW_INSTANTIATE(float)
MW_INSTANTIATE(double)
#undef MW_INSTANTIATE

}  // namespace mw::ops::cuda_kernels
