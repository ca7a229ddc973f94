// The low-precision (bf16/f16) variants of the ops in ops.h: Note [Low-precision storage].
// Internal to core: each op in ops.h hands its low-precision inputs here as its first step, so
// callers only ever call ops.h.
//
// Note [Low-precision storage]: a bf16/f16 tensor is storage; arithmetic is f32. Each variant
// widens its low-precision inputs to f32 (the SIMD conversions of convert.h), runs the one f32
// kernel (STYLE.md: one implementation per algorithm), and rounds its outputs back to the inputs'
// low dtype once, at the end, so accumulation is f32 and an output is the f32 result correctly
// rounded. Temporaries live only inside the call: what a caller keeps (outputs, the tensors
// backward saves) is low precision, which is where the memory goes down. Products are blocked
// (gemm_mixed), so the f32 copies of GPT-2's [B*T, 50257] logits or its [50257, 768] table are
// never made whole. These go through Tensor::to(dtype), so they run on every device (CUDA converts
// on the GPU).
#pragma once

#include "core/ops.h"

namespace mw::ops::mixed {

// Whether any defined argument is bf16/f16 (the routing test of each op).
bool any_low(std::initializer_list<const Tensor*> ts);
// f32 copy of a low-precision tensor; t itself otherwise.
Tensor widen(const Tensor& t);

// out (f32, bf16 or f16) (+)= op(a) @ op(b), inputs f32/bf16/f16, f32 accumulation over K blocks.
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& out,
          bool accumulate);
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias);
LinearGrads linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, bool need_dx,
                            bool need_dw, bool need_dbias);
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
void axpy_(Tensor& y, const Tensor& x, double alpha);
Tensor sum_to_shape(const Tensor& grad, const Shape& shape);
Tensor gelu(const Tensor& x);
Tensor gelu_backward(const Tensor& dout, const Tensor& x);
Tensor dropout(const Tensor& x, double p, RngState rng);
AttentionOut attention(const Tensor& qkv, int64_t n_head, double attn_dropout, RngState rng);
Tensor attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& att, int64_t n_head,
                          double attn_dropout, RngState rng);

}  // namespace mw::ops::mixed
