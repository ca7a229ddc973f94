// Fused causal self-attention on CUDA: forward and backward without the T x T matrix.
//
// Note [Flash attention on CUDA]: qkv [B, T, 3C] as on the CPU (attention.cpp). Forward gives one
// thread to each query row t of one (batch, head); a block of kRows such threads walks the keys
// 0..t in tiles of Bc keys staged in shared memory, keeping the running max m, the running sum
// l = sum_j exp(s_j - m) and the running output acc = sum_j keep_j exp(s_j - m) v_j (online
// softmax, FlashAttention's recurrence). It writes out = acc * keep_scale / l and the row's
// log-sum-exp lse = m + log(l) [B, NH, T], the only thing backward keeps. Attention dropout draws
// the same random_uniform(rng, ((b*NH + h)*T + t)*T + s) as the CPU, on the normalised
// probabilities, so masks agree across devices.
//
// Backward recomputes p_ts = exp(s_ts - lse_t) tile by tile in two kernels, with no atomics:
//   rows kernel (one thread per query t):  D_t = sum_s p_ts keep_ts (dO_t . v_s), then
//                                          dq_t = scale * sum_s p_ts (keep_ts dO_t.v_s - D_t) k_s;
//   cols kernel (one thread per key s):    dv_s = sum_{t>=s} p_ts keep_ts dO_t,
//                                          dk_s = scale * sum_{t>=s} p_ts (keep_ts dO_t.v_s - D_t)
//                                          q_t.
// This is the CPU's formula (dot = D) evaluated per element. Each output element is written by one
// thread summing in key (or query) order: deterministic. Simple rather than fast: scalar FMAs, no
// tensor cores; per-thread arrays of MaxHs elements (head size rounded up to 32, 64 or 128).
#include <cmath>

#include "core/cuda/common.cuh"

namespace mw::ops::cuda_kernels {
namespace {

constexpr int kRows = 64;  // threads (query rows, or key rows in the cols kernel) per block

// Keys (or queries) per shared-memory tile: 2 tiles of Bc x 128 elements stay under 48 KiB.
template <typename T>
__host__ __device__ constexpr int tile_cols() {
  return sizeof(T) == 4 ? 32 : 16;
}

struct Geometry {
  int64_t T, C, NH, hs, q_tiles;
  int64_t row_stride;  // 3C: elements between positions in qkv
};

// Loads rows [r0, r0 + n) of one head's q, k, v or dO (src points at row 0, channel 0 of the
// head; rows src_row_stride apart) into tile[n][MaxHs]: zero past T and in columns hs..MaxHs-1,
// so every element the unrolled loops read is initialised.
template <typename T, int MaxHs>
__device__ void load_tile(T (*tile)[MaxHs], const T* src, int64_t src_row_stride, int64_t r0, int n,
                          int64_t T_len, int64_t hs) {
  for (int idx = threadIdx.x; idx < n * MaxHs; idx += blockDim.x) {
    const int j = idx / MaxHs, d = idx % MaxHs;
    const int64_t r = r0 + j;
    tile[j][d] = r < T_len && d < hs ? src[r * src_row_stride + d] : T(0);
  }
}

template <typename T, int MaxHs>
__device__ T dot_row(const T* a, const T* b, int64_t hs) {
  T s = 0;
#pragma unroll
  for (int d = 0; d < MaxHs; ++d)
    if (d < hs) s += a[d] * b[d];
  return s;
}

// keep_scale where element (bh, t, s) survives attention dropout, 0 where dropped; 1 without it.
template <typename T>
__device__ T keep_of(double p, T keep_scale, RngState rng, int64_t bh, int64_t T_len, int64_t t,
                     int64_t s) {
  if (p <= 0) return T(1);
  const uint64_t index = static_cast<uint64_t>((bh * T_len + t) * T_len + s);
  return random_uniform(rng, index) >= p ? keep_scale : T(0);
}

template <typename T, int MaxHs>
__global__ void __launch_bounds__(kRows)
    forward_kernel(const T* qkv, Geometry g, double p, RngState rng, T* out, T* lse) {
  constexpr int Bc = tile_cols<T>();
  __shared__ T ks[Bc][MaxHs];
  __shared__ T vs[Bc][MaxHs];
  const int64_t bh = blockIdx.x / g.q_tiles, q0 = (blockIdx.x % g.q_tiles) * kRows;
  const int64_t b = bh / g.NH, h = bh % g.NH;
  const T* base = qkv + b * g.T * g.row_stride + h * g.hs;
  const int64_t t = q0 + threadIdx.x;
  const bool active = t < g.T;
  const T scale = T(1) / dev_sqrt(static_cast<T>(g.hs));
  const T keep_scale = static_cast<T>(1.0 / (1.0 - p));
  T q[MaxHs], acc[MaxHs];
#pragma unroll
  for (int d = 0; d < MaxHs; ++d) {
    q[d] = active && d < g.hs ? base[t * g.row_stride + d] : T(0);
    acc[d] = 0;
  }
  T m = -INFINITY, l = 0;
  const int64_t key_end = q0 + kRows < g.T ? q0 + kRows : g.T;
  for (int64_t k0 = 0; k0 < key_end; k0 += Bc) {
    __syncthreads();
    load_tile<T, MaxHs>(ks, base + g.C, g.row_stride, k0, Bc, g.T, g.hs);
    load_tile<T, MaxHs>(vs, base + 2 * g.C, g.row_stride, k0, Bc, g.T, g.hs);
    __syncthreads();
    if (!active) continue;
    for (int j = 0; j < Bc && k0 + j <= t; ++j) {
      const T s = dot_row<T, MaxHs>(q, ks[j], g.hs) * scale;
      if (s > m) {
        const T corr = dev_exp(m - s);  // 0 on the first key (m = -inf)
        l *= corr;
#pragma unroll
        for (int d = 0; d < MaxHs; ++d) acc[d] *= corr;
        m = s;
      }
      const T e = dev_exp(s - m);
      l += e;
      const T pk = e * keep_of<T>(p, T(1), rng, bh, g.T, t, k0 + j);
      if (pk != T(0)) {
#pragma unroll
        for (int d = 0; d < MaxHs; ++d) acc[d] += pk * vs[j][d];
      }
    }
  }
  if (!active) return;
  const T f = (p > 0 ? keep_scale : T(1)) / l;
  T* o = out + (b * g.T + t) * g.C + h * g.hs;
#pragma unroll
  for (int d = 0; d < MaxHs; ++d)
    if (d < g.hs) o[d] = acc[d] * f;
  lse[bh * g.T + t] = m + dev_log(l);
}

// One thread per query row: D_t into dsum, dq_t into dqkv.
template <typename T, int MaxHs>
__global__ void __launch_bounds__(kRows)
    backward_rows_kernel(const T* dout, const T* qkv, const T* lse, Geometry g, double p,
                         RngState rng, T* dqkv, T* dsum) {
  constexpr int Bc = tile_cols<T>();
  __shared__ T ks[Bc][MaxHs];
  __shared__ T vs[Bc][MaxHs];
  const int64_t bh = blockIdx.x / g.q_tiles, q0 = (blockIdx.x % g.q_tiles) * kRows;
  const int64_t b = bh / g.NH, h = bh % g.NH;
  const T* base = qkv + b * g.T * g.row_stride + h * g.hs;
  const int64_t t = q0 + threadIdx.x;
  const bool active = t < g.T;
  const T scale = T(1) / dev_sqrt(static_cast<T>(g.hs));
  const T keep_scale = static_cast<T>(1.0 / (1.0 - p));
  const T* dO = dout + (b * g.T + (active ? t : 0)) * g.C + h * g.hs;
  T q[MaxHs], dov[MaxHs], dq[MaxHs];
#pragma unroll
  for (int d = 0; d < MaxHs; ++d) {
    q[d] = active && d < g.hs ? base[t * g.row_stride + d] : T(0);
    dov[d] = active && d < g.hs ? dO[d] : T(0);
    dq[d] = 0;
  }
  const T row_lse = active ? lse[bh * g.T + t] : T(0);
  const int64_t key_end = q0 + kRows < g.T ? q0 + kRows : g.T;
  T D = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t k0 = 0; k0 < key_end; k0 += Bc) {
      __syncthreads();
      load_tile<T, MaxHs>(ks, base + g.C, g.row_stride, k0, Bc, g.T, g.hs);
      load_tile<T, MaxHs>(vs, base + 2 * g.C, g.row_stride, k0, Bc, g.T, g.hs);
      __syncthreads();
      if (!active) continue;
      for (int j = 0; j < Bc && k0 + j <= t; ++j) {
        const T pr = dev_exp(dot_row<T, MaxHs>(q, ks[j], g.hs) * scale - row_lse);
        const T dp = dot_row<T, MaxHs>(dov, vs[j], g.hs) *
                     keep_of<T>(p, keep_scale, rng, bh, g.T, t, k0 + j);
        if (pass == 0) {
          D += pr * dp;
        } else {
          const T ds = pr * (dp - D) * scale;
#pragma unroll
          for (int d = 0; d < MaxHs; ++d) dq[d] += ds * ks[j][d];
        }
      }
    }
  }
  if (!active) return;
  dsum[bh * g.T + t] = D;
  T* o = dqkv + (b * g.T + t) * g.row_stride + h * g.hs;
#pragma unroll
  for (int d = 0; d < MaxHs; ++d)
    if (d < g.hs) o[d] = dq[d];
}

// One thread per key row s: dk_s and dv_s into dqkv. q_tiles counts tiles of kRows keys here.
template <typename T, int MaxHs>
__global__ void __launch_bounds__(kRows)
    backward_cols_kernel(const T* dout, const T* qkv, const T* lse, const T* dsum, Geometry g,
                         double p, RngState rng, T* dqkv) {
  constexpr int Bc = tile_cols<T>();
  __shared__ T qs[Bc][MaxHs];
  __shared__ T dos[Bc][MaxHs];
  __shared__ T lses[Bc];
  __shared__ T ds_[Bc];
  const int64_t bh = blockIdx.x / g.q_tiles, s0 = (blockIdx.x % g.q_tiles) * kRows;
  const int64_t b = bh / g.NH, h = bh % g.NH;
  const T* base = qkv + b * g.T * g.row_stride + h * g.hs;
  const T* dbase = dout + b * g.T * g.C + h * g.hs;
  const int64_t s = s0 + threadIdx.x;
  const bool active = s < g.T;
  const T scale = T(1) / dev_sqrt(static_cast<T>(g.hs));
  const T keep_scale = static_cast<T>(1.0 / (1.0 - p));
  T k[MaxHs], v[MaxHs], dk[MaxHs], dv[MaxHs];
#pragma unroll
  for (int d = 0; d < MaxHs; ++d) {
    k[d] = active && d < g.hs ? base[s * g.row_stride + g.C + d] : T(0);
    v[d] = active && d < g.hs ? base[s * g.row_stride + 2 * g.C + d] : T(0);
    dk[d] = 0;
    dv[d] = 0;
  }
  for (int64_t t0 = s0; t0 < g.T; t0 += Bc) {
    __syncthreads();
    load_tile<T, MaxHs>(qs, base, g.row_stride, t0, Bc, g.T, g.hs);
    load_tile<T, MaxHs>(dos, dbase, g.C, t0, Bc, g.T, g.hs);
    for (int j = threadIdx.x; j < Bc; j += blockDim.x) {
      lses[j] = t0 + j < g.T ? lse[bh * g.T + t0 + j] : T(0);
      ds_[j] = t0 + j < g.T ? dsum[bh * g.T + t0 + j] : T(0);
    }
    __syncthreads();
    if (!active) continue;
    for (int i = 0; i < Bc && t0 + i < g.T; ++i) {
      const int64_t t = t0 + i;
      if (t < s) continue;
      const T pr = dev_exp(dot_row<T, MaxHs>(qs[i], k, g.hs) * scale - lses[i]);
      const T keep = keep_of<T>(p, keep_scale, rng, bh, g.T, t, s);
      const T pk = pr * keep;
      const T ds = pr * (dot_row<T, MaxHs>(dos[i], v, g.hs) * keep - ds_[i]) * scale;
#pragma unroll
      for (int d = 0; d < MaxHs; ++d) {
        dv[d] += pk * dos[i][d];
        dk[d] += ds * qs[i][d];
      }
    }
  }
  if (!active) return;
  T* o = dqkv + (b * g.T + s) * g.row_stride + h * g.hs;
#pragma unroll
  for (int d = 0; d < MaxHs; ++d) {
    if (d < g.hs) {
      o[g.C + d] = dk[d];
      o[2 * g.C + d] = dv[d];
    }
  }
}

Geometry geometry(const AttentionDims& d) {
  return {d.T, d.C, d.NH, d.hs, (d.T + kRows - 1) / kRows, 3 * d.C};
}

unsigned blocks(const AttentionDims& d, const Geometry& g) {
  return static_cast<unsigned>(d.B * d.NH * g.q_tiles);
}

// Calls f.template operator()<MaxHs>() with the smallest supported MaxHs >= hs (checked by the
// caller against kMaxHeadSize).
template <typename F>
void dispatch_head_size(int64_t hs, F&& f) {
  if (hs <= 32)
    f.template operator()<32>();
  else if (hs <= 64)
    f.template operator()<64>();
  else
    f.template operator()<128>();
}

template <typename T>
struct ForwardLaunch {
  const T* qkv;
  Geometry g;
  unsigned grid;
  double p;
  RngState rng;
  T *out, *lse;
  template <int MaxHs>
  void operator()() const {
    forward_kernel<T, MaxHs><<<grid, kRows>>>(qkv, g, p, rng, out, lse);
  }
};

template <typename T>
struct BackwardLaunch {
  const T *dout, *qkv, *lse;
  Geometry g;
  unsigned grid;
  double p;
  RngState rng;
  T *dqkv, *dsum;
  template <int MaxHs>
  void operator()() const {
    backward_rows_kernel<T, MaxHs><<<grid, kRows>>>(dout, qkv, lse, g, p, rng, dqkv, dsum);
    check_kernel_launch("attention_backward (rows)");
    backward_cols_kernel<T, MaxHs><<<grid, kRows>>>(dout, qkv, lse, dsum, g, p, rng, dqkv);
  }
};

}  // namespace

template <typename T>
void attention_forward(const T* qkv, AttentionDims d, double attn_dropout, RngState rng, T* out,
                       T* lse) {
  if (d.B * d.NH * d.T == 0) return;
  const Geometry g = geometry(d);
  dispatch_head_size(d.hs, ForwardLaunch<T>{qkv, g, blocks(d, g), attn_dropout, rng, out, lse});
  check_kernel_launch("attention");
}

template <typename T>
void attention_backward(const T* dout, const T* qkv, const T* lse, AttentionDims d,
                        double attn_dropout, RngState rng, T* dqkv, T* dsum) {
  if (d.B * d.NH * d.T == 0) return;
  const Geometry g = geometry(d);
  dispatch_head_size(
      d.hs, BackwardLaunch<T>{dout, qkv, lse, g, blocks(d, g), attn_dropout, rng, dqkv, dsum});
  check_kernel_launch("attention_backward (cols)");
}

template void attention_forward<float>(const float*, AttentionDims, double, RngState, float*,
                                       float*);
template void attention_forward<double>(const double*, AttentionDims, double, RngState, double*,
                                        double*);
template void attention_backward<float>(const float*, const float*, const float*, AttentionDims,
                                        double, RngState, float*, float*);
template void attention_backward<double>(const double*, const double*, const double*, AttentionDims,
                                         double, RngState, double*, double*);

}  // namespace mw::ops::cuda_kernels
