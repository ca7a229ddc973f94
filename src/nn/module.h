// Module: named parameters, children, train/eval, and forward/backward hooks.
//
// Parameters are Tensor handles shared with the layer that uses them, so a mechanism that re-homes
// a parameter's storage (Gemini's chunks) is seen by the layer without rebinding anything.
//
// Note [Module backward hooks]: a backward pre-hook fires when the gradient of the module's output
// arrives (its backward is about to run); a backward hook fires when the gradient of its input has
// been computed (its backward is done). Both are identity autograd nodes placed around the module's
// input and output by operator(), only when such hooks are registered, grad mode is on, and the
// output (pre-hook) or the input (hook) requires grad: an embedding's input ids never do, so its
// backward hook never fires (use the parameters' grad-ready hooks for "done").
//
// Note [Every parameter use is a module call]: a model calls each parameter-owning module through
// operator(), never the underlying function on its weight, so forward and backward hooks see every
// use of every parameter: Gemini fetches chunks there (offload/gemini). A tied weight is owned by
// each module that uses it (GPT-2's wte by the embedding and by the LM head), so both uses are
// seen, in both passes. Recomputation (nn/checkpoint.h) runs forward again inside backward, so a
// checkpointed module's forward hooks fire twice per step.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/functions.h"

namespace mw::nn {

class Module {
 public:
  using ForwardPreHook = std::function<void(Module&, const Tensor& input)>;
  using ForwardHook = std::function<void(Module&, const Tensor& input, const Tensor& output)>;
  using BackwardHook = std::function<void(Module&)>;

  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x) = 0;
  virtual std::string type_name() const = 0;

  // Runs the hooks around forward().
  Tensor operator()(const Tensor& x);

  // Registers t as a parameter (marks it requires_grad) and returns it.
  Tensor register_parameter(const std::string& name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }

  // Depth-first, in registration order, names joined with '.'. A parameter shared by several
  // modules (a tied weight) is listed once, under the first name met (PyTorch's
  // remove_duplicate). own_parameters() of each module still lists it, so hooks see every use.
  std::vector<std::pair<std::string, Tensor>> named_parameters(
      const std::string& prefix = "") const;
  std::vector<Tensor> parameters() const;
  std::vector<std::pair<std::string, Module*>> named_modules(const std::string& prefix = "");
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const {
    return children_;
  }
  const std::vector<std::pair<std::string, Tensor>>& own_parameters() const { return params_; }

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  void add_forward_pre_hook(ForwardPreHook h) { forward_pre_hooks_.push_back(std::move(h)); }
  void add_forward_hook(ForwardHook h) { forward_hooks_.push_back(std::move(h)); }
  void add_backward_pre_hook(BackwardHook h) { backward_pre_hooks_.push_back(std::move(h)); }
  void add_backward_hook(BackwardHook h) { backward_hooks_.push_back(std::move(h)); }

 protected:
  bool training_ = true;

 private:
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<ForwardPreHook> forward_pre_hooks_;
  std::vector<ForwardHook> forward_hooks_;
  std::vector<BackwardHook> backward_pre_hooks_;
  std::vector<BackwardHook> backward_hooks_;
};

// Zeroes (drops) the gradients of every parameter.
void zero_grad(const Module& m);

}  // namespace mw::nn
