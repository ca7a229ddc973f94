// Causal self-attention on a fused qkv tensor, forward and backward.
//
// qkv [B, T, 3C] holds q, k, v side by side; head h of q is channels [h*hs, (h+1)*hs). Each
// (batch, head) pair is one task: scores = q k^T / sqrt(hs) through BLAS with leading dimension 3C,
// causal mask, softmax, optional dropout on the probabilities, out = p v. att [B, NH, T, T] keeps
// the pre-dropout probabilities for backward, or for 16-bit qkv each row's softmax statistics
// (Note [Low-precision attention on the host], below); the dropout mask is regenerated from its
// RngState (Note [Counter-based dropout]).

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/convert.h"
#include "core/cpu/blas.h"
#include "core/mixed_ops.h"
#include "core/ops.h"
#include "core/ops_cuda.h"
#include "core/parallel.h"

namespace mw::ops {

AttentionDims attention_dims(const Tensor& qkv, int64_t n_head) {
  MW_CHECK_T(ShapeError, qkv.dim() == 3 && qkv.size(2) % 3 == 0,
             "attention: expected qkv [B, T, 3C], got ", qkv.desc());
  const int64_t C = qkv.size(2) / 3;
  MW_CHECK_T(ShapeError, n_head > 0 && C % n_head == 0, "attention: ", C,
             " channels do not split into ", n_head, " heads");
  return {qkv.size(0), qkv.size(1), C, n_head, C / n_head};
}

int64_t cuda_attention_block_rows(int64_t B, int64_t NH, int64_t T) {
  constexpr double kScoreElements = 16777216.0;  // 2^24: 64 MiB of f32 scores
  const double per_row =
      std::max(1.0, static_cast<double>(B) * static_cast<double>(NH) * static_cast<double>(T));
  const auto fits = static_cast<int64_t>(std::min(kScoreElements / per_row, 128.0));
  return std::clamp<int64_t>(fits, 1, std::max<int64_t>(1, std::min<int64_t>(128, T)));
}

namespace {

using Dims = AttentionDims;

// Element index of (b, h, t, s) in att, the counter used for its dropout draw.
inline uint64_t att_index(const Dims& d, int64_t b, int64_t h, int64_t t, int64_t s) {
  return static_cast<uint64_t>(((b * d.NH + h) * d.T + t) * d.T + s);
}

// Note [Low-precision attention on the host]: a 16-bit qkv on cpu/sim runs the f32 kernels on
// its widened values, as every 16-bit op there does (Note [Low-precision storage]), but backward
// does not keep 16-bit probabilities: each row's softmax max and 1/sum (f32, [B, NH, T, 2]) stand
// for them, and backward recomputes the scores and the probabilities from them with the forward's
// arithmetic, so bit for bit the forward's. Rounded probabilities would put an error of
// u sum_j p |dP| (u = 2^-8 in bf16) into each row's D_t = sum_j p dP, hence into every dS of the
// row, which is not small where dP_j - D_t cancels (5% of dq in tests/precision/
// host_attention_test.cpp). Keeping the statistics costs one more small product per head in
// backward and keeps 2 floats per row instead of T halves: the [T, T] probabilities were the
// largest activation of a block at long sequences. The f32 path keeps its probabilities: there
// they are exact, and the CPU step (issue #13) would pay for the extra product.

// Scores q k^T / sqrt(hs) of one head into att [T, T], then each row's causal softmax, zeros
// above the diagonal. `stats_out` [T, 2], when given, gets each row's max and 1/sum; given
// `stats_in`, the rows are rebuilt from those instead, with the same arithmetic, hence the same
// bits.
template <typename T>
void head_softmax(const Dims& d, const T* q, T* att, const T* stats_in, T* stats_out) {
  const T scale = T(1) / std::sqrt(static_cast<T>(d.hs));
  blas_gemm<T>(false, true, d.T, d.T, d.hs, scale, q, 3 * d.C, q + d.C, 3 * d.C, T(0), att, d.T);
  for (int64_t t = 0; t < d.T; ++t) {
    T* row = att + t * d.T;
    if (stats_in) {
      const T mx = stats_in[2 * t], inv = stats_in[2 * t + 1];
      for (int64_t j = 0; j <= t; ++j) row[j] = std::exp(row[j] - mx);
      for (int64_t j = 0; j <= t; ++j) row[j] *= inv;
    } else {
      T mx = row[0];
      for (int64_t j = 1; j <= t; ++j) mx = std::max(mx, row[j]);
      double sum = 0;  // Note [Reductions accumulate in double] (layers.cpp)
      for (int64_t j = 0; j <= t; ++j) sum += (row[j] = std::exp(row[j] - mx));
      const T inv = static_cast<T>(1.0 / sum);
      for (int64_t j = 0; j <= t; ++j) row[j] *= inv;
      if (stats_out) stats_out[2 * t] = mx, stats_out[2 * t + 1] = inv;
    }
    for (int64_t j = t + 1; j < d.T; ++j) row[j] = T(0);
  }
}

// The forward of one dtype: att gets the probabilities [B, NH, T, T], or with `row_stats` the
// rows' statistics [B, NH, T, 2] (the probabilities then live in a per-task buffer).
template <typename T>
void attention_forward(const Dims& d, const Tensor& qkv, AttentionOut& r, bool row_stats,
                       double attn_dropout, RngState rng) {
  const T* pq = qkv.template data<T>();
  T* po = r.out.template data<T>();
  T* pa = r.att.template data<T>();
  const T keep_scale = static_cast<T>(1.0 / (1.0 - attn_dropout));
  parallel_for(d.B * d.NH, 1, [&](int64_t s, int64_t e) {
    std::vector<T> dropped, scratch(row_stats ? static_cast<size_t>(d.T * d.T) : 0);
    for (int64_t bh = s; bh < e; ++bh) {
      const int64_t b = bh / d.NH, h = bh % d.NH;
      const T* q = pq + b * d.T * 3 * d.C + h * d.hs;
      T* att = row_stats ? scratch.data() : pa + bh * d.T * d.T;
      head_softmax<T>(d, q, att, nullptr, row_stats ? pa + bh * d.T * 2 : nullptr);
      const T* probs = att;
      if (attn_dropout > 0) {
        dropped.assign(att, att + d.T * d.T);
        for (int64_t t = 0; t < d.T; ++t)
          for (int64_t j = 0; j <= t; ++j)
            dropped[t * d.T + j] = random_uniform(rng, att_index(d, b, h, t, j)) >= attn_dropout
                                       ? dropped[t * d.T + j] * keep_scale
                                       : T(0);
        probs = dropped.data();
      }
      blas_gemm<T>(false, false, d.T, d.hs, d.T, T(1), probs, d.T, q + 2 * d.C, 3 * d.C, T(0),
                   po + b * d.T * d.C + h * d.hs, d.C);
    }
  });
}

// The backward of one dtype, from the probabilities or (row_stats) from the rows' statistics.
template <typename T>
void attention_backward_kernel(const Dims& d, const Tensor& dout, const Tensor& qkv,
                               const Tensor& att_all, Tensor& dqkv, bool row_stats,
                               double attn_dropout, RngState rng) {
  const T* pq = qkv.template data<T>();
  const T* pd = dout.template data<T>();
  const T* pa = att_all.template data<T>();
  T* pg = dqkv.template data<T>();
  const T scale = T(1) / std::sqrt(static_cast<T>(d.hs));
  const T keep_scale = static_cast<T>(1.0 / (1.0 - attn_dropout));
  parallel_for(d.B * d.NH, 1, [&](int64_t s, int64_t e) {
    std::vector<T> dp(static_cast<size_t>(d.T * d.T)), dropped;
    std::vector<T> scratch(row_stats ? static_cast<size_t>(d.T * d.T) : 0);
    for (int64_t bh = s; bh < e; ++bh) {
      const int64_t b = bh / d.NH, h = bh % d.NH;
      const int64_t base = b * d.T * 3 * d.C + h * d.hs;
      const T* q = pq + base;
      const T* k = q + d.C;
      const T* v = q + 2 * d.C;
      T* dq = pg + base;
      T* dk = dq + d.C;
      T* dv = dq + 2 * d.C;
      const T* att = pa + bh * d.T * d.T;
      if (row_stats) {
        head_softmax<T>(d, q, scratch.data(), pa + bh * d.T * 2, nullptr);
        att = scratch.data();
      }
      const T* dO = pd + b * d.T * d.C + h * d.hs;
      // keep[t, j]: the dropout multiplier (0 or 1/(1-p)) of probability (t, j).
      auto keep = [&](int64_t t, int64_t j) {
        return random_uniform(rng, att_index(d, b, h, t, j)) >= attn_dropout ? keep_scale : T(0);
      };
      const T* probs = att;
      if (attn_dropout > 0) {
        dropped.assign(att, att + d.T * d.T);
        for (int64_t t = 0; t < d.T; ++t)
          for (int64_t j = 0; j <= t; ++j) dropped[t * d.T + j] *= keep(t, j);
        probs = dropped.data();
      }
      // dv = probs^T @ dO
      blas_gemm<T>(true, false, d.T, d.hs, d.T, T(1), probs, d.T, dO, d.C, T(0), dv, 3 * d.C);
      // dp = dO @ v^T, then through dropout and softmax
      blas_gemm<T>(false, true, d.T, d.T, d.hs, T(1), dO, d.C, v, 3 * d.C, T(0), dp.data(), d.T);
      for (int64_t t = 0; t < d.T; ++t) {
        T* row = dp.data() + t * d.T;
        const T* a = att + t * d.T;
        if (attn_dropout > 0)
          for (int64_t j = 0; j <= t; ++j) row[j] *= keep(t, j);
        double dot_sum = 0;  // Note [Reductions accumulate in double] (layers.cpp)
        for (int64_t j = 0; j <= t; ++j)
          dot_sum += static_cast<double>(row[j]) * static_cast<double>(a[j]);
        const T dot = static_cast<T>(dot_sum);
        for (int64_t j = 0; j <= t; ++j) row[j] = a[j] * (row[j] - dot) * scale;
        for (int64_t j = t + 1; j < d.T; ++j) row[j] = T(0);
      }
      // dq = ds @ k ; dk = ds^T @ q
      blas_gemm<T>(false, false, d.T, d.hs, d.T, T(1), dp.data(), d.T, k, 3 * d.C, T(0), dq,
                   3 * d.C);
      blas_gemm<T>(true, false, d.T, d.hs, d.T, T(1), dp.data(), d.T, q, 3 * d.C, T(0), dk,
                   3 * d.C);
    }
  });
}

AttentionOut host_attention(const Tensor& qkv_in, int64_t n_head, double attn_dropout, RngState rng,
                            bool row_stats) {
  check_float("attention", qkv_in);
  Tensor qkv = qkv_in.contiguous();
  const Dims d = attention_dims(qkv, n_head);
  AttentionOut r{Tensor::empty({d.B, d.T, d.C}, qkv.dtype(), qkv.device()),
                 Tensor::empty({d.B, d.NH, d.T, row_stats ? 2 : d.T}, qkv.dtype(), qkv.device())};
  dispatch_float(qkv.dtype(), "attention", [&]<typename T>() {
    attention_forward<T>(d, qkv, r, row_stats, attn_dropout, rng);
  });
  return r;
}

Tensor host_attention_backward(const Tensor& dout_in, const Tensor& qkv_in, const Tensor& att_in,
                               int64_t n_head, double attn_dropout, RngState rng, bool row_stats) {
  Tensor qkv = qkv_in.contiguous(), dout = dout_in.contiguous(), att = att_in.contiguous();
  const Dims d = attention_dims(qkv, n_head);
  const Shape want{d.B, d.NH, d.T, row_stats ? 2 : d.T};
  MW_CHECK_T(ShapeError, att.shape() == want && att.dtype() == qkv.dtype(),
             "attention_backward: expected ", row_stats ? "row statistics" : "probabilities", " ",
             shape_str(want), " ", dtype_name(qkv.dtype()), ", got ", att.desc());
  Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device());
  dispatch_float(qkv.dtype(), "attention_backward", [&]<typename T>() {
    attention_backward_kernel<T>(d, dout, qkv, att, dqkv, row_stats, attn_dropout, rng);
  });
  return dqkv;
}

}  // namespace

AttentionOut attention(const Tensor& qkv_in, int64_t n_head, double attn_dropout, RngState rng) {
  // CUDA takes bf16/f16 qkv as they are (Note [Low-precision attention on CUDA]).
  if (qkv_in.device().is_cuda() && is_low_precision(qkv_in.dtype()))
    return cuda::attention(qkv_in, n_head, attn_dropout, rng);
  if (mixed::any_low({&qkv_in})) return mixed::attention(qkv_in, n_head, attn_dropout, rng);
  check_float("attention", qkv_in);
  if (qkv_in.device().is_cuda()) return cuda::attention(qkv_in, n_head, attn_dropout, rng);
  return host_attention(qkv_in, n_head, attn_dropout, rng, false);
}

AttentionOut attention_row_stats(const Tensor& qkv, int64_t n_head, double attn_dropout,
                                 RngState rng) {
  return host_attention(qkv, n_head, attn_dropout, rng, true);
}

Tensor attention_backward(const Tensor& dout_in, const Tensor& qkv_in, const Tensor& att_in,
                          int64_t n_head, double attn_dropout, RngState rng) {
  if (qkv_in.device().is_cuda() && is_low_precision(qkv_in.dtype()) &&
      dout_in.dtype() == qkv_in.dtype())
    return cuda::attention_backward(dout_in, qkv_in, att_in, n_head, attn_dropout, rng);
  if (mixed::any_low({&dout_in, &qkv_in, &att_in}))
    return mixed::attention_backward(dout_in, qkv_in, att_in, n_head, attn_dropout, rng);
  if (qkv_in.device().is_cuda())
    return cuda::attention_backward(dout_in, qkv_in, att_in, n_head, attn_dropout, rng);
  return host_attention_backward(dout_in, qkv_in, att_in, n_head, attn_dropout, rng, false);
}

Tensor attention_backward_row_stats(const Tensor& dout, const Tensor& qkv, const Tensor& stats,
                                    int64_t n_head, double attn_dropout, RngState rng) {
  return host_attention_backward(dout, qkv, stats, n_head, attn_dropout, rng, true);
}

}  // namespace mw::ops
