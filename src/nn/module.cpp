// Module registration, traversal and hooks (Note [Module backward hooks]).
#include "nn/module.h"

#include <set>

namespace mw::nn {

Tensor Module::operator()(const Tensor& x_in) {
  for (auto& h : forward_pre_hooks_) h(*this, x_in);
  Tensor x = x_in;
  if (!backward_hooks_.empty() && grad_enabled() && requires_grad(x_in))
    x = identity_with_backward_hook(x_in, [this] {
      for (auto& h : backward_hooks_) h(*this);
    });
  Tensor y = forward(x);
  if (!backward_pre_hooks_.empty() && grad_enabled() && requires_grad(y))
    y = identity_with_backward_hook(y, [this] {
      for (auto& h : backward_pre_hooks_) h(*this);
    });
  for (auto& h : forward_hooks_) h(*this, x_in, y);
  return y;
}

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  MW_CHECK_T(InvalidArgument, t.defined(), "register_parameter '", name, "': undefined tensor");
  if (!requires_grad(t)) set_requires_grad(t);
  params_.emplace_back(name, t);
  return t;
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(
    const std::string& prefix) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::set<const TensorImpl*> seen;  // a tied parameter is listed once, under its first name
  // Iterative depth-first walk with an explicit stack (STYLE: no recursion over structures).
  std::vector<std::pair<std::string, const Module*>> stack{{prefix, this}};
  while (!stack.empty()) {
    auto [p, m] = stack.back();
    stack.pop_back();
    for (const auto& [name, t] : m->params_)
      if (seen.insert(t.impl()).second) out.emplace_back(p.empty() ? name : p + "." + name, t);
    for (auto it = m->children_.rbegin(); it != m->children_.rend(); ++it)
      stack.emplace_back(p.empty() ? it->first : p + "." + it->first, it->second.get());
  }
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules(const std::string& prefix) {
  std::vector<std::pair<std::string, Module*>> out;
  std::vector<std::pair<std::string, Module*>> stack{{prefix, this}};
  while (!stack.empty()) {
    auto [p, m] = stack.back();
    stack.pop_back();
    out.emplace_back(p, m);
    for (auto it = m->children_.rbegin(); it != m->children_.rend(); ++it)
      stack.emplace_back(p.empty() ? it->first : p + "." + it->first, it->second.get());
  }
  return out;
}

void Module::train(bool on) {
  for (auto& [name, m] : named_modules()) m->training_ = on;
}

void zero_grad(const Module& m) {
  for (auto& t : m.parameters()) mw::zero_grad(t);
}

}  // namespace mw::nn
