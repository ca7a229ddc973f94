// Causal self-attention on CUDA (core/ops_cuda.h): cuBLAS products over blocks of query rows with
// the row kernels of attention.cu between them, Note [Attention on CUDA by query blocks].
#include <algorithm>

#include "core/cuda/tensor_args.h"
#include "core/ops_cuda.h"

namespace mw::ops::cuda {

namespace {

// Query rows per block (ops::cuda_attention_block_rows): at most 128, as a block's products are
// then already large enough to run near cuBLAS's rate and smaller blocks waste less of the masked
// triangle; fewer when a block's scores would pass 64 MiB of f32.
int64_t block_rows(const AttentionDims& d) { return cuda_attention_block_rows(d.B, d.NH, d.T); }

// The per-head products of one block: every (batch, head) at once, planes T*hs elements apart.
struct HeadProducts {
  int device;
  DType dtype;
  AttentionDims d;
  // C [M, N] (ld ldc) = op(A) op(B) + beta C for each head; A, B, C advance by the given strides.
  void operator()(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda,
                  int64_t sa, const void* B, int64_t ldb, int64_t sb, double beta, void* C,
                  int64_t ldc, int64_t sc) const {
    gemm_batched(device, dtype, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc,
                 {d.B * d.NH, sa, sb, sc});
  }
};

}  // namespace

AttentionOut attention(const Tensor& qkv_in, int64_t n_head, double attn_dropout, RngState rng) {
  use_device_of("attention", qkv_in);
  Tensor qkv = qkv_in.contiguous();
  const auto d = attention_dims(qkv, n_head);
  AttentionOut r{Tensor::empty({d.B, d.T, d.C}, qkv.dtype(), qkv.device()),
                 Tensor::empty({d.B, d.NH, d.T}, qkv.dtype(), qkv.device())};
  if (d.B * d.T * d.C == 0) return r;
  const int64_t BNH = d.B * d.NH, plane = BNH * d.T * d.hs, hs = d.hs, n = block_rows(d);
  Tensor heads = Tensor::empty({4 * plane}, qkv.dtype(), qkv.device());  // q, k, v, out
  Tensor scores = Tensor::empty({BNH * n * d.T}, qkv.dtype(), qkv.device());
  const HeadProducts products{qkv.device().index, qkv.dtype(), d};
  const int64_t ps = d.T * hs;  // elements between heads in a plane
  dispatch_float(qkv.dtype(), "attention", [&]<typename T>() {
    T* q = mptr<T>(heads);
    T *k = q + plane, *v = k + plane, *o = v + plane, *s = mptr<T>(scores);
    cuda_kernels::split_heads<T>(cptr<T>(qkv), q, d.B, d.T, d.C, d.NH, 3);
    for (int64_t t0 = 0; t0 < d.T; t0 += n) {
      const int64_t rows = std::min(n, d.T - t0), keys = t0 + rows, ss = rows * keys;
      products(false, true, rows, keys, hs, q + t0 * hs, hs, ps, k, hs, ps, 0, s, keys, ss);
      cuda_kernels::attention_probs<T>(s, {BNH, d.T, rows, keys, t0, hs}, attn_dropout, rng,
                                       mptr<T>(r.att));
      products(false, false, rows, hs, keys, s, keys, ss, v, hs, ps, 0, o + t0 * hs, hs, ps);
    }
    cuda_kernels::merge_heads<T>(o, mptr<T>(r.out), d.B, d.T, d.C, d.NH, 1);
  });
  return r;
}

Tensor attention_backward(const Tensor& dout_in, const Tensor& qkv_in, const Tensor& lse_in,
                          int64_t n_head, double attn_dropout, RngState rng) {
  use_device_of("attention_backward", qkv_in, {&dout_in, &lse_in});
  Tensor qkv = qkv_in.contiguous(), dout = dout_in.contiguous(), lse = lse_in.contiguous();
  const auto d = attention_dims(qkv, n_head);
  MW_CHECK_T(ShapeError, lse.shape() == Shape({d.B, d.NH, d.T}),
             "attention_backward on CUDA: expected the forward's log-sum-exp [", d.B, ", ", d.NH,
             ", ", d.T, "], got ", lse.desc());
  MW_CHECK_T(ShapeError, dout.shape() == Shape({d.B, d.T, d.C}), "attention_backward: dout ",
             dout.desc(), " does not match qkv ", qkv.desc());
  Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device());
  if (d.B * d.T * d.C == 0) return dqkv;
  const int64_t BNH = d.B * d.NH, plane = BNH * d.T * d.hs, hs = d.hs, n = block_rows(d);
  Tensor heads = Tensor::empty({4 * plane}, qkv.dtype(), qkv.device());           // q, k, v, dO
  Tensor grads = Tensor::zeros({3 * plane}, qkv.dtype(), qkv.device());           // dq, dk, dv
  Tensor scores = Tensor::empty({2 * BNH * n * d.T}, qkv.dtype(), qkv.device());  // P~, dS
  const HeadProducts products{qkv.device().index, qkv.dtype(), d};
  const int64_t ps = d.T * hs;
  dispatch_float(qkv.dtype(), "attention_backward", [&]<typename T>() {
    T* q = mptr<T>(heads);
    T *k = q + plane, *v = k + plane, *dO = v + plane;
    T* dq = mptr<T>(grads);
    T *dk = dq + plane, *dv = dk + plane;
    T *s = mptr<T>(scores), *ds = s + BNH * n * d.T;
    cuda_kernels::split_heads<T>(cptr<T>(qkv), q, d.B, d.T, d.C, d.NH, 3);
    cuda_kernels::split_heads<T>(cptr<T>(dout), dO, d.B, d.T, d.C, d.NH, 1);
    for (int64_t t0 = 0; t0 < d.T; t0 += n) {
      const int64_t rows = std::min(n, d.T - t0), keys = t0 + rows, ss = rows * keys;
      const T *qb = q + t0 * hs, *dOb = dO + t0 * hs;
      products(false, true, rows, keys, hs, qb, hs, ps, k, hs, ps, 0, s, keys, ss);
      products(false, true, rows, keys, hs, dOb, hs, ps, v, hs, ps, 0, ds, keys, ss);
      cuda_kernels::attention_grad_scores<T>(s, ds, cptr<T>(lse), {BNH, d.T, rows, keys, t0, hs},
                                             attn_dropout, rng);
      products(true, false, keys, hs, rows, s, keys, ss, dOb, hs, ps, 1, dv, hs, ps);
      products(true, false, keys, hs, rows, ds, keys, ss, qb, hs, ps, 1, dk, hs, ps);
      products(false, false, rows, hs, keys, ds, keys, ss, k, hs, ps, 0, dq + t0 * hs, hs, ps);
    }
    cuda_kernels::merge_heads<T>(dq, mptr<T>(dqkv), d.B, d.T, d.C, d.NH, 3);
  });
  return dqkv;
}

}  // namespace mw::ops::cuda
