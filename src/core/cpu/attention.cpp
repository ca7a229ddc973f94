// Causal self-attention on a fused qkv tensor, forward and backward.
//
// qkv [B, T, 3C] holds q, k, v side by side; head h of q is channels [h*hs, (h+1)*hs). Each
// (batch, head) pair is one task: scores = q k^T / sqrt(hs) through BLAS with leading dimension 3C,
// causal mask, softmax, optional dropout on the probabilities, out = p v. att [B, NH, T, 2] keeps
// each row's softmax max and 1/sum, from which backward recomputes the probabilities (Note [Row
// statistics instead of probabilities], below); the dropout mask is regenerated from its RngState
// (Note [Counter-based dropout]).

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/convert.h"
#include "core/cpu/blas.h"
#include "core/cpu/fast_math.h"
#include "core/cpu/row_softmax.h"
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

// Note [Row statistics instead of probabilities]: backward on cpu/sim does not keep the
// probabilities [B, NH, T, T]: forward keeps each row's softmax max and 1/sum, att [B, NH, T, 2]
// in the qkv's dtype (f32 for a widened 16-bit qkv), and backward recomputes the scores and the
// probabilities from them with the forward's arithmetic, so bit for bit the forward's. Memory: 2
// values per row instead of T, where the probabilities were the largest activation of a block at
// long sequences (GPT-2 small B4 T512 fp32: peak RSS 3974 -> 3383 MiB). Time: one more small
// product per head in backward, paid back by the vectorised exp (fast::exp, Note [Wider versions of
// f32 loops]) and the blocked products below (Note [Causal products by blocks]). Precision: a
// 16-bit qkv kept bf16 probabilities before, and backward took each row's D_t = sum_j p dP from the
// rounded values: an error of u sum_j p |dP| (u = 2^-8 in bf16) in every dS of the row, not small
// where dP_j - D_t cancels (5% of some dq in tests/precision/host_attention_test.cpp); recomputed
// in f32, D_t has f32's error. CUDA keeps the per-row log-sum-exp for the same reasons (Note
// [Attention on CUDA by query blocks]).

// Note [Causal products by blocks]: the probabilities and dS of a head are lower triangular, so
// each product that has them as an operand, or makes them, runs by blocks of kCausalBlock rows
// (or columns), each over the part below the diagonal only: row block [r0, r1) of the scores
// needs keys [0, r1), of P V the same keys; column block [c0, c1) of P^T dO needs queries
// [c0, T). That is (n+1)/2n of the full products for n = T/64 blocks (75% at T 128, 53% at
// T 1024); 64-row blocks measured as fast as 32 at T 512 and faster at T 128 (fewer, larger
// calls). Entries above the diagonal are never read: the softmax and its backward write zeros
// there before any product reads those rows. GPT-2 small B4 fp32, attention forward + backward
// per step, with the extra product of Note [Row statistics instead of probabilities] and the
// softmax rows' max and sums in lanes (row_softmax.h): T 128 about 152 against 160-168 ms, T 512
// 2480 -> 1733 ms (`gpt2_bench --torch off`, per-op profile, against 3d9fd27).
constexpr int64_t kCausalBlock = 64;

// c[r0:r1, 0:r1] = alpha a[r0:r1] b[0:r1]^T for each row block: the scores (a = q, b = k) and
// dP (a = dO, b = v), [T, hs] operands with leading dimensions lda, ldb; c is [T, T].
template <typename T>
void causal_abt(const Dims& d, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T* c) {
  for (int64_t r0 = 0; r0 < d.T; r0 += kCausalBlock) {
    const int64_t r1 = std::min(d.T, r0 + kCausalBlock);
    blas_gemm<T>(false, true, r1 - r0, r1, d.hs, alpha, a + r0 * lda, lda, b, ldb, T(0),
                 c + r0 * d.T, d.T);
  }
}

// y[r0:r1] = l[r0:r1, 0:r1] x[0:r1] for each row block: out = P v and dq = dS k.
template <typename T>
void causal_lx(const Dims& d, const T* l, const T* x, int64_t ldx, T* y, int64_t ldy) {
  for (int64_t r0 = 0; r0 < d.T; r0 += kCausalBlock) {
    const int64_t r1 = std::min(d.T, r0 + kCausalBlock);
    blas_gemm<T>(false, false, r1 - r0, d.hs, r1, T(1), l + r0 * d.T, d.T, x, ldx, T(0),
                 y + r0 * ldy, ldy);
  }
}

// y[c0:c1] = l[c0:T, c0:c1]^T x[c0:T] for each column block: dv = P^T dO and dk = dS^T q.
template <typename T>
void causal_ltx(const Dims& d, const T* l, const T* x, int64_t ldx, T* y, int64_t ldy) {
  for (int64_t c0 = 0; c0 < d.T; c0 += kCausalBlock) {
    const int64_t c1 = std::min(d.T, c0 + kCausalBlock);
    blas_gemm<T>(true, false, c1 - c0, d.hs, d.T - c0, T(1), l + c0 * d.T + c0, d.T, x + c0 * ldx,
                 ldx, T(0), y + c0 * ldy, ldy);
  }
}

// row[j] = exp(row[j] - mx) for j < n, in place: fast::exp in f32, in three widths (Note [Wider
// versions of f32 loops]), std::exp in f64. Forward and backward make each exp here, so backward's
// are the forward's bit for bit. The forward's row max and normaliser: row_softmax.h.
MW_F32_BODY void exp_shifted_f32_body(float* row, int64_t n, float mx) {
  for (int64_t j = 0; j < n; ++j) row[j] = fast::exp(row[j] - mx);
}
MW_F32_VERSIONS(void, exp_shifted_f32, (float* row, int64_t n, float mx), (row, n, mx))
MW_F32_BODY float row_max_f32_body(const float* row, int64_t n) { return row_max(row, n); }
MW_F32_VERSIONS(float, row_max_f32, (const float* row, int64_t n), (row, n))
MW_F32_BODY double double_lane_sum_f32_body(const float* exps, int64_t n) {
  return lane_sum<double>(exps, n);
}
MW_F32_VERSIONS(double, double_lane_sum_f32, (const float* exps, int64_t n), (exps, n))
template <typename T>
void exp_shifted(T* row, int64_t n, T mx) {
  if constexpr (std::is_same_v<T, float>)
    exp_shifted_f32(row, n, mx);
  else
    for (int64_t j = 0; j < n; ++j) row[j] = fast::exp_t(row[j] - mx);
}

// Scores q k^T / sqrt(hs) of one head into p [T, T], then each row's causal softmax, zeros above
// the diagonal. Forward (stats_in null) writes each row's max and 1/sum to stats_out [T, 2];
// backward rebuilds the rows from stats_in with the same arithmetic, hence the same bits.
template <typename T>
void head_softmax(const Dims& d, const T* q, T* p, const T* stats_in, T* stats_out) {
  const T scale = T(1) / std::sqrt(static_cast<T>(d.hs));
  causal_abt(d, scale, q, 3 * d.C, q + d.C, 3 * d.C, p);
  for (int64_t t = 0; t < d.T; ++t) {
    T* row = p + t * d.T;
    T inv;
    if (stats_in) {
      exp_shifted(row, t + 1, stats_in[2 * t]);
      inv = stats_in[2 * t + 1];
    } else {
      T mx;
      double sum;
      if constexpr (std::is_same_v<T, float>) {
        exp_shifted(row, t + 1, mx = row_max_f32(row, t + 1));
        sum = double_lane_sum_f32(row, t + 1);
      } else {
        exp_shifted(row, t + 1, mx = row_max(row, t + 1));
        sum = lane_sum<double>(row, t + 1);
      }
      inv = static_cast<T>(1.0 / sum);
      stats_out[2 * t] = mx, stats_out[2 * t + 1] = inv;
    }
    for (int64_t j = 0; j <= t; ++j) row[j] *= inv;
    std::fill(row + t + 1, row + d.T, T(0));
  }
}

// The dropout of one head's probabilities: (t, j) is kept, scaled by 1/(1-p), when its draw is
// at least p (Note [Counter-based dropout]); forward and backward draw the same. Backward also
// takes each kept entry's factor, 1/(1-p) or 0, in `factor` [T, T] (below the diagonal) for dP,
// so each entry is drawn once per pass.
template <typename T>
void drop_head(const Dims& d, int64_t b, int64_t h, const T* p, std::vector<T>& dropped,
               double attn_dropout, RngState rng, std::vector<T>* factor = nullptr) {
  const T keep_scale = static_cast<T>(1.0 / (1.0 - attn_dropout));
  dropped.assign(p, p + d.T * d.T);
  if (factor) factor->resize(dropped.size());
  for (int64_t t = 0; t < d.T; ++t)
    for (int64_t j = 0; j <= t; ++j) {
      const bool keep = random_uniform(rng, att_index(d, b, h, t, j)) >= attn_dropout;
      dropped[t * d.T + j] = keep ? dropped[t * d.T + j] * keep_scale : T(0);
      if (factor) (*factor)[t * d.T + j] = keep ? keep_scale : T(0);
    }
}

template <typename T>
void attention_forward(const Dims& d, const Tensor& qkv, AttentionOut& r, double attn_dropout,
                       RngState rng) {
  const T* pq = qkv.template data<T>();
  T* po = r.out.template data<T>();
  T* stats = r.att.template data<T>();
  parallel_for(d.B * d.NH, 1, [&](int64_t s, int64_t e) {
    std::vector<T> p(static_cast<size_t>(d.T * d.T)), dropped;
    for (int64_t bh = s; bh < e; ++bh) {
      const int64_t b = bh / d.NH, h = bh % d.NH;
      const T* q = pq + b * d.T * 3 * d.C + h * d.hs;
      head_softmax<T>(d, q, p.data(), nullptr, stats + bh * d.T * 2);
      const T* probs = p.data();
      if (attn_dropout > 0) {
        drop_head(d, b, h, p.data(), dropped, attn_dropout, rng);
        probs = dropped.data();
      }
      causal_lx(d, probs, q + 2 * d.C, 3 * d.C, po + b * d.T * d.C + h * d.hs, d.C);
    }
  });
}

// One row of dS = P o (dP - D_t) / sqrt(hs) over row[0, n) (holding dO v^T, the dropout mask
// already applied), with D_t = sum_j p dP in eight double lanes (Note [Reductions accumulate in
// double], layers.cpp; the products of two floats are exact in double).
template <typename T>
inline void softmax_backward_row(const T* a, T* row, int64_t n, T scale) {
  constexpr int64_t kLanes = 8;
  double lane[kLanes] = {};
  const int64_t nmain = n / kLanes * kLanes;
  for (int64_t j = 0; j < nmain; j += kLanes)
    for (int64_t k = 0; k < kLanes; ++k)
      lane[k] += static_cast<double>(row[j + k]) * static_cast<double>(a[j + k]);
  double dot_sum = 0;
  for (int64_t k = 0; k < kLanes; ++k) dot_sum += lane[k];
  for (int64_t j = nmain; j < n; ++j)
    dot_sum += static_cast<double>(row[j]) * static_cast<double>(a[j]);
  const T dot = static_cast<T>(dot_sum);
  for (int64_t j = 0; j < n; ++j) row[j] = a[j] * (row[j] - dot) * scale;
}
MW_F32_BODY void softmax_backward_row_f32_body(const float* a, float* row, int64_t n, float scale) {
  softmax_backward_row(a, row, n, scale);
}
MW_F32_VERSIONS(void, softmax_backward_row_f32,
                (const float* a, float* row, int64_t n, float scale), (a, row, n, scale))

// dS over dp [T, T], row by row, zeros above the diagonal.
template <typename T>
void softmax_backward_rows(const Dims& d, const T* p, T* dp) {
  const T scale = T(1) / std::sqrt(static_cast<T>(d.hs));
  for (int64_t t = 0; t < d.T; ++t) {
    T* row = dp + t * d.T;
    if constexpr (std::is_same_v<T, float>)
      softmax_backward_row_f32(p + t * d.T, row, t + 1, scale);
    else
      softmax_backward_row(p + t * d.T, row, t + 1, scale);
    std::fill(row + t + 1, row + d.T, T(0));
  }
}

template <typename T>
void attention_backward_kernel(const Dims& d, const Tensor& dout, const Tensor& qkv,
                               const Tensor& stats_all, Tensor& dqkv, double attn_dropout,
                               RngState rng) {
  const T* pq = qkv.template data<T>();
  const T* pd = dout.template data<T>();
  const T* stats = stats_all.template data<T>();
  T* pg = dqkv.template data<T>();
  parallel_for(d.B * d.NH, 1, [&](int64_t s, int64_t e) {
    std::vector<T> p(static_cast<size_t>(d.T * d.T)), dp(p.size()), dropped, factor;
    for (int64_t bh = s; bh < e; ++bh) {
      const int64_t b = bh / d.NH, h = bh % d.NH;
      const int64_t base = b * d.T * 3 * d.C + h * d.hs;
      const T *q = pq + base, *k = q + d.C, *v = q + 2 * d.C;
      T *dq = pg + base, *dk = dq + d.C, *dv = dq + 2 * d.C;
      const T* dO = pd + b * d.T * d.C + h * d.hs;
      head_softmax<T>(d, q, p.data(), stats + bh * d.T * 2, nullptr);
      const T* probs = p.data();
      if (attn_dropout > 0) {
        drop_head(d, b, h, p.data(), dropped, attn_dropout, rng, &factor);
        probs = dropped.data();
      }
      // dv = probs^T @ dO
      causal_ltx(d, probs, dO, d.C, dv, 3 * d.C);
      // dp = dO @ v^T, then through dropout (the same draws) and softmax
      causal_abt(d, T(1), dO, d.C, v, 3 * d.C, dp.data());
      if (attn_dropout > 0)
        for (int64_t t = 0; t < d.T; ++t)
          for (int64_t j = 0; j <= t; ++j) dp[t * d.T + j] *= factor[t * d.T + j];
      softmax_backward_rows(d, p.data(), dp.data());
      // dq = ds @ k ; dk = ds^T @ q
      causal_lx(d, dp.data(), k, 3 * d.C, dq, 3 * d.C);
      causal_ltx(d, dp.data(), q, 3 * d.C, dk, 3 * d.C);
    }
  });
}

}  // namespace

AttentionOut attention(const Tensor& qkv_in, int64_t n_head, double attn_dropout, RngState rng) {
  // CUDA takes bf16/f16 qkv as they are (Note [Low-precision attention on CUDA]).
  if (qkv_in.device().is_cuda() && is_low_precision(qkv_in.dtype()))
    return cuda::attention(qkv_in, n_head, attn_dropout, rng);
  if (mixed::any_low({&qkv_in})) return mixed::attention(qkv_in, n_head, attn_dropout, rng);
  check_float("attention", qkv_in);
  if (qkv_in.device().is_cuda()) return cuda::attention(qkv_in, n_head, attn_dropout, rng);
  Tensor qkv = qkv_in.contiguous();
  const Dims d = attention_dims(qkv, n_head);
  AttentionOut r{Tensor::empty({d.B, d.T, d.C}, qkv.dtype(), qkv.device()),
                 Tensor::empty({d.B, d.NH, d.T, 2}, qkv.dtype(), qkv.device())};
  dispatch_float(qkv.dtype(), "attention",
                 [&]<typename T>() { attention_forward<T>(d, qkv, r, attn_dropout, rng); });
  return r;
}

Tensor attention_backward(const Tensor& dout_in, const Tensor& qkv_in, const Tensor& att_in,
                          int64_t n_head, double attn_dropout, RngState rng) {
  MW_CHECK_T(ShapeError,  // dout is [B, T, C] for qkv [B, T, 3C] (a shorter one was read past)
             dout_in.dim() == 3 && qkv_in.dim() == 3 && dout_in.size(0) == qkv_in.size(0) &&
                 dout_in.size(1) == qkv_in.size(1) && 3 * dout_in.size(2) == qkv_in.size(2),
             "attention_backward: dout ", dout_in.desc(), " for qkv ", qkv_in.desc());
  if (qkv_in.device().is_cuda() && is_low_precision(qkv_in.dtype()) &&
      dout_in.dtype() == qkv_in.dtype())
    return cuda::attention_backward(dout_in, qkv_in, att_in, n_head, attn_dropout, rng);
  if (mixed::any_low({&dout_in, &qkv_in, &att_in}))
    return mixed::attention_backward(dout_in, qkv_in, att_in, n_head, attn_dropout, rng);
  if (qkv_in.device().is_cuda())
    return cuda::attention_backward(dout_in, qkv_in, att_in, n_head, attn_dropout, rng);
  Tensor qkv = qkv_in.contiguous(), dout = dout_in.contiguous(), att = att_in.contiguous();
  const Dims d = attention_dims(qkv, n_head);
  const Shape want{d.B, d.NH, d.T, 2};
  MW_CHECK_T(ShapeError, att.shape() == want && att.dtype() == qkv.dtype(),
             "attention_backward: expected the rows' softmax statistics ", shape_str(want), " ",
             dtype_name(qkv.dtype()), ", got ", att.desc());
  Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device());
  dispatch_float(qkv.dtype(), "attention_backward", [&]<typename T>() {
    attention_backward_kernel<T>(d, dout, qkv, att, dqkv, attn_dropout, rng);
  });
  return dqkv;
}

}  // namespace mw::ops
