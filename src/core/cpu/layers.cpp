// Forward and backward kernels of the per-row layers: embedding, layernorm, GELU, softmax, dropout.
// Each forward sits next to its backward (llm.c's layout). Reductions across rows (weight
// gradients) are combined in fixed block order (Note [Deterministic parallelism]).
//
// Note [Reductions accumulate in double]
// Every sum of many f32 terms in the CPU kernels (layernorm's row moments and its dweight/dbias
// column sums, linear's dbias, softmax's normaliser and backward dot product, attention's,
// sum_dim, sum_to_shape, sum_all) accumulates in double and rounds once at the end (the
// attention's normaliser in eight double lanes, row_softmax.h); the cross-entropy normaliser
// sums 64-term f32 lanes per chunk and the chunks in double. A running
// f32 sum of n terms loses up to n half-ulps (typically sqrt(n)), where PyTorch's cascade sums
// lose about log n; per op (tests/accuracy) linear's dbias over 8192 rows went from 47 eps to
// 0.9, softmax backward from 49 to 2.3 (docs/accuracy.md). Cost, side by side on GPT-2 small
// shapes: layernorm forward 1.0x, layernorm backward 1.4x, linear dbias 2x (each well under 1%
// of a step). Embedding backward stays f32: it adds into the f32 table in place, and its rows get
// few terms.
#include <cmath>

#include "core/cpu/fast_math.h"
#include "core/mixed_ops.h"
#include "core/ops.h"
#include "core/ops_cuda.h"
#include "core/parallel.h"

namespace mw::ops {

namespace {
constexpr int64_t kGrain = 1 << 14;

}  // namespace

// ---------------- embedding ----------------

std::vector<int64_t> token_ids(const Tensor& ids) {
  MW_CHECK_T(ShapeError, ids.dtype() == DType::I32 || ids.dtype() == DType::I64,
             "expected i32 or i64 token ids, got ", ids.desc());
  Tensor c = ids.device().is_host_addressable() ? ids.contiguous() : ids.to(Device::cpu());
  if (ids.dtype() == DType::I64) {
    const int64_t* p = c.data<int64_t>();
    return std::vector<int64_t>(p, p + c.numel());
  }
  const int32_t* p = c.data<int32_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

Tensor embedding(const Tensor& table_in, const Tensor& ids) {
  check_float("embedding", table_in);
  MW_CHECK_T(ShapeError, table_in.dim() == 2, "embedding: table must be [V, C], got ",
             table_in.desc());
  if (table_in.device().is_cuda()) return cuda::embedding(table_in, ids);
  Tensor table = table_in.contiguous();
  const int64_t V = table.size(0), C = table.size(1);
  Shape shape = ids.shape();
  shape.push_back(C);
  Tensor out = Tensor::empty(shape, table.dtype(), table.device());
  const std::vector<int64_t> rows = token_ids(ids);
  for (size_t i = 0; i < rows.size(); ++i)
    MW_CHECK_T(InvalidArgument, rows[i] >= 0 && rows[i] < V, "embedding: token id ", rows[i],
               " at position ", i, " is outside the table's ", V,
               " rows; check the data's vocabulary");
  dispatch_float(table.dtype(), "embedding", [&]<typename T>() {
    const T* t = table.template data<T>();
    T* o = out.template data<T>();
    parallel_for(static_cast<int64_t>(rows.size()), 16, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) std::copy(t + rows[i] * C, t + (rows[i] + 1) * C, o + i * C);
    });
  });
  return out;
}

Tensor embedding_backward(const Tensor& dout, const Tensor& ids, int64_t num_rows) {
  Tensor dtable = Tensor::zeros({num_rows, dout.size(-1)}, dout.dtype(), dout.device());
  embedding_backward_into(dtable, dout, ids);
  return dtable;
}

void embedding_backward_into(Tensor& dtable, const Tensor& dout_in, const Tensor& ids) {
  if (dtable.device().is_cuda()) return cuda::embedding_backward_into(dtable, dout_in, ids);
  Tensor dout = dout_in.contiguous();
  const int64_t C = dout.size(-1);
  MW_CHECK_T(ShapeError,
             dtable.dim() == 2 && dtable.size(1) == C && dtable.is_contiguous() &&
                 dtable.dtype() == dout.dtype(),
             "embedding_backward_into: table gradient ", dtable.desc(), " does not fit ",
             dout.desc());
  const std::vector<int64_t> rows = token_ids(ids);
  // As the forward checks: an id past the table wrote outside it.
  MW_CHECK_T(ShapeError, static_cast<int64_t>(rows.size()) * C == dout.numel(),
             "embedding_backward_into: ", ids.desc(), " ids for ", dout.desc());
  for (const int64_t id : rows)
    MW_CHECK_T(InvalidArgument, id >= 0 && id < dtable.size(0), "embedding_backward_into: id ", id,
               " outside the table's ", dtable.size(0), " rows");
  dtable.bump_version();
  dispatch_float(dout.dtype(), "embedding_backward", [&]<typename T>() {
    const T* d = dout.template data<T>();
    T* g = dtable.template data<T>();
    // Each thread owns a slice of channels and adds positions in order: deterministic.
    parallel_for(C, 64, [&](int64_t cs, int64_t ce) {
      for (size_t i = 0; i < rows.size(); ++i) {
        T* gr = g + rows[i] * C;
        const T* dr = d + static_cast<int64_t>(i) * C;
        for (int64_t c = cs; c < ce; ++c) gr[c] += dr[c];
      }
    });
  });
}

// ---------------- layernorm ----------------

LayerNormOut layernorm(const Tensor& x_in, const Tensor& weight, const Tensor& bias, double eps) {
  check_float("layernorm", x_in);
  if (x_in.device().is_cuda()) return cuda::layernorm(x_in, weight, bias, eps);
  // Contiguous copies of strided ones live to the end: a temporary's data pointer was read after
  // it was freed, and the bias's copy took the weight's freed block (errors of 2.7).
  Tensor x = x_in.contiguous(), wc = weight.contiguous(), bc = bias.contiguous();
  MW_CHECK_T(ShapeError, x.dim() >= 1 && x.size(-1) > 0, "layernorm: ", x.desc(),
             " has no channels to normalise");
  const int64_t C = x.size(-1), N = x.numel() / C;
  MW_CHECK_T(ShapeError, weight.numel() == C && bias.numel() == C, "layernorm: weight ",
             weight.desc(), " and bias ", bias.desc(), " must have ", C, " elements for ",
             x.desc());
  LayerNormOut r{Tensor::empty(x.shape(), x.dtype(), x.device()),
                 Tensor::empty({N}, x.dtype(), x.device()),
                 Tensor::empty({N}, x.dtype(), x.device())};
  dispatch_float(x.dtype(), "layernorm", [&]<typename T>() {
    const T* px = x.template data<T>();
    const T* w = wc.template data<T>();
    const T* b = bc.template data<T>();
    T* po = r.out.template data<T>();
    T* pm = r.mean.template data<T>();
    T* pr = r.rstd.template data<T>();
    parallel_for(N, 8, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        const T* row = px + i * C;
        double sum = 0;  // Note [Reductions accumulate in double]
        for (int64_t c = 0; c < C; ++c) sum += static_cast<double>(row[c]);
        const double mean = sum / static_cast<double>(C);
        double sq = 0;
        for (int64_t c = 0; c < C; ++c) {
          const double dev = static_cast<double>(row[c]) - mean;
          sq += dev * dev;
        }
        const T m = static_cast<T>(mean);
        const T rs = static_cast<T>(1.0 / std::sqrt(sq / static_cast<double>(C) + eps));
        T* o = po + i * C;
        for (int64_t c = 0; c < C; ++c) o[c] = (row[c] - m) * rs * w[c] + b[c];
        pm[i] = m;
        pr[i] = rs;
      }
    });
  });
  return r;
}

LayerNormGrads layernorm_backward(const Tensor& dout_in, const Tensor& x_in, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd) {
  if (x_in.device().is_cuda()) return cuda::layernorm_backward(dout_in, x_in, weight, mean, rstd);
  Tensor dout = dout_in.contiguous(), x = x_in.contiguous(), wc = weight.contiguous();
  MW_CHECK_T(
      ShapeError,
      x.dim() >= 1 && x.size(-1) > 0 && dout.shape() == x.shape() && wc.numel() == x.size(-1),
      "layernorm_backward: dout ", dout.desc(), ", x ", x.desc(), " and weight ", wc.desc(),
      " do not match");
  const int64_t C = x.size(-1), N = x.numel() / C;
  LayerNormGrads g{Tensor::empty(x.shape(), x.dtype(), x.device()),
                   Tensor::empty({C}, x.dtype(), x.device()),
                   Tensor::empty({C}, x.dtype(), x.device())};
  dispatch_float(x.dtype(), "layernorm_backward", [&]<typename T>() {
    const T* pd = dout.template data<T>();
    const T* px = x.template data<T>();
    const T* w = wc.template data<T>();
    const T* pm = mean.template data<T>();
    const T* pr = rstd.template data<T>();
    T* pdx = g.dx.template data<T>();
    constexpr int64_t kRowsPerBlock = 32;
    // Each block of rows writes dx for its rows and returns partial dweight/dbias sums.
    auto partials =
        parallel_reduce_blocks<std::vector<double>>(N, kRowsPerBlock, [&](int64_t s, int64_t e) {
          // Note [Reductions accumulate in double]
          std::vector<double> acc(static_cast<size_t>(2 * C), 0.0);
          for (int64_t i = s; i < e; ++i) {
            const T* d = pd + i * C;
            const T* row = px + i * C;
            const T m = pm[i], rs = pr[i];
            double dnorm_sum = 0, dnorm_norm_sum = 0;
            for (int64_t c = 0; c < C; ++c) {
              const double norm = static_cast<double>((row[c] - m) * rs);
              const double dc = static_cast<double>(d[c]);
              const double dnorm = static_cast<double>(w[c]) * dc;
              dnorm_sum += dnorm;
              dnorm_norm_sum += dnorm * norm;
              acc[c] += dc * norm;
              acc[C + c] += dc;
            }
            const T dnorm_mean = static_cast<T>(dnorm_sum / static_cast<double>(C));
            const T dnorm_norm_mean = static_cast<T>(dnorm_norm_sum / static_cast<double>(C));
            T* dx = pdx + i * C;
            for (int64_t c = 0; c < C; ++c) {
              T norm = (row[c] - m) * rs;
              dx[c] = (w[c] * d[c] - dnorm_mean - norm * dnorm_norm_mean) * rs;
            }
          }
          return acc;
        });
    std::vector<double> total(static_cast<size_t>(2 * C), 0.0);
    for (const auto& p : partials)
      for (int64_t c = 0; c < 2 * C; ++c) total[c] += p[c];
    T* dw = g.dweight.template data<T>();
    T* db = g.dbias.template data<T>();
    for (int64_t c = 0; c < C; ++c) {
      dw[c] = static_cast<T>(total[c]);
      db[c] = static_cast<T>(total[C + c]);
    }
  });
  return g;
}

// ---------------- GELU (tanh form, HF gelu_new) ----------------
//
// Note [GELU as a sigmoid]
// 0.5 x (1 + tanh(u)) = x * sigma(2u) with sigma(z) = 1 / (1 + e^-z), u = s (x + k x^3). The
// sigmoid form needs one exp and no tanh, and keeps relative accuracy everywhere: 1 + tanh(u)
// cancels for u << 0, sigma(2u) does not. Backward, with e = e^-2u and sigma = 1 / (1 + e):
// 1 + tanh = 2 sigma, sech^2 = (1 - tanh)(1 + tanh) = 4 sigma (1 - sigma), 1 - sigma = e sigma, so
// d gelu / dx = sigma + 2 x sigma (e sigma) s (1 + 3 k x^2). The exp's argument -2u is clamped
// to [-80, 80]: e stays finite (e sigma would be inf * 0) and no value is subnormal (an x86
// microcode assist per subnormal operand on many cores); beyond |u| = 40 the results are exact
// to within 1e-34 absolute. Against the tanh form with an accurate tanh it is faster forward and
// as fast backward; on GPT-2's weights after 6 steps it is as accurate within the measurement's
// noise (docs/accuracy.md).

namespace {
constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2/pi)

// GELU on 512 x 3072 elements, one thread: forward 8.1 -> 6.1 ms, backward 9.7 -> 7.3 ms with
// the AVX2 clones (Note [Wider versions of f32 loops], fast_math.h; an AVX2 VM).

template <typename T>
inline T gelu_z(T v) {  // -2u, clamped (Note [GELU as a sigmoid]); max/min keep NaN and vectorise
  const T s = static_cast<T>(kGeluScale), k = static_cast<T>(0.044715);
  return std::min(std::max(T(-2) * s * (v + k * v * v * v), T(-80)), T(80));
}

template <typename T>
inline void gelu_range(const T* px, T* po, int64_t b, int64_t e) {
  for (int64_t i = b; i < e; ++i)
    po[i] = px[i] / (T(1) + fast::exp_t(gelu_z(px[i])));  // Note [GELU as a sigmoid]
}

template <typename T>
inline void gelu_backward_range(const T* px, const T* pd, T* po, int64_t b, int64_t e) {
  const T s = static_cast<T>(kGeluScale), k = static_cast<T>(0.044715);
  for (int64_t i = b; i < e; ++i) {
    const T v = px[i], ez = fast::exp_t(gelu_z(v));
    const T sig = T(1) / (T(1) + ez);  // Note [GELU as a sigmoid]
    po[i] = (sig + T(2) * v * sig * (ez * sig) * s * (T(1) + T(3) * k * v * v)) * pd[i];
  }
}

// The f32 loops in three widths (Note [Wider versions of f32 loops]).
MW_F32_BODY void gelu_f32_body(const float* px, float* po, int64_t b, int64_t e) {
  gelu_range(px, po, b, e);
}
MW_F32_VERSIONS(void, gelu_f32, (const float* px, float* po, int64_t b, int64_t e), (px, po, b, e))
MW_F32_BODY void gelu_backward_f32_body(const float* px, const float* pd, float* po, int64_t b,
                                        int64_t e) {
  gelu_backward_range(px, pd, po, b, e);
}
MW_F32_VERSIONS(void, gelu_backward_f32,
                (const float* px, const float* pd, float* po, int64_t b, int64_t e),
                (px, pd, po, b, e))
}  // namespace

Tensor gelu(const Tensor& x_in) {
  if (mixed::any_low({&x_in})) return mixed::gelu(x_in);
  check_float("gelu", x_in);
  if (x_in.device().is_cuda()) return cuda::gelu(x_in);
  Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float(x.dtype(), "gelu", [&]<typename T>() {
    const T* px = x.template data<T>();
    T* po = out.template data<T>();
    parallel_for(x.numel(), kGrain, [&](int64_t b, int64_t e) {
      if constexpr (std::is_same_v<T, float>)
        gelu_f32(px, po, b, e);
      else
        gelu_range(px, po, b, e);
    });
  });
  return out;
}

Tensor gelu_backward(const Tensor& dout_in, const Tensor& x_in) {
  MW_CHECK_T(ShapeError, dout_in.shape() == x_in.shape(), "gelu_backward: dout ", dout_in.desc(),
             " for x ", x_in.desc());  // a shorter dout was read past its end
  if (mixed::any_low({&dout_in, &x_in})) return mixed::gelu_backward(dout_in, x_in);
  if (x_in.device().is_cuda()) return cuda::gelu_backward(dout_in, x_in);
  Tensor x = x_in.contiguous(), dout = dout_in.contiguous();
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float(x.dtype(), "gelu_backward", [&]<typename T>() {
    const T* px = x.template data<T>();
    const T* pd = dout.template data<T>();
    T* po = dx.template data<T>();
    parallel_for(x.numel(), kGrain, [&](int64_t b, int64_t e) {
      if constexpr (std::is_same_v<T, float>)
        gelu_backward_f32(px, pd, po, b, e);
      else
        gelu_backward_range(px, pd, po, b, e);
    });
  });
  return dx;
}

// ---------------- softmax over the last dim ----------------

Tensor softmax(const Tensor& x_in) {
  check_float("softmax", x_in);
  if (x_in.device().is_cuda()) return cuda::softmax(x_in);
  Tensor x = x_in.contiguous();
  const int64_t C = x.size(-1), N = x.numel() / std::max<int64_t>(C, 1);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float(x.dtype(), "softmax", [&]<typename T>() {
    const T* px = x.template data<T>();
    T* po = out.template data<T>();
    parallel_for(N, 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const T* row = px + i * C;
        T* o = po + i * C;
        T mx = row[0];
        for (int64_t c = 1; c < C; ++c) mx = std::max(mx, row[c]);
        double sum = 0;  // Note [Reductions accumulate in double]
        for (int64_t c = 0; c < C; ++c) sum += (o[c] = std::exp(row[c] - mx));
        const T inv = static_cast<T>(1.0 / sum);
        for (int64_t c = 0; c < C; ++c) o[c] *= inv;
      }
    });
  });
  return out;
}

Tensor softmax_backward(const Tensor& dout_in, const Tensor& y_in) {
  if (y_in.device().is_cuda()) return cuda::softmax_backward(dout_in, y_in);
  Tensor y = y_in.contiguous(), dout = dout_in.contiguous();
  const int64_t C = y.size(-1), N = y.numel() / std::max<int64_t>(C, 1);
  Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
  dispatch_float(y.dtype(), "softmax_backward", [&]<typename T>() {
    const T* py = y.template data<T>();
    const T* pd = dout.template data<T>();
    T* po = dx.template data<T>();
    parallel_for(N, 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const T* yr = py + i * C;
        const T* dr = pd + i * C;
        double dot_sum = 0;  // Note [Reductions accumulate in double]
        for (int64_t c = 0; c < C; ++c)
          dot_sum += static_cast<double>(yr[c]) * static_cast<double>(dr[c]);
        const T dot = static_cast<T>(dot_sum);
        T* o = po + i * C;
        for (int64_t c = 0; c < C; ++c) o[c] = yr[c] * (dr[c] - dot);
      }
    });
  });
  return dx;
}

// ---------------- dropout ----------------

Tensor dropout(const Tensor& x_in, double p, RngState rng) {
  if (mixed::any_low({&x_in})) return mixed::dropout(x_in, p, rng);
  check_float("dropout", x_in);
  MW_CHECK_T(InvalidArgument, p >= 0 && p < 1, "dropout: probability ", p, " must be in [0, 1)");
  if (x_in.device().is_cuda()) return cuda::dropout(x_in, p, rng);
  Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float(x.dtype(), "dropout", [&]<typename T>() {
    const T* px = x.template data<T>();
    T* po = out.template data<T>();
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    parallel_for(x.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        po[i] = random_uniform(rng, static_cast<uint64_t>(i)) >= p ? px[i] * scale : T(0);
    });
  });
  return out;
}

}  // namespace mw::ops
