// Differentiable ops: each wraps a core kernel (core/ops.h) and records a backward closure.
// These are the functions models are written with. Every one has a finite-difference gradient test
// in double precision (tests/autograd/gradcheck_test.cpp).
#pragma once

#include <functional>

#include "autograd/autograd.h"
#include "core/random.h"
#include "core/tensor.h"

namespace mw {

// elementwise with broadcasting
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
// scalar ops: a * alpha + beta
Tensor affine(const Tensor& a, double alpha, double beta);
inline Tensor add_scalar(const Tensor& a, double s) { return affine(a, 1.0, s); }
inline Tensor mul_scalar(const Tensor& a, double s) { return affine(a, s, 0.0); }

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator*(const Tensor& a, double s) { return mul_scalar(a, s); }
inline Tensor operator+(const Tensor& a, double s) { return add_scalar(a, s); }

// reductions
Tensor sum(const Tensor& x);  // all elements -> shape []
Tensor sum(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, int64_t dim, bool keepdim = false);

// views (share storage; gradients flow back through them)
Tensor view(const Tensor& x, const Shape& shape);
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor contiguous(const Tensor& x);

// layers
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias);  // HF Conv1D: w is [in, out]
// x [..., C] @ table[V, C]^T -> [..., V]: the tied LM head. Its backward writes the table's
// gradient directly in [V, C] layout (no transposed copy).
Tensor lm_head(const Tensor& x, const Tensor& table);
Tensor embedding(const Tensor& table, const Tensor& ids);
Tensor layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
Tensor gelu(const Tensor& x);
Tensor softmax(const Tensor& x);  // last dim
// Draws its mask from `gen` (Note [Counter-based dropout]). Identity when p == 0.
Tensor dropout(const Tensor& x, double p, Generator& gen);

// Note [Dropout under data parallel]: a rank that holds rows [first_row, first_row + rows) of a
// global batch of total_rows draws, for a tensor whose dim 0 is its rows (dropout's x [B, T, C],
// attention's probabilities [B, NH, T, T]), the very mask elements that one process draws for
// those rows of the global tensor: the generator advances by the global tensor's numel, and this
// rank's draw starts first_row rows into it (counter-based draws, Note [Counter-based dropout]).
// So a run at N ranks with dropout equals one process up to the summation order, and the
// generator's state in a checkpoint is the same at any rank count. Process-wide, set once per run
// (recomputation draws again during backward); total_rows 0, the default: off. A tensor whose
// dim 0 is not `rows` draws as without it.
struct DropoutBatchShard {
  int64_t first_row = 0, rows = 0, total_rows = 0;
};
void set_dropout_batch_shard(const DropoutBatchShard& shard);
// qkv [B, T, 3C] -> [B, T, C], causal, with dropout on the attention probabilities.
Tensor causal_self_attention(const Tensor& qkv, int64_t n_head, double attn_dropout,
                             Generator& gen);
// Mean CE of logits[:, :-1] against ids[:, 1:] (ColossalAI GPTLMLoss), fused; returns shape [].
Tensor shifted_cross_entropy(const Tensor& logits, const Tensor& ids);

// Identity in forward; calls on_backward(grad) when its gradient passes in backward. Used for
// module backward hooks (nn/module.h) and by Gemini to learn when parameters are about to be used.
Tensor identity_with_backward_hook(const Tensor& x, std::function<void()> on_backward);

}  // namespace mw
