// Causal self-attention on CUDA: the kernels between the cuBLAS products.
//
// Note [Attention on CUDA by query blocks]: attention_cuda.cpp copies q, k, v (and in backward
// dO) out of the interleaved [B, T, 3C] into planes [B*NH, T, hs] (split_heads), then walks the
// queries in blocks of at most 128 rows [t0, t0 + rows). A block sees keys [0, t0 + rows) only
// (causal), and its scores S [B*NH, rows, keys] come from one strided-batched cuBLAS product over
// all heads. The row kernels here turn them into what the next products need:
//
//   forward   S -> P~ = exp(scale*s - lse_t) * keep_ts (0 above the diagonal), lse_t
//             = m + log(sum_j exp(scale*s_j - m)) into lse [B*NH, T];  out_blk = P~ V.
//   backward  S and dPraw = dO_blk V^T -> P~ (as forward, from the saved lse) and
//             dS = p (keep dPraw - D_t) * scale with D_t = sum_j p keep dPraw;
//             dV += P~^T dO_blk, dK += dS^T Q_blk, dQ_blk = dS K.
//
// This is the CPU's formula (attention.cpp) evaluated block by block; keep_ts is keep_scale or 0
// from the same random_uniform(rng, ((b*NH + h)*T + t)*T + s) as the CPU, so dropout masks agree
// across devices. Only the [B, NH, T] log-sum-exp is saved between forward and backward: the
// scores of one block live only inside one call (64 MiB of f32 at most, attention_cuda.cpp).
// Each row's max and sums come from block_reduce in a fixed order, and cuBLAS is deterministic on
// one GPU, so runs give the same bits.
#include <cmath>

#include "core/cuda/common.cuh"

namespace mw::ops::cuda_kernels {
namespace {

constexpr int kRowThreads = 128;  // threads per score row (rows hold at most T keys)

// keep_scale where element (bh, t, s) survives attention dropout, 0 where dropped; 1 without it.
template <typename T>
__device__ T keep_of(double p, T keep_scale, RngState rng, int64_t bh, int64_t T_len, int64_t t,
                     int64_t s) {
  if (p <= 0) return T(1);
  const uint64_t index = static_cast<uint64_t>((bh * T_len + t) * T_len + s);
  return random_uniform(rng, index) >= p ? keep_scale : T(0);
}

// Element i of the planes [parts][B][NH][T][hs] sits at this offset of the interleaved
// [B][T][parts * C] tensor.
__device__ inline int64_t interleaved_offset(int64_t i, int64_t B, int64_t T_len, int64_t C,
                                             int64_t NH, int parts) {
  const int64_t hs = C / NH;
  int64_t r = i / hs;
  const int64_t d = i % hs, t = r % T_len;
  r /= T_len;
  const int64_t h = r % NH, b = (r / NH) % B, part = r / (NH * B);
  return (b * T_len + t) * parts * C + part * C + h * hs + d;
}

// To planes (split) or back (merge): one thread per element.
template <typename T, bool Split>
__global__ void heads_kernel(const T* src, T* dst, int64_t B, int64_t T_len, int64_t C, int64_t NH,
                             int parts) {
  MW_GRID_STRIDE(i, parts * B * T_len * C) {
    const int64_t j = interleaved_offset(i, B, T_len, C, NH, parts);
    if (Split)
      dst[i] = src[j];
    else
      dst[j] = src[i];
  }
}

// Forward: one block per score row (bh, t); s becomes P~ in place, lse_t is written.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    probs_kernel(T* scores, AttentionBlock blk, double p, RngState rng, T* lse) {
  __shared__ T shared[32];
  const T scale = T(1) / dev_sqrt(static_cast<T>(blk.hs));
  const T keep_scale = static_cast<T>(1.0 / (1.0 - p));
  for (int64_t row = blockIdx.x; row < blk.BNH * blk.rows; row += gridDim.x) {
    const int64_t bh = row / blk.rows, t = blk.t0 + row % blk.rows;
    T* s = scores + row * blk.keys;
    T m = T(-INFINITY);
    for (int64_t j = threadIdx.x; j <= t; j += blockDim.x) m = fmax(m, s[j] * scale);
    m = block_reduce<T, true>(m, shared);
    T l = 0;
    for (int64_t j = threadIdx.x; j <= t; j += blockDim.x) l += dev_exp(s[j] * scale - m);
    const T row_lse = m + dev_log(block_reduce<T>(l, shared));
    for (int64_t j = threadIdx.x; j < blk.keys; j += blockDim.x)
      s[j] = j <= t
                 ? dev_exp(s[j] * scale - row_lse) * keep_of<T>(p, keep_scale, rng, bh, blk.T, t, j)
                 : T(0);
    if (threadIdx.x == 0) lse[bh * blk.T + t] = row_lse;
  }
}

// Backward: one block per score row; s (scores) becomes P~, dp (dO . v) becomes dS.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    grad_scores_kernel(T* scores, T* dp, const T* lse, AttentionBlock blk, double p, RngState rng) {
  __shared__ T shared[32];
  const T scale = T(1) / dev_sqrt(static_cast<T>(blk.hs));
  const T keep_scale = static_cast<T>(1.0 / (1.0 - p));
  for (int64_t row = blockIdx.x; row < blk.BNH * blk.rows; row += gridDim.x) {
    const int64_t bh = row / blk.rows, t = blk.t0 + row % blk.rows;
    T* s = scores + row * blk.keys;
    T* g = dp + row * blk.keys;
    const T row_lse = lse[bh * blk.T + t];
    T D = 0;
    for (int64_t j = threadIdx.x; j <= t; j += blockDim.x)
      D += dev_exp(s[j] * scale - row_lse) * keep_of<T>(p, keep_scale, rng, bh, blk.T, t, j) * g[j];
    D = block_reduce<T>(D, shared);
    for (int64_t j = threadIdx.x; j < blk.keys; j += blockDim.x) {
      if (j <= t) {
        const T pr = dev_exp(s[j] * scale - row_lse);
        const T keep = keep_of<T>(p, keep_scale, rng, bh, blk.T, t, j);
        s[j] = pr * keep;
        g[j] = pr * (keep * g[j] - D) * scale;
      } else {
        s[j] = T(0);
        g[j] = T(0);
      }
    }
  }
}

}  // namespace

template <typename T>
void split_heads(const T* src, T* dst, int64_t B, int64_t T_len, int64_t C, int64_t NH, int parts) {
  const int64_t n = parts * B * T_len * C;
  if (n == 0) return;
  heads_kernel<T, true><<<grid_for(n), kThreads>>>(src, dst, B, T_len, C, NH, parts);
  check_kernel_launch("attention (split heads)");
}

template <typename T>
void merge_heads(const T* src, T* dst, int64_t B, int64_t T_len, int64_t C, int64_t NH, int parts) {
  const int64_t n = parts * B * T_len * C;
  if (n == 0) return;
  heads_kernel<T, false><<<grid_for(n), kThreads>>>(src, dst, B, T_len, C, NH, parts);
  check_kernel_launch("attention (merge heads)");
}

template <typename T>
void attention_probs(T* scores, const AttentionBlock& blk, double attn_dropout, RngState rng,
                     T* lse) {
  if (blk.BNH * blk.rows == 0) return;
  probs_kernel<T>
      <<<row_grid(blk.BNH * blk.rows), kRowThreads>>>(scores, blk, attn_dropout, rng, lse);
  check_kernel_launch("attention (probabilities)");
}

template <typename T>
void attention_grad_scores(T* scores, T* dprobs, const T* lse, const AttentionBlock& blk,
                           double attn_dropout, RngState rng) {
  if (blk.BNH * blk.rows == 0) return;
  grad_scores_kernel<T>
      <<<row_grid(blk.BNH * blk.rows), kRowThreads>>>(scores, dprobs, lse, blk, attn_dropout, rng);
  check_kernel_launch("attention_backward (score gradients)");
}

#define MW_ATTENTION_KERNELS(T)                                                        \
  template void split_heads<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, int); \
  template void merge_heads<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, int); \
  template void attention_probs<T>(T*, const AttentionBlock&, double, RngState, T*);   \
  template void attention_grad_scores<T>(T*, T*, const T*, const AttentionBlock&, double, RngState);
MW_ATTENTION_KERNELS(float)
MW_ATTENTION_KERNELS(double)
#undef MW_ATTENTION_KERNELS

}  // namespace mw::ops::cuda_kernels
