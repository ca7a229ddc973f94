// The activation arithmetic of the memory plan (memory_plan.h, Note [Activation arithmetic]):
// what a GPT-2 step saves and holds at its peaks, in bytes, from the config and B x T alone.
// Internal to train/ (memory_plan.cpp).
#pragma once

#include <string>

#include "train/memory_plan.h"

namespace mw::train {

// Saved tensors of the forward pass, each rounded to the allocator's granule.
// In double: an absurd B x T x T must not overflow (the plan refuses it); doubles are exact for
// byte counts up to 2^53 (8 PiB).
struct Activations {
  double block = 0;  // one block's saved tensors, its input included
  double input = 0;  // [N, C]: what a checkpointed block keeps
  double head = 0;   // ln_f's input and output, mean, rstd, log-sum-exp (the logits apart)
  double logits = 0;
  double backward_extra = 0;  // at the LM head's backward: dx [N, C] and wte's gradient [V, C]
  double mlp_grad = 0;        // [N, F]: the gradient inside a block's MLP backward
  // [F, C]: the largest weight gradient a block's backward makes (c_fc's, c_proj's), alive until
  // it is accumulated or, updated in backward, stepped.
  double weight_grad = 0;
  // CUDA: what attention_backward allocates beside the saved tensors (attention_cuda.cpp): dqkv
  // [N, 3C], per-head copies of q, k, v, dO and dq, dk, dv (7 [N, C]), two score buffers of
  // B*NH x rows x T (rows: ops::cuda_attention_block_rows). On the host devices under autocast,
  // the f32 copies of a block's backward (host_low_transients); else 0.
  double attention_backward = 0;
  // The same without the f32 weight gradients among those copies, for the moment when every
  // gradient is kept and counted already (first_block_backward in memory_plan.cpp).
  double attention_backward_beside_grads = 0;
  // The LM head's backward beyond backward_extra's tensors when its products widen (the host
  // devices under autocast); 0 otherwise.
  double head_backward = 0;
};

Activations activations(const PlanInputs& in);

// What recomputation keeps from the forward: `stored`, the checkpointed segments' inputs and the
// other segments' saved tensors; `longest`, the most blocks one segment recomputes at once.
// `inputs`: the checkpointed segments' inputs alone.
struct Recomputation {
  double stored = 0, longest = 0, inputs = 0;
};

// Empty (longest 0) without recomputation; `name` describes the choice for the plan.
Recomputation recomputation(const PlanInputs& in, const Activations& a, std::string* name);

// Recomputing a segment rebuilds its blocks' saved tensors (its input is already stored), with
// wte's gradient, the incoming gradient [N, C] and, in the MLP's backward, one [N, F] alive.
// Excludes what is stored.
double recomputing_bytes(const Activations& a, const Recomputation& r);
// Beside the logits at the LM head's backward: its gradients, or its widened products.
double head_backward_bytes(const Activations& a);
// Beside a block's saved tensors at its backward: the op's incoming gradient and its weight's
// gradient, or the attention's workspace.
double block_backward_bytes(const Activations& a);

// Peak bytes of activations (and the gradients in flight with them) over one step.
double activation_peak(const PlanInputs& in, const Activations& a, std::string* name);

}  // namespace mw::train
