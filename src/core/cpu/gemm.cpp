// Matrix products on the CPU: cblas_sgemm / cblas_dgemm, tiled across oneTBB (Note [Threads]).
//
// Each product is split along its larger output dimension into one tile per thread; each tile is an
// independent single-threaded BLAS call on a sub-block, so results depend only on the thread count,
// and the one thread pool is oneTBB's. bf16 operands in host memory go to the AVX512-BF16 kernel
// where the CPU has it (gemm_bf16.cpp), the same tiling; other low-precision operands to
// mixed::gemm (widened to f32).

#include <atomic>
#include <chrono>
#include <vector>

#include "core/allocator.h"
#include "core/convert.h"
#include "core/cpu/blas.h"
#include "core/cpu/gemm_bf16.h"
#include "core/mixed_ops.h"
#include "core/ops.h"
#include "core/ops_cuda.h"
#include "core/parallel.h"

namespace mw::ops {

namespace {

std::atomic<int64_t> g_gemm_calls{0}, g_gemm_flops{0}, g_gemm_ns{0};

// A 2-D operand as BLAS sees it: base pointer, leading dimension, and whether it is stored
// transposed relative to its logical shape.
struct BlasOperand {
  const void* data;
  int64_t ld;
  bool trans;
};

BlasOperand as_blas(const Tensor& t, bool trans, Tensor& keepalive) {
  MW_CHECK_T(ShapeError, t.dim() == 2, "gemm: expected a 2-D operand, got ", t.desc());
  if (t.stride(1) == 1 && t.stride(0) >= std::max<int64_t>(1, t.size(1)))
    return {t.raw_data(), t.stride(0), trans};
  if (t.stride(0) == 1 && t.stride(1) >= std::max<int64_t>(1, t.size(0)))
    return {t.raw_data(), t.stride(1), !trans};  // a transposed view: flip the flag
  keepalive = t.contiguous();
  return {keepalive.raw_data(), std::max<int64_t>(1, keepalive.size(1)), trans};
}

// bf16 or f16 operands of one dtype on a CUDA device: cuBLAS multiplies them as they are, on
// tensor cores (Note [Products in bf16 and f16 on CUDA], core/cuda/ops_cuda.cpp), instead of the
// widening copies of mixed::gemm; bf16 operands in host memory likewise with AVX512-BF16 where the
// CPU has it (Note [bf16 products on AVX512-BF16], cpu/gemm_bf16.cpp). The result may be their
// dtype or f32.
bool native_low(const Tensor& a, const Tensor& b) {
  if (!is_low_precision(a.dtype()) || b.dtype() != a.dtype()) return false;
  if (a.device().is_cuda()) return true;
  return a.dtype() == DType::BF16 && a.device().is_host_addressable() &&
         b.device().is_host_addressable() && bf16_gemm_kernel() == Bf16GemmKernel::kAvx512Bf16;
}

// out (+)= op(A) op(B) by the AVX512-BF16 kernel. An f32 out directly; a bf16 out through f32
// blocks of kBlock columns (the LM head's [B*T, V] logits are never copied whole), each rounded
// once.
void host_bf16_gemm(const BlasOperand& A, const BlasOperand& B, int64_t M, int64_t N, int64_t K,
                    Tensor& out, bool accumulate) {
  const auto* a = static_cast<const uint16_t*>(A.data);
  const auto* b = static_cast<const uint16_t*>(B.data);
  if (out.dtype() == DType::F32) {
    gemm_bf16_avx512(A.trans, B.trans, M, N, K, a, A.ld, b, B.ld, out.data<float>(), N, accumulate);
    return;
  }
  constexpr int64_t kBlock = 2048;
  for (int64_t n0 = 0; n0 < N; n0 += kBlock) {
    const int64_t nn = std::min(kBlock, N - n0);
    Tensor part = out.narrow(1, n0, nn);
    Tensor acc = accumulate ? part.to(DType::F32).contiguous()
                            : Tensor::empty({M, nn}, DType::F32, out.device());
    gemm_bf16_avx512(A.trans, B.trans, M, nn, K, a, A.ld, B.trans ? b + n0 * B.ld : b + n0, B.ld,
                     acc.data<float>(), nn, accumulate);
    part.copy_(acc);
  }
}

// C[M,N] = alpha * op(A) @ op(B) + beta * C, tiled over the larger of M and N.
template <typename T>
void tiled_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda,
                const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
    return;
  }
  const int64_t threads = num_threads();
  const bool split_m = M >= N;
  const int64_t extent = split_m ? M : N;
  // Tiles of a multiple of 16 rows/columns, one per thread; small products stay on one thread.
  int64_t tile = round_up((extent + threads - 1) / threads, 16);
  if (M * N * K < (int64_t{1} << 18)) tile = extent;
  const int64_t ntiles = (extent + tile - 1) / tile;
  parallel_for(ntiles, 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      int64_t lo = k * tile, hi = std::min(extent, lo + tile);
      if (split_m) {
        const T* a = ta ? A + lo : A + lo * lda;
        blas_gemm<T>(ta, tb, hi - lo, N, K, T(1), a, lda, B, ldb, beta, C + lo * ldc, ldc);
      } else {
        const T* bp = tb ? B + lo * ldb : B + lo;
        blas_gemm<T>(ta, tb, M, hi - lo, K, T(1), A, lda, bp, ldb, beta, C + lo, ldc);
      }
    }
  });
}

}  // namespace

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& out,
          bool accumulate) {
  const bool native = native_low(a, b) && (out.dtype() == a.dtype() || out.dtype() == DType::F32);
  if (!native && mixed::any_low({&a, &b, &out}))
    return mixed::gemm(a, trans_a, b, trans_b, out, accumulate);
  if (!native) check_float("gemm", a);
  MW_CHECK_T(ShapeError, a.dtype() == b.dtype() && (native || a.dtype() == out.dtype()),
             "gemm: dtypes differ: ", a.desc(), ", ", b.desc(), ", ", out.desc());
  MW_CHECK_T(DeviceError, a.device() == b.device() && a.device() == out.device(),
             "gemm: devices differ: ", a.desc(), ", ", b.desc(), ", ", out.desc());
  const int64_t M = trans_a ? a.size(1) : a.size(0);
  const int64_t K = trans_a ? a.size(0) : a.size(1);
  const int64_t Kb = trans_b ? b.size(1) : b.size(0);
  const int64_t N = trans_b ? b.size(0) : b.size(1);
  MW_CHECK_T(ShapeError, K == Kb, "gemm: inner dimensions differ: ", a.desc(), trans_a ? "^T" : "",
             " @ ", b.desc(), trans_b ? "^T" : "");
  MW_CHECK_T(ShapeError,
             out.dim() == 2 && out.size(0) == M && out.size(1) == N && out.is_contiguous(),
             "gemm: output ", out.desc(), " is not a contiguous [", M, ", ", N, "]");
  Tensor ka, kb;
  BlasOperand A = as_blas(a, trans_a, ka), B = as_blas(b, trans_b, kb);
  out.bump_version();
  const auto t0 = std::chrono::steady_clock::now();
  if (out.device().is_cuda()) {  // enqueued only: the time counted is the launch's
    cuda::gemm(out.device().index, {a.dtype(), out.dtype()}, A.trans, B.trans, M, N, K, A.data,
               A.ld, B.data, B.ld, accumulate ? 1.0 : 0.0, out.raw_data(), std::max<int64_t>(1, N));
  } else if (native) {
    host_bf16_gemm(A, B, M, N, K, out, accumulate);
  } else {
    dispatch_float(a.dtype(), "gemm", [&]<typename T>() {
      tiled_gemm<T>(A.trans, B.trans, M, N, K, static_cast<const T*>(A.data), A.ld,
                    static_cast<const T*>(B.data), B.ld, accumulate ? T(1) : T(0),
                    out.template data<T>(), std::max<int64_t>(1, N));
    });
  }
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  g_gemm_calls.fetch_add(1, std::memory_order_relaxed);
  g_gemm_flops.fetch_add(2 * M * N * K, std::memory_order_relaxed);
  g_gemm_ns.fetch_add(ns, std::memory_order_relaxed);
}

GemmStats gemm_stats() { return {g_gemm_calls.load(), g_gemm_flops.load(), g_gemm_ns.load()}; }

void reset_gemm_stats() {
  g_gemm_calls = 0;
  g_gemm_flops = 0;
  g_gemm_ns = 0;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  MW_CHECK_T(ShapeError, a.dim() >= 2 && b.dim() >= 2,
             "matmul: operands must be at least 2-D, got ", a.desc(), " @ ", b.desc());
  MW_CHECK_T(ShapeError, a.size(-1) == b.size(-2), "matmul: inner dimensions differ: ", a.desc(),
             " @ ", b.desc());
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  Shape out_shape(a.shape().begin(), a.shape().end() - 1);
  out_shape.push_back(N);
  if (b.dim() == 2) {  // fold all of a's leading dims into M: one large product
    Tensor a2 = a.dim() == 2 ? a : a.reshape({-1, K});
    Tensor out = Tensor::empty({a2.size(0), N}, a.dtype(), a.device());
    gemm(a2, false, b, false, out, false);
    return out.view(out_shape);
  }
  MW_CHECK_T(
      ShapeError,
      a.dim() == b.dim() && std::equal(a.shape().begin(), a.shape().end() - 2, b.shape().begin()),
      "matmul: batch dimensions differ: ", a.desc(), " @ ", b.desc());
  Tensor out = Tensor::empty(out_shape, a.dtype(), a.device());
  Tensor a3 = a.reshape({-1, M, K}), b3 = b.reshape({-1, K, N});
  Tensor o3 = out.view({-1, M, N});
  for (int64_t i = 0; i < a3.size(0); ++i) {
    Tensor oi = o3.narrow(0, i, 1).view({M, N});
    gemm(a3.narrow(0, i, 1).reshape({M, K}), false, b3.narrow(0, i, 1).reshape({K, N}), false, oi,
         false);
  }
  return out;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  const bool native = native_low(x, w);
  if (!native && mixed::any_low({&x, &w, &bias})) return mixed::linear(x, w, bias);
  MW_CHECK_T(ShapeError, w.dim() == 2 && x.size(-1) == w.size(0), "linear: input ", x.desc(),
             " does not fit weight ", w.desc(), " ([in, out], HF Conv1D layout)");
  const int64_t K = w.size(0), N = w.size(1);
  Tensor x2 = x.reshape({-1, K});
  const int64_t R = x2.size(0);
  bool has_bias = bias.defined();
  // Low operands with a bias: the bias rows and the product are added in f32 and rounded once.
  const DType acc = native && has_bias ? DType::F32 : x.dtype();
  Tensor out = Tensor::empty({R, N}, acc, x.device());
  if (has_bias) {
    MW_CHECK_T(ShapeError, bias.dim() == 1 && bias.size(0) == N, "linear: bias ", bias.desc(),
               " does not fit weight ", w.desc());
    if (out.device().is_cuda()) {
      cuda::fill_rows(out, bias.to(acc));
    } else {
      const Tensor bias_acc = bias.to(acc).contiguous();  // low operands: the f32 master
      dispatch_float(acc, "linear", [&]<typename T>() {
        const T* bp = bias_acc.template data<T>();
        T* op = out.template data<T>();
        parallel_for(R, 64, [&](int64_t b, int64_t e) {
          for (int64_t r = b; r < e; ++r) std::copy(bp, bp + N, op + r * N);
        });
      });
    }
  }
  gemm(x2, false, w, false, out, has_bias);
  Shape shape = x.shape();
  shape.back() = N;
  return out.to(x.dtype()).view(shape);
}

LinearGrads linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, bool need_dx,
                            bool need_dw, bool need_dbias) {
  const bool native = native_low(dy, x) && w.dtype() == x.dtype();
  if (!native && mixed::any_low({&dy, &x, &w}))
    return mixed::linear_backward(dy, x, w, need_dx, need_dw, need_dbias);
  const int64_t K = w.size(0), N = w.size(1);
  Tensor dy2 = dy.reshape({-1, N}), x2 = x.reshape({-1, K});
  const int64_t R = dy2.size(0);
  LinearGrads g;
  if (need_dx) {  // shaped as dy with K columns: x is a [1, K] placeholder when dw is not needed
    Shape shape_dx = dy.shape();
    shape_dx.back() = K;
    g.dx = Tensor::empty({R, K}, x.dtype(), x.device());
    gemm(dy2, false, w, true, g.dx, false);
    g.dx = g.dx.view(shape_dx);
  }
  if (need_dw) {
    g.dw = Tensor::empty({K, N}, w.dtype(), w.device());
    gemm(x2, true, dy2, false, g.dw, false);
  }
  if (need_dbias && dy.device().is_cuda()) {  // f32 for low dy, as mixed::linear_backward's
    g.dbias = cuda::column_sums(native ? dy2.to(DType::F32) : dy2);
  } else if (need_dbias) {
    // Column sums: each thread owns a range of columns and adds rows in order (deterministic), in
    // double (Note [Reductions accumulate in double], layers.cpp). Low dy: f32, as above.
    Tensor dyc = native ? dy2.to(DType::F32) : dy2.contiguous();
    g.dbias = Tensor::empty({N}, dyc.dtype(), dy.device());
    dispatch_float(dyc.dtype(), "linear_backward", [&]<typename T>() {
      const T* d = dyc.template data<T>();
      T* db = g.dbias.template data<T>();
      parallel_for(N, 256, [&](int64_t b, int64_t e) {
        std::vector<double> acc(static_cast<size_t>(e - b), 0.0);
        for (int64_t r = 0; r < R; ++r) {
          const T* row = d + r * N + b;
          for (int64_t j = 0; j < e - b; ++j) acc[j] += static_cast<double>(row[j]);
        }
        for (int64_t j = b; j < e; ++j) db[j] = static_cast<T>(acc[j - b]);
      });
    });
  }
  return g;
}

}  // namespace mw::ops
