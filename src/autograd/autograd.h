// Reverse-mode automatic differentiation: the public face of autograd/.
//
// A tensor takes part in autograd through its AutogradMeta: leaves (parameters) have requires_grad
// and accumulate .grad; results of differentiable ops have a grad_fn Node. Backward walks the graph
// iteratively in reverse creation order (engine.cpp); leaf gradients accumulate with +=, and each
// leaf's grad-ready hooks run once its gradient for this backward is final.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mw {

class Node;

using GradReadyHook = std::function<void(const Tensor& leaf)>;

// Note [Rows-ready hooks]: a leaf whose remaining gradient contributions in this backward all come
// from row-sparse ops (the embedding lookup, Node::row_sparse) has a gradient that is already final
// outside the rows those ops will add to. GPT-2's tied wte is the case: the LM head's dense [V, C]
// gradient arrives first in backward, the embedding's B*T rows only at the very end. The engine
// then calls the leaf's rows-ready hooks once, with the gradient accumulated so far and the sorted,
// distinct row ids still to come, so an optimizer can step every other row during the rest of
// backward. The hook may read `partial` (outside `pending_rows`: those rows are not final) on
// another thread until the join it returns has run. The engine leaves `partial` untouched and
// alive until then: it calls the join before it runs any of the remaining producers (so before
// the embedding adds its rows, and before the leaf's grad-ready hooks) and before backward unwinds
// on an exception. A hook must not keep a reference to `partial` (that would stop the embedding
// from adding into it in place). Fired only when the leaf had no .grad before this backward (no
// accumulation across backwards).
using GradRowsReadyHook = std::function<std::function<void()>(
    const Tensor& leaf, const Tensor& partial, const std::vector<int64_t>& pending_rows)>;

struct AutogradMeta : AutogradMetaBase {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;         // set on op results; null on leaves
  uint32_t output_nr = 0;                // which output of grad_fn this is
  std::weak_ptr<Node> grad_accumulator;  // leaves: the AccumulateGrad node, made on demand
  std::vector<GradReadyHook> grad_ready_hooks;
  std::vector<GradRowsReadyHook> grad_rows_ready_hooks;
};

// Null when t has no autograd state.
AutogradMeta* autograd_meta(const Tensor& t);
AutogradMeta& ensure_autograd_meta(const Tensor& t);

// Leaves: mark as requiring grad (parameters). Returns t for chaining.
const Tensor& set_requires_grad(const Tensor& t, bool requires_grad = true);
bool requires_grad(const Tensor& t);
bool is_leaf(const Tensor& t);
std::shared_ptr<Node> grad_fn(const Tensor& t);

// The accumulated gradient of a leaf (undefined until a backward reaches it).
Tensor grad(const Tensor& t);
void set_grad(const Tensor& t, Tensor g);
void zero_grad(const Tensor& t);  // drops the gradient (set to none)

// Called after the leaf's gradient is final in each backward (Gemini, overlapped optimizers).
void add_grad_ready_hook(const Tensor& leaf, GradReadyHook hook);
// Note [Rows-ready hooks]. Leaves of 2-D tensors only.
void add_grad_rows_ready_hook(const Tensor& leaf, GradRowsReadyHook hook);

// Runs backward from a scalar loss (grad_output defaults to 1). The graph's saved tensors are
// released as each node finishes unless retain_graph is set.
void backward(const Tensor& root, const Tensor& grad_output = Tensor(), bool retain_graph = false);
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_outputs,
              bool retain_graph = false);

// ---- grad mode ----
bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace mw
