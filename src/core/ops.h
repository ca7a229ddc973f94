// Tensor-level kernels without autograd: each allocates its outputs on the inputs' device and
// dispatches to the CPU kernels (cpu and sim devices) or, as its first step, to the CUDA kernels
// of ops_cuda.h (cuda devices). Float ops run in f32 and
// f64 (f64 exists for the finite-difference gradient tests). autograd/ wraps these with backward
// functions; nothing here records a graph.
//
// Shape conventions follow llm.c: B batch, T time, C channels, V vocabulary, NH heads, hs = C/NH.
#pragma once

#include <cstdint>
#include <utility>

#include "core/random.h"
#include "core/tensor.h"

namespace mw::ops {

// ---- elementwise, with NumPy broadcasting ----
enum class BinaryOp { Add, Sub, Mul, Div };
Shape broadcast_shapes(const Shape& a, const Shape& b);
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
// out = a * alpha + beta
Tensor affine_scalar(const Tensor& a, double alpha, double beta);
// Sums grad (of the broadcast shape) down to `shape`: the backward of broadcasting.
Tensor sum_to_shape(const Tensor& grad, const Shape& shape);
// y += alpha * x (same shape, y contiguous). Bumps y's version.
void axpy_(Tensor& y, const Tensor& x, double alpha = 1.0);
// x *= alpha in place (contiguous f32/f64), on x's device: a CUDA buffer by a kernel on the compute
// stream, never read by the host (a gradient bucket or chunk scaled to the mean). Bumps x's
// version.
void scale_(Tensor& x, double alpha);

// ---- reductions ----
Tensor sum_all(const Tensor& x);  // shape []
Tensor sum_dim(const Tensor& x, int64_t dim, bool keepdim);
// Expands g (shape of sum_dim(x, dim, keepdim)) back to x's shape.
Tensor expand_dim(const Tensor& g, const Shape& shape, int64_t dim, bool keepdim);

// ---- matmul ----
// a [..., M, K] @ b [K, N] or [..., K, N] (same batch dims); a and b may be transposed views.
Tensor matmul(const Tensor& a, const Tensor& b);
// out [M, N] (+)= op(a) @ op(b) for 2-D operands; trans flags read a or b as transposed.
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& out,
          bool accumulate);
// Counters of every gemm() call (time and floating-point operations), for the benchmarks' "share
// of step time in GEMM". Cheap: two clock reads and three atomic adds per call.
struct GemmStats {
  int64_t calls = 0;
  int64_t flops = 0;
  int64_t nanoseconds = 0;
};
GemmStats gemm_stats();
void reset_gemm_stats();
// y [..., N] = x [..., K] @ w [K, N] + bias [N] (HF Conv1D layout: weight is [in, out]).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias);
struct LinearGrads {
  Tensor dx, dw, dbias;
};
LinearGrads linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, bool need_dx,
                            bool need_dw, bool need_dbias);

// ---- embedding ----
// The ids of an i32 or i64 tensor (any shape, read in order) as int64; ShapeError otherwise.
std::vector<int64_t> token_ids(const Tensor& ids);
// out [..., C] = table[ids[...]]; ids i32 or i64.
Tensor embedding(const Tensor& table, const Tensor& ids);
// dtable [V, C] = scatter-add of dout rows (deterministic: fixed order per row).
Tensor embedding_backward(const Tensor& dout, const Tensor& ids, int64_t num_rows);
// dtable [V, C] += scatter-add of dout rows, in place (same order as embedding_backward).
void embedding_backward_into(Tensor& dtable, const Tensor& dout, const Tensor& ids);

// ---- layernorm over the last dim ----
struct LayerNormOut {
  Tensor out, mean, rstd;  // mean, rstd: [rows]
};
LayerNormOut layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
struct LayerNormGrads {
  Tensor dx, dweight, dbias;
};
LayerNormGrads layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd);

// ---- activations ----
Tensor gelu(const Tensor& x);  // tanh form (HF gelu_new)
Tensor gelu_backward(const Tensor& dout, const Tensor& x);
Tensor softmax(const Tensor& x);  // over the last dim
Tensor softmax_backward(const Tensor& dout, const Tensor& y);

// ---- dropout (Note [Counter-based dropout], random.h) ----
// Keeps each element with probability 1-p and scales it by 1/(1-p). The mask is a pure function of
// (seed, offset, index), so backward and recomputation regenerate it instead of storing it.
Tensor dropout(const Tensor& x, double p, RngState rng);

// ---- causal self-attention ----
// qkv [B, T, 3C] -> out [B, T, C]. Backward recomputes the probabilities from att: on cpu/sim each
// row's softmax max and 1/sum [B, NH, T, 2], in qkv's dtype or f32 for a bf16/f16 qkv (Note [Row
// statistics instead of probabilities], cpu/attention.cpp); on CUDA the per-row log-sum-exp
// [B, NH, T] (Note [Attention on CUDA by query blocks]). The dropout mask is regenerated.
struct AttentionOut {
  Tensor out, att;
};
AttentionOut attention(const Tensor& qkv, int64_t n_head, double attn_dropout, RngState rng);
// Returns dqkv [B, T, 3C].
Tensor attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& att, int64_t n_head,
                          double attn_dropout, RngState rng);
// qkv [B, T, 3C] split into n_head heads, checked (ShapeError naming what does not fit).
struct AttentionDims {
  int64_t B, T, C, NH, hs;
};
AttentionDims attention_dims(const Tensor& qkv, int64_t n_head);
// Query rows per block of the CUDA attention (Note [Attention on CUDA by query blocks]): at most
// 128 and at most T, and few enough that one block's scores [B*NH, rows, <= T] stay within 2^24
// elements; at least 1. The memory plan counts the same blocks.
int64_t cuda_attention_block_rows(int64_t B, int64_t NH, int64_t T);

// ---- fused shifted cross-entropy ----
// loss = mean over b, t < T-1 of -log softmax(logits[b, t])[ids[b, t+1]]   (ColossalAI GPTLMLoss)
// Returns the scalar loss and the per-row log-sum-exp [B, T-1] for backward.
std::pair<Tensor, Tensor> shifted_cross_entropy(const Tensor& logits, const Tensor& ids);
// dlogits = dloss * (softmax - onehot) / (B*(T-1)), zero at t = T-1. May reuse `logits`' buffer
// when `reuse_logits` is set (the caller owns the last reference).
Tensor shifted_cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& lse,
                                      const Tensor& ids, bool reuse_logits);

}  // namespace mw::ops
