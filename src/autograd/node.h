// Node: one recorded op in the backward graph, with edges to the nodes of its inputs.
//
// Nodes are created by the differentiable functions (functions.cpp) through make_function_node,
// whose backward closure owns the op's SavedTensors; release_saved() drops the closure, freeing
// them as soon as backward has used them. Graph teardown is iterative (delete_node), so deep graphs
// cannot overflow the stack.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/autograd.h"

namespace mw {

struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
  bool valid() const { return fn != nullptr; }
};

class Node {
 public:
  virtual ~Node() = default;
  virtual std::string name() const = 0;
  // grad_outputs[i] is the gradient of forward output i (undefined if none arrived).
  // Returns one gradient per next_edges entry (undefined where not needed).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) = 0;
  virtual void release_saved() {}
  // The leaf this node accumulates into (AccumulateGrad), else null.
  virtual const Tensor* leaf() const { return nullptr; }

  // Set by ops whose gradient for input `edge` is zero outside the rows `ids` (i32/i64) of a 2-D
  // input: the embedding lookup. Note [Rows-ready hooks].
  struct RowSparse {
    size_t edge = 0;
    Tensor ids;
  };
  std::optional<RowSparse> row_sparse;

  std::vector<Edge> next_edges;
  uint64_t sequence_nr = 0;
  uint32_t num_outputs = 1;
};

using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

// A node whose backward is a closure. needs_input_grad(i) tells the closure which inputs want
// grads.
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, BackwardFn backward)
      : name_(std::move(name)), backward_(std::move(backward)) {}
  std::string name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  void release_saved() override { backward_ = nullptr; }

 private:
  std::string name_;
  BackwardFn backward_;
};

// Accumulates into a leaf's .grad and then runs its grad-ready hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf) : leaf_(std::move(leaf)) {}
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  const Tensor* leaf() const override { return &leaf_; }

 private:
  Tensor leaf_;
};

// Inside a node's backward: takes the gradient already accumulated by the engine for the node's
// next edge `edge_index` (the sum of what other consumers of that input sent), when the engine
// holds the only reference, so the node can add its own contribution in place and return the sum.
// Returns an undefined tensor otherwise. The tied embedding uses it: its gradient rows are added
// into the LM head's [V, C] gradient instead of into a second dense [V, C] buffer (147 MiB on GPT-2
// small).
Tensor take_pending_gradient(size_t edge_index);
// True while a backward(..., retain_graph = true) applies a node: a node that would give up a
// saved tensor to reuse its buffer keeps it (a second backward reads it again).
bool graph_retained();

// Wraps a new node in a shared_ptr whose deleter tears graphs down iteratively.
std::shared_ptr<Node> adopt_node(Node* node);
uint64_t next_sequence_nr();

// The edge that a gradient for t should flow along (invalid if t does not require grad).
Edge gradient_edge(const Tensor& t);
bool any_requires_grad(std::initializer_list<Tensor> inputs);

// Records `out` as the result of a differentiable op with the given inputs, when grad mode is on
// and some input requires grad. `make_backward(needs)` builds the closure; needs[i] tells whether
// input i requires a gradient. Returns out.
Tensor record(const char* name, const Tensor& out, std::initializer_list<Tensor> inputs,
              const std::function<BackwardFn(const std::vector<bool>& needs)>& make_backward);

}  // namespace mw
