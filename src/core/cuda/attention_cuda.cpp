// Causal self-attention on CUDA (core/ops_cuda.h): cuBLAS products over blocks of query rows with
// the row kernels of attention.cu between them, Note [Attention on CUDA by query blocks].
#include <algorithm>

#include "core/convert.h"
#include "core/cuda/tensor_args.h"
#include "core/ops_cuda.h"

namespace mw::ops::cuda {

namespace {

// Query rows per block (ops::cuda_attention_block_rows): at most 128, as a block's products are
// then already large enough to run near cuBLAS's rate and smaller blocks waste less of the masked
// triangle; fewer when a block's scores would pass 64 MiB of f32.
int64_t block_rows(const AttentionDims& d) { return cuda_attention_block_rows(d.B, d.NH, d.T); }

// Note [Low-precision attention on CUDA]: with bf16 or f16 qkv (autocast), q, k, v and dO stay
// 16-bit and every product runs on tensor cores (Note [Products in bf16 and f16 on CUDA]): the
// scores S = Q K^T and dO V^T are exact products summed in f32; the row kernels compute in f32
// and write P~ and dS rounded to the 16-bit dtype, as the products that follow (P~ V, P~^T dO,
// dS^T Q, dS K) need both operands in one type; those sum in f32 into f32 planes, and the output
// and the gradient are rounded once when the heads are merged. This is the arithmetic of
// PyTorch's fused bf16 attention (flash attention also rounds P and dS to bf16 before their
// products). The CPU evaluates the same formula on widened inputs (mixed::attention), so the two
// differ by those two roundings, each at most half a bf16 ulp of one P~ or dS element.
//
// Elements of one tensor addressed by index whatever their dtype (the heads may be 16-bit while
// the scores and the output planes are f32).
struct Elements {
  char* base;
  int64_t size;
  explicit Elements(const Tensor& t)
      : base(static_cast<char*>(t.raw_data())), size(dtype_size(t.dtype())) {}
  void* operator+(int64_t i) const { return base + i * size; }
};

// The per-head products of one block: every (batch, head) at once, planes T*hs elements apart;
// operands in the heads' dtype, results in the accumulation dtype.
struct HeadProducts {
  int device;
  GemmDTypes dtypes;
  AttentionDims d;
  // C [M, N] (ld ldc) = op(A) op(B) + beta C for each head; A, B, C advance by the given strides.
  void operator()(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda,
                  int64_t sa, const void* B, int64_t ldb, int64_t sb, double beta, void* C,
                  int64_t ldc, int64_t sc) const {
    gemm_batched(device, dtypes, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc,
                 {d.B * d.NH, sa, sb, sc});
  }
};

// The heads' dtype (qkv's) and the accumulation dtype (f32 for bf16/f16, else the same).
DType accumulation_dtype(DType heads) { return is_low_precision(heads) ? DType::F32 : heads; }

void split(const Tensor& src, const Tensor& planes, const AttentionDims& d, int parts) {
  if (is_low_precision(src.dtype())) {
    cuda_kernels::split_heads<uint16_t>(cptr<uint16_t>(src), mptr<uint16_t>(planes), d.B, d.T, d.C,
                                        d.NH, parts);
    return;
  }
  dispatch_float(src.dtype(), "attention", [&]<typename T>() {
    cuda_kernels::split_heads<T>(cptr<T>(src), mptr<T>(planes), d.B, d.T, d.C, d.NH, parts);
  });
}

// f32/f64 planes (accumulated) into dst, of their dtype or bf16/f16.
void merge(const Tensor& planes, const Tensor& dst, const AttentionDims& d, int parts) {
  if (is_low_precision(dst.dtype())) {
    cuda_kernels::merge_heads_low(cptr<float>(planes), dst.raw_data(),
                                  static_cast<int>(dst.dtype()), d.B, d.T, d.C, d.NH, parts);
    return;
  }
  dispatch_float(dst.dtype(), "attention", [&]<typename T>() {
    cuda_kernels::merge_heads<T>(cptr<T>(planes), mptr<T>(dst), d.B, d.T, d.C, d.NH, parts);
  });
}

}  // namespace

AttentionOut attention(const Tensor& qkv_in, int64_t n_head, double attn_dropout, RngState rng) {
  use_device_of("attention", qkv_in);
  Tensor qkv = qkv_in.contiguous();
  const auto d = attention_dims(qkv, n_head);
  const DType hd = qkv.dtype(), acc = accumulation_dtype(hd);
  const bool low = hd != acc;
  AttentionOut r{Tensor::empty({d.B, d.T, d.C}, hd, qkv.device()),
                 Tensor::empty({d.B, d.NH, d.T}, acc, qkv.device())};
  if (d.B * d.T * d.C == 0) return r;
  const int64_t BNH = d.B * d.NH, plane = BNH * d.T * d.hs, hs = d.hs, n = block_rows(d);
  Tensor heads = Tensor::empty({3 * plane}, hd, qkv.device());  // q, k, v
  Tensor out = Tensor::empty({plane}, acc, qkv.device());
  Tensor scores = Tensor::empty({BNH * n * d.T}, acc, qkv.device());
  Tensor probs = low ? Tensor::empty({BNH * n * d.T}, hd, qkv.device()) : scores;  // P~
  const HeadProducts qk{qkv.device().index, {hd, acc}, d};
  const int64_t ps = d.T * hs;  // elements between heads in a plane
  split(qkv, heads, d, 3);
  const Elements q(heads), p(probs), o(out);
  const cuda_kernels::LowCopies copies{low ? probs.raw_data() : nullptr, nullptr,
                                       static_cast<int>(hd)};
  dispatch_float(acc, "attention", [&]<typename T>() {
    T* s = mptr<T>(scores);
    for (int64_t t0 = 0; t0 < d.T; t0 += n) {
      const int64_t rows = std::min(n, d.T - t0), keys = t0 + rows, ss = rows * keys;
      qk(false, true, rows, keys, hs, q + t0 * hs, hs, ps, q + plane, hs, ps, 0, s, keys, ss);
      cuda_kernels::attention_probs<T>(s, {BNH, d.T, rows, keys, t0, hs}, attn_dropout, rng,
                                       mptr<T>(r.att), copies);
      qk(false, false, rows, hs, keys, p + 0, keys, ss, q + 2 * plane, hs, ps, 0, o + t0 * hs, hs,
         ps);
    }
  });
  merge(out, r.out, d, 1);
  return r;
}

Tensor attention_backward(const Tensor& dout_in, const Tensor& qkv_in, const Tensor& lse_in,
                          int64_t n_head, double attn_dropout, RngState rng) {
  use_device_of("attention_backward", qkv_in, {&dout_in, &lse_in});
  Tensor qkv = qkv_in.contiguous(), dout = dout_in.contiguous(), lse = lse_in.contiguous();
  const auto d = attention_dims(qkv, n_head);
  const DType hd = qkv.dtype(), acc = accumulation_dtype(hd);
  const bool low = hd != acc;
  MW_CHECK_T(ShapeError, lse.shape() == Shape({d.B, d.NH, d.T}) && lse.dtype() == acc,
             "attention_backward on CUDA: expected the forward's log-sum-exp [", d.B, ", ", d.NH,
             ", ", d.T, "] in ", dtype_name(acc), ", got ", lse.desc());
  MW_CHECK_T(ShapeError, dout.shape() == Shape({d.B, d.T, d.C}) && dout.dtype() == hd,
             "attention_backward: dout ", dout.desc(), " does not match qkv ", qkv.desc());
  Tensor dqkv = Tensor::empty(qkv.shape(), hd, qkv.device());
  if (d.B * d.T * d.C == 0) return dqkv;
  const int64_t BNH = d.B * d.NH, plane = BNH * d.T * d.hs, hs = d.hs, n = block_rows(d);
  const int64_t block = BNH * n * d.T;
  Tensor heads = Tensor::empty({3 * plane}, hd, qkv.device());                    // q, k, v
  Tensor dO = Tensor::empty({plane}, hd, qkv.device());                           // dO
  Tensor grads = Tensor::zeros({3 * plane}, acc, qkv.device());                   // dq, dk, dv
  Tensor scores = Tensor::empty({2 * block}, acc, qkv.device());                  // S, dO V^T
  Tensor copies16 = low ? Tensor::empty({2 * block}, hd, qkv.device()) : scores;  // P~, dS
  const HeadProducts qk{qkv.device().index, {hd, acc}, d};
  const int64_t ps = d.T * hs;
  split(qkv, heads, d, 3);
  split(dout, dO, d, 1);
  const Elements q(heads), dOe(dO), g(grads), pd(copies16);
  const cuda_kernels::LowCopies copies{low ? pd + 0 : nullptr, low ? pd + block : nullptr,
                                       static_cast<int>(hd)};
  const void *k = q + plane, *v = q + 2 * plane, *pt = pd + 0, *dst = pd + block;
  void *dk = g + plane, *dv = g + 2 * plane;
  dispatch_float(acc, "attention_backward", [&]<typename T>() {
    T *s = mptr<T>(scores), *dp = s + block;
    for (int64_t t0 = 0; t0 < d.T; t0 += n) {
      const int64_t rows = std::min(n, d.T - t0), keys = t0 + rows, ss = rows * keys;
      const void *qb = q + t0 * hs, *dOb = dOe + t0 * hs;
      qk(false, true, rows, keys, hs, qb, hs, ps, k, hs, ps, 0, s, keys, ss);
      qk(false, true, rows, keys, hs, dOb, hs, ps, v, hs, ps, 0, dp, keys, ss);
      cuda_kernels::attention_grad_scores<T>(s, dp, cptr<T>(lse), {BNH, d.T, rows, keys, t0, hs},
                                             attn_dropout, rng, copies);
      qk(true, false, keys, hs, rows, pt, keys, ss, dOb, hs, ps, 1, dv, hs, ps);
      qk(true, false, keys, hs, rows, dst, keys, ss, qb, hs, ps, 1, dk, hs, ps);
      qk(false, false, rows, hs, keys, dst, keys, ss, k, hs, ps, 0, g + t0 * hs, hs, ps);
    }
  });
  merge(grads, dqkv, d, 3);
  return dqkv;
}

}  // namespace mw::ops::cuda
