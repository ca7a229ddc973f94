// Autocast: the mixed-precision policy of the differentiable ops (PyTorch's torch.autocast).
//
// Note [Autocast policy]: while an AutocastGuard(bf16 or f16) is alive on a thread, f32 inputs of
// the ops that are matrix products (linear, lm_head, matmul) and of attention are cast to the low
// dtype; their outputs are low precision, and so is everything computed from them (GELU, dropout)
// until an f32 tensor joins (the residual add promotes to f32, PyTorch's rule). Layernorm, softmax
// and the loss keep or produce f32 (layernorm statistics, the loss and its log-sum-exp are f32
// inside the kernels whatever the input). Parameters stay f32 masters: a product's weight is cast
// from its master in forward and again in backward instead of being kept (GPT-2 small: 237 MiB less
// at the peak than holding the casts), and the gradient of that cast, rounded to the low dtype as
// PyTorch's would be, flows to the master widened to f32, so optimizers see f32 gradients of f32
// parameters. f64 tensors are never cast (the finite-difference tests run in double with autocast
// on or off). The dtype is thread-local; nn::checkpoint records it and recomputes under the same
// one.
#pragma once

#include "autograd/autograd.h"

namespace mw {

// The low dtype of the innermost AutocastGuard on this thread, or F32 when none is active.
DType autocast_dtype();

class AutocastGuard {
 public:
  // F32 turns autocast off inside; BF16 or F16 turn it on. InvalidArgument for anything else.
  explicit AutocastGuard(DType low);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DType previous_;
};

// "fp32" | "bf16" | "fp16" -> F32 | BF16 | F16 (the --precision values); InvalidArgument otherwise.
DType parse_precision(const std::string& name);
const char* precision_name(DType dtype);

// Differentiable dtype cast: x.to(dtype) forward, the gradient cast back to x's dtype backward.
Tensor cast(const Tensor& x, DType dtype);

namespace autocast {
// The autocast forms of linear and lm_head (Note [Autocast policy]); functions.cpp calls them when
// autocast_dtype() is low and the inputs are f32.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, DType low);
Tensor lm_head(const Tensor& x, const Tensor& table, DType low);
// Whether the op should run in autocast: a low autocast dtype and f32 inputs.
bool applies(std::initializer_list<Tensor> inputs);
}  // namespace autocast

}  // namespace mw
