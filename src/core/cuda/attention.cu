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
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "core/cuda/common.cuh"
#include "core/dtype.h"
#include "core/error.h"

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

// v stored as P: unchanged when P is T, rounded to nearest even for bf16 and f16.
template <typename P, typename T>
__device__ inline P store_as(T v) {
  if constexpr (std::is_same_v<P, __nv_bfloat16>)
    return __float2bfloat16_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<P, __half>)
    return __float2half_rn(static_cast<float>(v));
  else
    return v;
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

// To planes (split) or back (merge, storing as Dst): one thread per element.
template <typename Src, typename Dst, bool Split>
__global__ void heads_kernel(const Src* src, Dst* dst, int64_t B, int64_t T_len, int64_t C,
                             int64_t NH, int parts) {
  MW_GRID_STRIDE(i, parts * B * T_len * C) {
    const int64_t j = interleaved_offset(i, B, T_len, C, NH, parts);
    if (Split)
      dst[i] = src[j];
    else
      dst[j] = store_as<Dst>(src[i]);
  }
}

// Forward: one block per score row (bh, t); P~ goes to `probs` (the scores themselves, or their
// low-precision copy), lse_t is written.
template <typename T, typename P>
__global__ void __launch_bounds__(kRowThreads)
    probs_kernel(T* scores, P* probs, AttentionBlock blk, double p, RngState rng, T* lse) {
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
    P* out = probs + row * blk.keys;
    for (int64_t j = threadIdx.x; j < blk.keys; j += blockDim.x)
      out[j] = store_as<P>(j <= t ? dev_exp(s[j] * scale - row_lse) *
                                        keep_of<T>(p, keep_scale, rng, bh, blk.T, t, j)
                                  : T(0));
    if (threadIdx.x == 0) lse[bh * blk.T + t] = row_lse;
  }
}

// Backward: one block per score row; P~ from s (scores) goes to `probs`, dS from dp (dO . v) to
// `dscores` (in place: the scores and dp themselves; or their low-precision copies).
template <typename T, typename P>
__global__ void __launch_bounds__(kRowThreads)
    grad_scores_kernel(T* scores, T* dp, P* probs, P* dscores, const T* lse, AttentionBlock blk,
                       double p, RngState rng) {
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
    P *p_out = probs + row * blk.keys, *ds_out = dscores + row * blk.keys;
    for (int64_t j = threadIdx.x; j < blk.keys; j += blockDim.x) {
      T pk = 0, ds = 0;
      if (j <= t) {
        const T pr = dev_exp(s[j] * scale - row_lse);
        const T keep = keep_of<T>(p, keep_scale, rng, bh, blk.T, t, j);
        pk = pr * keep;
        ds = pr * (keep * g[j] - D) * scale;
      }
      p_out[j] = store_as<P>(pk);
      ds_out[j] = store_as<P>(ds);
    }
  }
}

}  // namespace

template <typename T>
void split_heads(const T* src, T* dst, int64_t B, int64_t T_len, int64_t C, int64_t NH, int parts) {
  const int64_t n = parts * B * T_len * C;
  if (n == 0) return;
  heads_kernel<T, T, true><<<grid_for(n), kThreads>>>(src, dst, B, T_len, C, NH, parts);
  check_kernel_launch("attention (split heads)");
}

template <typename T>
void merge_heads(const T* src, T* dst, int64_t B, int64_t T_len, int64_t C, int64_t NH, int parts) {
  const int64_t n = parts * B * T_len * C;
  if (n == 0) return;
  heads_kernel<T, T, false><<<grid_for(n), kThreads>>>(src, dst, B, T_len, C, NH, parts);
  check_kernel_launch("attention (merge heads)");
}

namespace {
// f(P{}) with P the device type of a bf16 or f16 DType code.
template <typename F>
void with_low_type(int dtype, const char* op, F&& f) {
  if (dtype == static_cast<int>(DType::BF16))
    f(__nv_bfloat16{});
  else if (dtype == static_cast<int>(DType::F16))
    f(__half{});
  else
    throw InvalidArgument(str(op, " (CUDA): expected a bf16 or f16 copy, got dtype code ", dtype));
}
}  // namespace

void merge_heads_low(const float* src, void* dst, int low_dtype, int64_t B, int64_t T_len,
                     int64_t C, int64_t NH, int parts) {
  const int64_t n = parts * B * T_len * C;
  if (n == 0) return;
  with_low_type(low_dtype, "attention (merge heads)", [&](auto low) {
    using P = decltype(low);
    heads_kernel<float, P, false>
        <<<grid_for(n), kThreads>>>(src, static_cast<P*>(dst), B, T_len, C, NH, parts);
  });
  check_kernel_launch("attention (merge heads)");
}

template <typename T>
void attention_probs(T* scores, const AttentionBlock& blk, double attn_dropout, RngState rng,
                     T* lse, const LowCopies& low) {
  if (blk.BNH * blk.rows == 0) return;
  const unsigned grid = row_grid(blk.BNH * blk.rows);
  if (!low.probs) {
    probs_kernel<T, T><<<grid, kRowThreads>>>(scores, scores, blk, attn_dropout, rng, lse);
  } else if constexpr (std::is_same_v<T, float>) {
    with_low_type(low.dtype, "attention (probabilities)", [&](auto l) {
      using P = decltype(l);
      probs_kernel<T, P>
          <<<grid, kRowThreads>>>(scores, static_cast<P*>(low.probs), blk, attn_dropout, rng, lse);
    });
  } else {
    throw InvalidArgument("attention (CUDA): low-precision copies need f32 scores");
  }
  check_kernel_launch("attention (probabilities)");
}

template <typename T>
void attention_grad_scores(T* scores, T* dprobs, const T* lse, const AttentionBlock& blk,
                           double attn_dropout, RngState rng, const LowCopies& low) {
  if (blk.BNH * blk.rows == 0) return;
  const unsigned grid = row_grid(blk.BNH * blk.rows);
  if (!low.probs) {
    grad_scores_kernel<T, T>
        <<<grid, kRowThreads>>>(scores, dprobs, scores, dprobs, lse, blk, attn_dropout, rng);
  } else if constexpr (std::is_same_v<T, float>) {
    with_low_type(low.dtype, "attention_backward (score gradients)", [&](auto l) {
      using P = decltype(l);
      grad_scores_kernel<T, P><<<grid, kRowThreads>>>(scores, dprobs, static_cast<P*>(low.probs),
                                                      static_cast<P*>(low.dscores), lse, blk,
                                                      attn_dropout, rng);
    });
  } else {
    throw InvalidArgument("attention_backward (CUDA): low-precision copies need f32 scores");
  }
  check_kernel_launch("attention_backward (score gradients)");
}

#define MW_ATTENTION_KERNELS(T)                                                           \
  template void split_heads<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, int);    \
  template void merge_heads<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, int);    \
  template void attention_probs<T>(T*, const AttentionBlock&, double, RngState, T*,       \
                                   const LowCopies&);                                     \
  template void attention_grad_scores<T>(T*, T*, const T*, const AttentionBlock&, double, \
                                         RngState, const LowCopies&);
MW_ATTENTION_KERNELS(float)
MW_ATTENTION_KERNELS(double)
#undef MW_ATTENTION_KERNELS
template void split_heads<uint16_t>(const uint16_t*, uint16_t*, int64_t, int64_t, int64_t, int64_t,
                                    int);

}  // namespace mw::ops::cuda_kernels
