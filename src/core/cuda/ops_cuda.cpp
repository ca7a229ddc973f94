// Tensor-level CUDA ops, part 1: elementwise ops, reductions, copies and fills, and the matrix
// products through cuBLAS (core/ops_cuda.h). Each wrapper checks its inputs as the CPU op does,
// allocates outputs on the inputs' device with the caching allocator, and calls a launcher of
// core/cuda/kernels.h. Everything is enqueued on the legacy default stream; nothing synchronises
// except copies to the host.
#include "core/ops_cuda.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "core/convert.h"
#include "core/cuda/cublas_loader.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/tensor_args.h"

namespace mw::ops {

void cuda_kernels::check_kernel_launch(const char* op) {
  check_cuda(cudaGetLastError(), "launching the CUDA kernel of ", op);
}

namespace cuda {

using cuda_kernels::StridedShape;

void use_device_of(const char* op, const Tensor& t, std::initializer_list<const Tensor*> others) {
  const Device d = t.device();
  MW_CHECK_T(DeviceError, d.is_cuda(), op, ": expected a CUDA tensor, got ", t.desc());
  for (const Tensor* o : others)
    MW_CHECK_T(DeviceError, !o->defined() || o->device() == d, op,
               ": tensors on different devices: ", t.desc(), " and ", o->desc(),
               "; move them to one device with to()");
  check_cuda(cudaSetDevice(d.index), "cudaSetDevice(", d.index, ") for ", op);
}

StridedShape strided_view(const char* op, const Tensor& t) {
  MW_CHECK_T(ShapeError, t.dim() <= cuda_kernels::kMaxRank, op, ": ", t.desc(), " has more than ",
             cuda_kernels::kMaxRank, " dimensions, the most the CUDA kernels index; reshape it");
  StridedShape v;
  v.rank = static_cast<int32_t>(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) {
    v.shape[d] = t.size(d);
    v.strides[d] = t.stride(d);
  }
  return v;
}

StridedShape broadcast_view(const char* op, const Tensor& t, const Shape& out) {
  const int64_t rank = static_cast<int64_t>(out.size());
  MW_CHECK_T(ShapeError, rank <= cuda_kernels::kMaxRank, op, ": broadcast shape ", shape_str(out),
             " has more than ", cuda_kernels::kMaxRank, " dimensions");
  StridedShape v;
  v.rank = static_cast<int32_t>(rank);
  const int64_t off = rank - t.dim();
  for (int64_t d = 0; d < rank; ++d) {
    v.shape[d] = out[d];
    v.strides[d] = d < off || t.size(d - off) == 1 ? 0 : t.stride(d - off);
  }
  return v;
}

// ---------------- elementwise ----------------

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  use_device_of("binary op", a, {&b});
  Tensor out = Tensor::empty(broadcast_shapes(a.shape(), b.shape()), a.dtype(), a.device());
  dispatch_float(a.dtype(), "binary op", [&]<typename T>() {
    cuda_kernels::binary<T>(static_cast<int>(op), cptr<T>(a),
                            broadcast_view("binary op", a, out.shape()), cptr<T>(b),
                            broadcast_view("binary op", b, out.shape()), mptr<T>(out), out.numel());
  });
  return out;
}

Tensor affine_scalar(const Tensor& a_in, double alpha, double beta) {
  use_device_of("scalar op", a_in);
  Tensor a = a_in.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  dispatch_float(a.dtype(), "scalar op", [&]<typename T>() {
    cuda_kernels::affine<T>(cptr<T>(a), mptr<T>(out), a.numel(), alpha, beta);
  });
  return out;
}

void axpy_(Tensor& y, const Tensor& x_in, double alpha) {
  use_device_of("axpy_", y, {&x_in});
  Tensor x = x_in.contiguous();
  y.bump_version();
  dispatch_float(y.dtype(), "axpy_", [&]<typename T>() {
    cuda_kernels::axpy<T>(mptr<T>(y), cptr<T>(x), y.numel(), alpha);
  });
}

void scale_(Tensor& x, double alpha) {
  use_device_of("scale_", x);
  x.bump_version();
  dispatch_float(x.dtype(), "scale_",
                 [&]<typename T>() { cuda_kernels::scale<T>(mptr<T>(x), x.numel(), alpha); });
}

Tensor sum_to_shape(const Tensor& grad_in, const Shape& shape) {
  use_device_of("sum_to_shape", grad_in);
  Tensor grad = grad_in.contiguous();
  const Shape& gs = grad.shape();
  const int64_t rank = static_cast<int64_t>(gs.size());
  MW_CHECK_T(ShapeError, rank <= cuda_kernels::kMaxRank && shape.size() <= gs.size(),
             "sum_to_shape: cannot reduce ", grad.desc(), " to ", shape_str(shape));
  Tensor out = Tensor::empty(shape, grad.dtype(), grad.device());
  // to_out walks out's elements (out's shape aligned to grad's rank) with grad's strides; walk
  // covers the broadcast dims with grad's strides, in row-major order (the CPU's element order).
  const Shape gstrides = contiguous_strides(gs);
  StridedShape to_out, walk;
  to_out.rank = walk.rank = static_cast<int32_t>(rank);
  const int64_t off = rank - static_cast<int64_t>(shape.size());
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t od = d < off ? 1 : shape[d - off];
    MW_CHECK_T(ShapeError, od == gs[d] || od == 1, "sum_to_shape: cannot reduce ", grad.desc(),
               " to ", shape_str(shape));
    const bool reduced = od == 1 && gs[d] != 1;
    to_out.shape[d] = reduced ? 1 : gs[d];
    to_out.strides[d] = reduced ? 0 : gstrides[d];
    walk.shape[d] = reduced ? gs[d] : 1;
    walk.strides[d] = reduced ? gstrides[d] : 0;
  }
  dispatch_float(grad.dtype(), "sum_to_shape", [&]<typename T>() {
    cuda_kernels::sum_to_shape<T>(cptr<T>(grad), to_out, walk, mptr<T>(out), out.numel());
  });
  return out;
}

Tensor sum_all(const Tensor& x_in) {
  use_device_of("sum", x_in);
  Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty({}, x.dtype(), x.device());
  dispatch_float(x.dtype(), "sum", [&]<typename T>() {
    cuda_kernels::sum_all<T>(cptr<T>(x), x.numel(), mptr<T>(out));
  });
  return out;
}

Tensor sum_dim(const Tensor& x_in, int64_t dim, bool keepdim) {
  use_device_of("sum", x_in);
  Tensor x = x_in.contiguous();
  dim = x.wrap_dim(dim);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  Shape shape = x.shape();
  if (keepdim)
    shape[dim] = 1;
  else
    shape.erase(shape.begin() + dim);
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  dispatch_float(x.dtype(), "sum", [&]<typename T>() {
    cuda_kernels::sum_dim<T>(cptr<T>(x), outer, x.size(dim), inner, mptr<T>(out));
  });
  return out;
}

Tensor expand_dim(const Tensor& g_in, const Shape& shape, int64_t dim, bool keepdim) {
  use_device_of("expand", g_in);
  Tensor g = g_in.contiguous();
  Tensor out = Tensor::empty(shape, g.dtype(), g.device());
  const int64_t rank = static_cast<int64_t>(shape.size());
  dim = dim < 0 ? dim + rank : dim;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
  for (int64_t d = dim + 1; d < rank; ++d) inner *= shape[d];
  (void)keepdim;  // the element order of g is the same either way
  dispatch_float(g.dtype(), "expand", [&]<typename T>() {
    cuda_kernels::expand_dim<T>(cptr<T>(g), outer, shape[dim], inner, mptr<T>(out));
  });
  return out;
}

// ---------------- copies and fills ----------------

namespace {
// Rows with unit stride on both sides of a same-dtype copy between 2-D views of one device (the
// narrowed logits of Note [Padded vocabulary on CUDA]): one cudaMemcpy2DAsync instead of the
// strided kernel's index arithmetic per element. False when the views are not such rows.
bool pitched_copy(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() != src.dtype() || dst.dim() != 2 || src.dim() != 2) return false;
  const auto rows_of = [](const Tensor& t) {
    return t.stride(1) == 1 && (t.size(0) == 1 || t.stride(0) >= t.size(1));
  };
  if (!rows_of(dst) || !rows_of(src)) return false;
  const auto es = static_cast<size_t>(dtype_size(dst.dtype()));
  const size_t width = static_cast<size_t>(dst.size(1)) * es;
  const auto pitch = [&](const Tensor& t) {
    return t.size(0) == 1 ? width : static_cast<size_t>(t.stride(0)) * es;
  };
  check_cuda(cudaMemcpy2DAsync(dst.raw_data(), pitch(dst), src.raw_data(), pitch(src), width,
                               static_cast<size_t>(dst.size(0)), cudaMemcpyDeviceToDevice, nullptr),
             "cudaMemcpy2DAsync of ", dst.desc());
  return true;
}
}  // namespace

void copy_(Tensor& dst, const Tensor& src) {
  check_same_shape("copy_", dst, src);
  if (dst.numel() == 0) return dst.bump_version();
  const bool same_layout = dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous();
  if (same_layout && dst.device() != src.device()) {  // one plain transfer
    dst.bump_version();
    copy_bytes(dst.raw_data(), dst.device(), src.raw_data(), src.device(), dst.nbytes());
    return;
  }
  if (!dst.device().is_cuda()) {  // CUDA -> host with a layout or dtype change: convert on the host
    Tensor staged = src.to(Device::cpu());
    dst.copy_(staged);
    return;
  }
  // Into CUDA memory: bring src to dst's device first (a contiguous transfer), then convert there.
  Tensor on_dst = src.device() == dst.device() ? src : src.to(dst.device());
  use_device_of("copy_", dst, {&on_dst});
  dst.bump_version();
  if (pitched_copy(dst, on_dst)) return;
  const bool f32_and_low = (dst.dtype() == DType::F32 && is_low_precision(on_dst.dtype())) ||
                           (is_low_precision(dst.dtype()) && on_dst.dtype() == DType::F32);
  if (f32_and_low && dst.is_contiguous() && on_dst.is_contiguous()) {
    cuda_kernels::convert_floats(dst.raw_data(), static_cast<int>(dst.dtype()), on_dst.raw_data(),
                                 static_cast<int>(on_dst.dtype()), dst.numel());
    return;
  }
  cuda_kernels::copy_strided(
      dst.raw_data(), strided_view("copy_", dst), static_cast<int>(dst.dtype()), on_dst.raw_data(),
      strided_view("copy_", on_dst), static_cast<int>(on_dst.dtype()), dst.numel());
}

void fill_(Tensor& t, double value) {
  use_device_of("fill_", t);
  t.bump_version();
  cuda_kernels::fill(t.raw_data(), strided_view("fill_", t), static_cast<int>(t.dtype()), value,
                     t.numel());
}

// ---------------- cuBLAS ----------------

namespace {

void check_cublas(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) [[likely]]
    return;
  throw DeviceError(str(what, " failed: ", cublas().status_string(status), " (",
                        static_cast<int>(status),
                        "); check that the GPU is visible and has free memory"));
}

// One cuBLAS handle per device, created on first use (on the legacy default stream) and kept for
// the process. Calls are serialised by the returned lock: a handle is not safe to share between
// threads calling at once.
struct LockedHandle {
  std::unique_lock<std::mutex> lock;
  cublasHandle_t handle;
};

LockedHandle cublas_handle(int device) {
  static std::mutex mutex;
  static std::map<int, cublasHandle_t> handles;
  std::unique_lock<std::mutex> lock(mutex);
  cublasHandle_t& h = handles[device];
  if (!h) {
    check_cublas(cublas().create(&h), "cublasCreate");
    // CUBLAS_DEFAULT_MATH: full fp32 products, no TF32 (unless NVIDIA_TF32_OVERRIDE says so).
    // Reduced-precision reduction disallowed: a split-K product with a 16-bit result may
    // otherwise add its partial sums in that type (Note [Products in bf16 and f16 on CUDA];
    // PyTorch allows it by default). Set in session 40 without a GPU: its speed not measured.
    check_cublas(cublas().set_math_mode(h, static_cast<cublasMath_t>(
                                               CUBLAS_DEFAULT_MATH |
                                               CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
                 "cublasSetMathMode");
  }
  return {std::move(lock), h};
}

// The device made current and its handle, after checking that every dimension, leading
// dimension and batch count fits cuBLAS's 32-bit int.
LockedHandle gemm_handle(int device_index, std::initializer_list<int64_t> dims) {
  for (int64_t v : dims)
    MW_CHECK_T(ShapeError, v <= INT32_MAX, "gemm on CUDA: dimension or count ", v,
               " exceeds cuBLAS's 32-bit limit; split the product");
  check_cuda(cudaSetDevice(device_index), "cudaSetDevice(", device_index, ") for gemm");
  return cublas_handle(device_index);
}

}  // namespace

namespace {

cudaDataType_t cuda_data_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return CUDA_R_32F;
    case DType::F64: return CUDA_R_64F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: break;
  }
  throw ShapeError(str("gemm on CUDA: expected f32, f64, bf16 or f16, got ", dtype_name(dtype)));
}

// Note [Products in bf16 and f16 on CUDA]: every product goes through cublasGemmEx (or its strided
// batched form) with the operands' and the result's cuBLAS types. f32 and f64 compute in their
// own type (CUBLAS_COMPUTE_32F / 64F under the handle's default math: no TF32), which is what
// cublasSgemm / cublasDgemm did. bf16 and f16 operands (the autocast linears and the LM head) run
// on tensor cores with CUBLAS_COMPUTE_32F: each product of two 16-bit values is exact in f32, the
// sums are f32, and the result is rounded once, to the result's type (bf16, f16 or f32), after
// adding beta * C in f32 (split-K partials too: the handle disallows reduced-precision
// reduction, which cuBLAS otherwise may use for a 16-bit result). That is the CPU's contract for
// low-precision storage (widen, f32
// kernel, round once; Note [Low-precision storage]) with the sums in cuBLAS's order, and the
// arithmetic of PyTorch's bf16 matmul under autocast.
struct GemmTypes {
  cudaDataType_t ab, c;
  cublasComputeType_t compute;
  bool f64;
};

GemmTypes gemm_types(DType ab, DType c) {
  const bool f64 = ab == DType::F64;
  MW_CHECK_T(ShapeError, ab == c || (is_low_precision(ab) && c == DType::F32),
             "gemm on CUDA: ", dtype_name(ab), " operands with a ", dtype_name(c),
             " result; expected the operands' dtype, or f32 for bf16/f16 operands");
  return {cuda_data_type(ab), cuda_data_type(c), f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F,
          f64};
}

}  // namespace

void gemm(int device_index, GemmDTypes dtypes, bool trans_a, bool trans_b, int64_t M, int64_t N,
          int64_t K, const void* A, int64_t lda, const void* B, int64_t ldb, double beta, void* C,
          int64_t ldc) {
  gemm_batched(device_index, dtypes, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc,
               {1, 0, 0, 0});
}

void gemm_batched(int device_index, GemmDTypes dtypes, bool trans_a, bool trans_b, int64_t M,
                  int64_t N, int64_t K, const void* A, int64_t lda, const void* B, int64_t ldb,
                  double beta, void* C, int64_t ldc, const GemmBatch& batch) {
  if (M == 0 || N == 0 || batch.count == 0) return;
  const GemmTypes t = gemm_types(dtypes.operands, dtypes.result);
  LockedHandle h = gemm_handle(device_index, {M, N, K, lda, ldb, ldc, batch.count});
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  const cublasOperation_t ob = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t oa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int n = static_cast<int>(N), m = static_cast<int>(M), k = static_cast<int>(K);
  // alpha and beta in the compute type.
  const float alpha32 = 1.0f, beta32 = static_cast<float>(beta);
  const double alpha64 = 1.0;
  const void* alpha = t.f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* b = t.f64 ? static_cast<const void*>(&beta) : &beta32;
  if (batch.count == 1) {
    check_cublas(cublas().gemm_ex(h.handle, ob, oa, n, m, k, alpha, B, t.ab, static_cast<int>(ldb),
                                  A, t.ab, static_cast<int>(lda), b, C, t.c, static_cast<int>(ldc),
                                  t.compute, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
    return;
  }
  check_cublas(cublas().gemm_strided_batched_ex(
                   h.handle, ob, oa, n, m, k, alpha, B, t.ab, static_cast<int>(ldb), batch.stride_b,
                   A, t.ab, static_cast<int>(lda), batch.stride_a, b, C, t.c, static_cast<int>(ldc),
                   batch.stride_c, static_cast<int>(batch.count), t.compute, CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx");
}

void fill_rows(Tensor& out, const Tensor& bias_in) {
  use_device_of("linear", out, {&bias_in});
  Tensor bias = bias_in.contiguous();
  const int64_t N = bias.numel(), R = out.numel() / std::max<int64_t>(N, 1);
  dispatch_float(out.dtype(), "linear", [&]<typename T>() {
    cuda_kernels::broadcast_rows<T>(cptr<T>(bias), R, N, mptr<T>(out));
  });
}

Tensor column_sums(const Tensor& x_in) {
  use_device_of("linear_backward", x_in);
  Tensor x = x_in.contiguous();
  const int64_t R = x.size(0), N = x.size(1);
  Tensor out = Tensor::empty({N}, x.dtype(), x.device());
  Tensor scratch =
      Tensor::empty({cuda_kernels::column_sum_scratch_numel(R, N)}, x.dtype(), x.device());
  dispatch_float(x.dtype(), "linear_backward", [&]<typename T>() {
    cuda_kernels::column_sum<T>(cptr<T>(x), R, N, mptr<T>(out), mptr<T>(scratch));
  });
  return out;
}

}  // namespace cuda
}  // namespace mw::ops
