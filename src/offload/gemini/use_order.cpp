// record_use_order and packing_order (use_order.h, Note [First-use order]).
#include "offload/gemini/use_order.h"

#include <memory>
#include <unordered_map>

#include "autograd/autograd.h"
#include "core/error.h"

namespace mw::gemini {

std::vector<std::string> record_use_order(nn::Module& model, const std::function<void()>& forward) {
  const auto named = model.named_parameters();
  std::unordered_map<const TensorImpl*, size_t> index;
  for (size_t i = 0; i < named.size(); ++i) index[named[i].second.impl()] = i;
  auto order = std::make_shared<std::vector<size_t>>();
  auto recording = std::make_shared<bool>(true);
  std::vector<bool> seen(named.size(), false);
  for (auto& [name, m] : model.named_modules()) {
    if (m->own_parameters().empty()) continue;
    m->add_forward_pre_hook([order, recording, &index, &seen](nn::Module& mod, const Tensor&) {
      if (!*recording) return;  // the probe is over: the hook stays, inert
      for (auto& [pname, t] : mod.own_parameters()) {
        const size_t i = index.at(t.impl());
        if (!seen[i]) seen[i] = true, order->push_back(i);
      }
    });
  }
  {
    NoGradGuard no_grad;
    forward();
  }
  *recording = false;
  for (size_t i = 0; i < named.size(); ++i)
    if (!seen[i]) order->push_back(i);
  std::vector<std::string> names;
  for (size_t i : *order) names.push_back(named[i].first);
  return names;
}

std::vector<size_t> packing_order(const std::vector<std::string>& names,
                                  const std::vector<std::string>& use_order) {
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < names.size(); ++i) index.emplace(names[i], i);
  std::vector<bool> placed(names.size(), false);
  std::vector<size_t> order;
  for (const std::string& name : use_order) {
    auto it = index.find(name);
    MW_CHECK_T(InvalidArgument, it != index.end(), "Gemini use_order names '", name,
               "', which is not a parameter of the model");
    MW_CHECK_T(InvalidArgument, !placed[it->second], "Gemini use_order names '", name, "' twice");
    placed[it->second] = true;
    order.push_back(it->second);
  }
  for (size_t i = 0; i < names.size(); ++i)
    if (!placed[i]) order.push_back(i);
  return order;
}

}  // namespace mw::gemini
