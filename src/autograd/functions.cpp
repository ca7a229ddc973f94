// Backward formulas for every differentiable op. Each function computes its forward with a core
// kernel and, when a graph is being recorded, saves only what its backward needs. Each opens a
// profile::Scope named after it (Note [Op profile], core/op_profile.h; free when profiling is off).
#include "autograd/functions.h"

#include <atomic>
#include <numeric>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "autograd/saved_tensor.h"
#include "core/convert.h"
#include "core/op_profile.h"
#include "core/ops.h"

namespace mw {

namespace {
using Grads = std::vector<Tensor>;
using ops::BinaryOp;

// A fresh handle onto x's data, so recording a grad_fn on it never touches x's own metadata.
Tensor fresh_view(const Tensor& x) { return x.detach(); }

// The gradient of an input in that input's dtype: an f32 + bf16 sum is f32 (Note [Autocast
// policy]), and the bf16 side gets a bf16 gradient.
Tensor in_dtype(const Tensor& g, DType dtype) {
  return g.defined() && g.dtype() != dtype ? g.to(dtype) : g;
}

// -x. affine_scalar takes f32 and f64 only: a bf16/f16 gradient is negated in f32, exactly (sub
// and div of two bf16 tensors recorded a graph whose backward then refused).
Tensor negated(const Tensor& x) {
  return ops::affine_scalar(is_low_precision(x.dtype()) ? x.to(DType::F32) : x, -1.0, 0.0);
}
}  // namespace

// ---------------- elementwise ----------------

Tensor add(const Tensor& a, const Tensor& b) {
  profile::Scope scope("add");
  Tensor out = ops::binary(BinaryOp::Add, a, b);
  return record("AddBackward", out, {a, b}, [&](const std::vector<bool>& needs) -> BackwardFn {
    Shape sa = a.shape(), sb = b.shape();
    DType da = a.dtype(), db = b.dtype();
    return [needs, sa, sb, da, db](const Grads& g) -> Grads {
      return {needs[0] ? in_dtype(ops::sum_to_shape(g[0], sa), da) : Tensor(),
              needs[1] ? in_dtype(ops::sum_to_shape(g[0], sb), db) : Tensor()};
    };
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  profile::Scope scope("sub");
  Tensor out = ops::binary(BinaryOp::Sub, a, b);
  return record("SubBackward", out, {a, b}, [&](const std::vector<bool>& needs) -> BackwardFn {
    Shape sa = a.shape(), sb = b.shape();
    DType da = a.dtype(), db = b.dtype();
    return [needs, sa, sb, da, db](const Grads& g) -> Grads {
      return {needs[0] ? in_dtype(ops::sum_to_shape(g[0], sa), da) : Tensor(),
              needs[1] ? in_dtype(ops::sum_to_shape(negated(g[0]), sb), db) : Tensor()};
    };
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  profile::Scope scope("mul");
  Tensor out = ops::binary(BinaryOp::Mul, a, b);
  return record("MulBackward", out, {a, b}, [&](const std::vector<bool>& needs) -> BackwardFn {
    SavedTensor sa(needs[1] ? a : Tensor(), "mul input a"),
        sb(needs[0] ? b : Tensor(), "mul input b");
    Shape shape_a = a.shape(), shape_b = b.shape();
    DType da = a.dtype(), db = b.dtype();
    return [=](const Grads& g) -> Grads {
      Grads r(2);
      if (needs[0])
        r[0] =
            in_dtype(ops::sum_to_shape(ops::binary(BinaryOp::Mul, g[0], sb.unpack()), shape_a), da);
      if (needs[1])
        r[1] =
            in_dtype(ops::sum_to_shape(ops::binary(BinaryOp::Mul, g[0], sa.unpack()), shape_b), db);
      return r;
    };
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  profile::Scope scope("div");
  Tensor out = ops::binary(BinaryOp::Div, a, b);
  return record("DivBackward", out, {a, b}, [&](const std::vector<bool>& needs) -> BackwardFn {
    SavedTensor sa(needs[1] ? a : Tensor(), "div input a"), sb(b, "div input b");
    Shape shape_a = a.shape(), shape_b = b.shape();
    DType da = a.dtype(), db = b.dtype();
    return [=](const Grads& g) -> Grads {
      Grads r(2);
      Tensor bv = sb.unpack();
      Tensor g_over_b = ops::binary(BinaryOp::Div, g[0], bv);
      if (needs[0]) r[0] = in_dtype(ops::sum_to_shape(g_over_b, shape_a), da);
      if (needs[1]) {  // d(a/b)/db = -a/b^2
        Tensor t =
            ops::binary(BinaryOp::Div, ops::binary(BinaryOp::Mul, g_over_b, sa.unpack()), bv);
        r[1] = in_dtype(ops::sum_to_shape(negated(t), shape_b), db);
      }
      return r;
    };
  });
}

Tensor affine(const Tensor& a, double alpha, double beta) {
  profile::Scope scope("affine");
  Tensor out = ops::affine_scalar(a, alpha, beta);
  return record("AffineBackward", out, {a}, [&](const std::vector<bool>&) -> BackwardFn {
    return [alpha](const Grads& g) -> Grads { return {ops::affine_scalar(g[0], alpha, 0.0)}; };
  });
}

// ---------------- reductions ----------------

Tensor sum(const Tensor& x) {
  profile::Scope scope("sum");
  Tensor out = ops::sum_all(x);
  return record("SumBackward", out, {x}, [&](const std::vector<bool>&) -> BackwardFn {
    Shape shape = x.shape();
    DType dtype = x.dtype();
    Device device = x.device();
    return
        [=](const Grads& g) -> Grads { return {Tensor::full(shape, g[0].item(), dtype, device)}; };
  });
}

Tensor sum(const Tensor& x, int64_t dim, bool keepdim) {
  profile::Scope scope("sum");
  Tensor out = ops::sum_dim(x, dim, keepdim);
  return record("SumDimBackward", out, {x}, [&](const std::vector<bool>&) -> BackwardFn {
    Shape shape = x.shape();
    int64_t d = x.wrap_dim(dim);
    return [=](const Grads& g) -> Grads { return {ops::expand_dim(g[0], shape, d, keepdim)}; };
  });
}

Tensor mean(const Tensor& x) { return mul_scalar(sum(x), 1.0 / static_cast<double>(x.numel())); }

Tensor mean(const Tensor& x, int64_t dim, bool keepdim) {
  return mul_scalar(sum(x, dim, keepdim), 1.0 / static_cast<double>(x.size(dim)));
}

// ---------------- views ----------------

Tensor view(const Tensor& x, const Shape& shape) {
  profile::Scope scope("view");
  Tensor out = x.view(shape);
  return record("ViewBackward", out, {x}, [&](const std::vector<bool>&) -> BackwardFn {
    Shape in_shape = x.shape();
    return [in_shape](const Grads& g) -> Grads { return {g[0].reshape(in_shape)}; };
  });
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  profile::Scope scope("reshape");
  Tensor out = x.reshape(shape);
  if (out.is_same(x)) out = fresh_view(x);
  return record("ReshapeBackward", out, {x}, [&](const std::vector<bool>&) -> BackwardFn {
    Shape in_shape = x.shape();
    return [in_shape](const Grads& g) -> Grads { return {g[0].reshape(in_shape)}; };
  });
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  profile::Scope scope("transpose");
  Tensor out = x.transpose(d0, d1);
  return record("TransposeBackward", out, {x}, [&](const std::vector<bool>&) -> BackwardFn {
    return [d0, d1](const Grads& g) -> Grads { return {g[0].transpose(d0, d1)}; };
  });
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  profile::Scope scope("permute");
  Tensor out = x.permute(dims);
  return record("PermuteBackward", out, {x}, [&](const std::vector<bool>&) -> BackwardFn {
    std::vector<int64_t> inverse(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) inverse[x.wrap_dim(dims[i])] = static_cast<int64_t>(i);
    return [inverse](const Grads& g) -> Grads { return {g[0].permute(inverse)}; };
  });
}

Tensor contiguous(const Tensor& x) {
  profile::Scope scope("contiguous");
  Tensor out = x.is_contiguous() ? fresh_view(x) : x.clone();
  return record("ContiguousBackward", out, {x}, [&](const std::vector<bool>&) -> BackwardFn {
    return [](const Grads& g) -> Grads { return {g[0]}; };
  });
}

// ---------------- layers ----------------

Tensor matmul(const Tensor& a, const Tensor& b) {
  profile::Scope scope("matmul");
  if (autocast::applies({a, b}) && (a.dtype() == DType::F32 || b.dtype() == DType::F32))
    return matmul(cast(a, autocast_dtype()), cast(b, autocast_dtype()));
  Tensor out = ops::matmul(a, b);
  return record("MatmulBackward", out, {a, b}, [&](const std::vector<bool>& needs) -> BackwardFn {
    SavedTensor sa(needs[1] ? a : Tensor(), "matmul input a");
    SavedTensor sb(needs[0] ? b : Tensor(), "matmul input b");
    Shape shape_a = a.shape(), shape_b = b.shape();
    DType ta = a.dtype(), tb = b.dtype();  // each gradient in its input's dtype (mixed inputs)
    return [=](const Grads& g) -> Grads {
      Grads r(2);
      const Tensor& dy = g[0];
      if (shape_b.size() == 2) {  // a [..., M, K] @ b [K, N]: fold a's leading dims
        const int64_t K = shape_b[0], N = shape_b[1];
        Tensor dy2 = dy.reshape({-1, N});
        if (needs[0]) {
          Tensor da = Tensor::empty({dy2.size(0), K}, ta, dy.device());
          ops::gemm(dy2, false, sb.unpack(), true, da, false);
          r[0] = da.view(shape_a);
        }
        if (needs[1]) {
          Tensor db = Tensor::empty({K, N}, tb, dy.device());
          ops::gemm(sa.unpack().reshape({-1, K}), true, dy2, false, db, false);
          r[1] = db;
        }
        return r;
      }
      if (needs[0]) r[0] = in_dtype(ops::matmul(dy, sb.unpack().transpose(-1, -2)), ta);
      if (needs[1]) r[1] = in_dtype(ops::matmul(sa.unpack().transpose(-1, -2), dy), tb);
      return r;
    };
  });
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  profile::Scope scope("linear");
  if (autocast::applies({x, w, bias})) return autocast::linear(x, w, bias, autocast_dtype());
  Tensor out = ops::linear(x, w, bias);
  return record(
      "LinearBackward", out, {x, w, bias}, [&](const std::vector<bool>& needs) -> BackwardFn {
        SavedTensor sx(needs[1] ? x : Tensor(), "linear input");
        SavedTensor sw(needs[0] ? w : Tensor(), "linear weight");
        Shape shape_w = w.shape();
        DType dtype = w.dtype(), x_dtype = x.dtype();
        DType b_dtype = bias.defined() ? bias.dtype() : dtype;
        Device device = w.device();
        return [=](const Grads& g) -> Grads {
          // What is not saved is a placeholder: linear_backward reads only w's shape and dtype
          // when dx is not needed, and only x's dtype and last dimension when dw is not (dx takes
          // its shape from dy; the placeholder had w's dtype, so an f32 x with a frozen bf16 w
          // got a bf16 gradient).
          Tensor wv = needs[0] ? sw.unpack() : Tensor::empty(shape_w, dtype, device);
          Tensor xv = needs[1] ? sx.unpack() : Tensor::empty({1, shape_w[0]}, x_dtype, device);
          auto lg = ops::linear_backward(g[0], xv, wv, needs[0], needs[1], needs[2]);
          return {in_dtype(lg.dx, x_dtype), in_dtype(lg.dw, dtype), in_dtype(lg.dbias, b_dtype)};
        };
      });
}

Tensor lm_head(const Tensor& x, const Tensor& table) {
  profile::Scope scope("lm_head");
  MW_CHECK_T(ShapeError, table.dim() == 2 && x.size(-1) == table.size(1), "lm_head: input ",
             x.desc(), " does not fit table ", table.desc());
  if (autocast::applies({x, table})) return autocast::lm_head(x, table, autocast_dtype());
  const int64_t V = table.size(0), C = table.size(1);
  Tensor x2 = x.reshape({-1, C});
  Tensor out = Tensor::empty({x2.size(0), V}, x.dtype(), x.device());
  ops::gemm(x2, false, table, true, out, false);
  Shape shape = x.shape();
  shape.back() = V;
  out = out.view(shape);
  return record("LmHeadBackward", out, {x, table},
                [&](const std::vector<bool>& needs) -> BackwardFn {
                  SavedTensor sx(needs[1] ? x : Tensor(), "lm_head input");
                  SavedTensor st(needs[0] ? table : Tensor(), "lm_head table");
                  Shape shape_x = x.shape();
                  DType tx = x.dtype(), tt = table.dtype();  // gradients in their inputs' dtypes
                  return [=](const Grads& g) -> Grads {
                    Grads r(2);
                    Tensor dy = g[0].reshape({-1, V});
                    if (needs[0]) {
                      Tensor dx = Tensor::empty({dy.size(0), C}, tx, dy.device());
                      ops::gemm(dy, false, st.unpack(), false, dx, false);
                      r[0] = dx.view(shape_x);
                    }
                    if (needs[1]) {
                      Tensor dt = Tensor::empty({V, C}, tt, dy.device());
                      ops::gemm(dy, true, sx.unpack().reshape({-1, C}), false, dt, false);
                      r[1] = dt;
                    }
                    return r;
                  };
                });
}

Tensor embedding(const Tensor& table, const Tensor& ids) {
  profile::Scope scope("embedding");
  Tensor out = ops::embedding(table, ids);
  out = record("EmbeddingBackward", out, {table}, [&](const std::vector<bool>&) -> BackwardFn {
    Tensor ids_copy = ids.detach();  // token ids: integers, never modified by training
    int64_t rows = table.size(0);
    return [ids_copy, rows](const Grads& g) -> Grads {
      // A tied table (GPT-2's wte) already has the LM head's dense gradient pending: add the rows
      // into it rather than building a second [V, C] buffer (take_pending_gradient, node.h).
      Tensor pending = take_pending_gradient(0);
      if (pending.defined()) {
        ops::embedding_backward_into(pending, g[0], ids_copy);
        return {pending};
      }
      return {ops::embedding_backward(g[0], ids_copy, rows)};
    };
  });
  // Only the looked-up rows of the table get a gradient (Note [Rows-ready hooks]).
  if (auto fn = grad_fn(out)) fn->row_sparse = Node::RowSparse{0, ids.detach()};
  return out;
}

Tensor layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  profile::Scope scope("layernorm");
  auto r = ops::layernorm(x, weight, bias, eps);
  return record(
      "LayerNormBackward", r.out, {x, weight, bias}, [&](const std::vector<bool>&) -> BackwardFn {
        SavedTensor sx(x, "layernorm input"), sw(weight, "layernorm weight");
        SavedTensor sm(r.mean, "layernorm mean"), sr(r.rstd, "layernorm rstd");
        return [=](const Grads& g) -> Grads {
          auto lg =
              ops::layernorm_backward(g[0], sx.unpack(), sw.unpack(), sm.unpack(), sr.unpack());
          return {lg.dx, lg.dweight, lg.dbias};
        };
      });
}

Tensor gelu(const Tensor& x) {
  profile::Scope scope("gelu");
  Tensor out = ops::gelu(x);
  return record("GeluBackward", out, {x}, [&](const std::vector<bool>&) -> BackwardFn {
    SavedTensor sx(x, "gelu input");
    return [sx](const Grads& g) -> Grads { return {ops::gelu_backward(g[0], sx.unpack())}; };
  });
}

Tensor softmax(const Tensor& x) {
  profile::Scope scope("softmax");
  Tensor out = ops::softmax(x);
  return record("SoftmaxBackward", out, {x}, [&](const std::vector<bool>&) -> BackwardFn {
    SavedTensor sy(out, "softmax output");
    return [sy](const Grads& g) -> Grads { return {ops::softmax_backward(g[0], sy.unpack())}; };
  });
}

namespace {

std::atomic<int64_t> g_shard_first{0}, g_shard_rows{0}, g_shard_total{0};

// Note [Dropout under data parallel]: this rank's draw of a tensor of `numel` elements, `rows`
// leading rows.
RngState reserve_rows(Generator& gen, int64_t numel, int64_t rows) {
  const int64_t total = g_shard_total.load(), mine = g_shard_rows.load();
  if (total == 0 || rows != mine || rows == 0) return gen.reserve(static_cast<uint64_t>(numel));
  const uint64_t per_row = static_cast<uint64_t>(numel / rows);
  RngState rng = gen.reserve(per_row * static_cast<uint64_t>(total));
  rng.offset += per_row * static_cast<uint64_t>(g_shard_first.load());
  return rng;
}

}  // namespace

void set_dropout_batch_shard(const DropoutBatchShard& shard) {
  MW_CHECK_T(InvalidArgument,
             shard.total_rows == 0 || (shard.rows > 0 && shard.first_row >= 0 &&
                                       shard.first_row + shard.rows <= shard.total_rows),
             "set_dropout_batch_shard: rows [", shard.first_row, ", ", shard.first_row + shard.rows,
             ") of ", shard.total_rows);
  g_shard_first = shard.first_row;
  g_shard_rows = shard.rows;
  g_shard_total = shard.total_rows;
}

Tensor dropout(const Tensor& x, double p, Generator& gen) {
  profile::Scope scope("dropout");
  if (p == 0.0) return x;
  RngState rng = reserve_rows(gen, x.numel(), x.dim() > 0 ? x.size(0) : 0);
  Tensor out = ops::dropout(x, p, rng);
  return record("DropoutBackward", out, {x}, [&](const std::vector<bool>&) -> BackwardFn {
    return [p, rng](const Grads& g) -> Grads { return {ops::dropout(g[0], p, rng)}; };
  });
}

Tensor causal_self_attention(const Tensor& qkv, int64_t n_head, double attn_dropout,
                             Generator& gen) {
  profile::Scope scope("causal_self_attention");
  if (qkv.dtype() == DType::F32 && autocast::applies({qkv}))
    return causal_self_attention(cast(qkv, autocast_dtype()), n_head, attn_dropout, gen);
  RngState rng{};
  if (attn_dropout > 0) {
    const int64_t T = qkv.size(1);
    rng = reserve_rows(gen, qkv.size(0) * n_head * T * T, qkv.size(0));
  }
  auto r = ops::attention(qkv, n_head, attn_dropout, rng);
  return record("AttentionBackward", r.out, {qkv}, [&](const std::vector<bool>&) -> BackwardFn {
    // r.att: the rows' softmax statistics on cpu/sim, their log-sum-exp on CUDA (ops.h).
    SavedTensor sq(qkv, "attention qkv"),
        sa(r.att, qkv.device().is_cuda() ? "attention log-sum-exp" : "attention row statistics");
    return [=](const Grads& g) -> Grads {
      return {ops::attention_backward(g[0], sq.unpack(), sa.unpack(), n_head, attn_dropout, rng)};
    };
  });
}

Tensor shifted_cross_entropy(const Tensor& logits, const Tensor& ids) {
  profile::Scope scope("shifted_cross_entropy");
  auto [loss, lse] = ops::shifted_cross_entropy(logits, ids);
  return record(
      "ShiftedCrossEntropyBackward", loss, {logits}, [&](const std::vector<bool>&) -> BackwardFn {
        auto sl = std::make_shared<SavedTensor>(logits, "logits");
        SavedTensor slse(lse, "log-sum-exp");
        Tensor ids_copy = ids.detach();
        return [sl, slse, ids_copy](const Grads& g) mutable -> Grads {
          Tensor l = sl->unpack();
          // Drop our reference, so the buffer may be reused below; not when the graph is kept
          // (a second backward found it gone and crashed).
          if (!graph_retained()) *sl = SavedTensor();
          // Reuse the logits buffer for dlogits when nothing else holds it (saves one
          // B*T*V buffer: 103 MB for GPT-2 small at B4 T128).
          bool reuse = !graph_retained() && l.storage().use_count() == 1 && l.is_contiguous();
          return {ops::shifted_cross_entropy_backward(g[0], l, slse.unpack(), ids_copy, reuse)};
        };
      });
}

Tensor identity_with_backward_hook(const Tensor& x, std::function<void()> on_backward) {
  Tensor out = fresh_view(x);
  return record("BackwardHook", out, {x}, [&](const std::vector<bool>&) -> BackwardFn {
    return [on_backward](const Grads& g) -> Grads {
      on_backward();
      return {g[0]};
    };
  });
}

}  // namespace mw
