// record_use_order and packing_order (use_order.h, Note [First-use order]).
#include "offload/gemini/use_order.h"

#include <memory>
#include <unordered_map>

#include "autograd/autograd.h"
#include "core/error.h"

namespace mw::gemini {

std::vector<std::string> record_use_order(nn::Module& model, const std::function<void()>& forward) {
  const auto named = model.named_parameters();
  struct Probe {
    std::unordered_map<const TensorImpl*, size_t> index;  // parameter -> its named_parameters()
    std::vector<bool> seen;
    std::vector<size_t> order;
  };
  auto probe = std::make_shared<Probe>();
  for (size_t i = 0; i < named.size(); ++i) probe->index[named[i].second.impl()] = i;
  probe->seen.assign(named.size(), false);
  // The hooks hold the probe weakly: once it is gone (this function returned), they do nothing.
  const std::weak_ptr<Probe> weak = probe;
  for (auto& [name, m] : model.named_modules()) {
    if (m->own_parameters().empty()) continue;
    m->add_forward_pre_hook([weak](nn::Module& mod, const Tensor&) {
      const std::shared_ptr<Probe> p = weak.lock();
      if (!p) return;
      for (auto& [pname, t] : mod.own_parameters()) {
        const size_t i = p->index.at(t.impl());
        if (!p->seen[i]) p->seen[i] = true, p->order.push_back(i);
      }
    });
  }
  {
    NoGradGuard no_grad;
    forward();
  }
  for (size_t i = 0; i < named.size(); ++i)
    if (!probe->seen[i]) probe->order.push_back(i);
  std::vector<std::string> names;
  for (size_t i : probe->order) names.push_back(named[i].first);
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
