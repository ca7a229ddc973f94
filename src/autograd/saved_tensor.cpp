// Saved tensors and the thread-local stack of saved-tensor hooks (Note [Saved-tensor hooks]).
#include "autograd/saved_tensor.h"

#include <vector>

#include "core/error.h"

namespace mw {

namespace {
struct HookPair {
  PackHook pack;
  UnpackHook unpack;
};
thread_local std::vector<HookPair> t_hooks;
thread_local bool t_disabled = false;
}  // namespace

SavedTensorHooksGuard::SavedTensorHooksGuard(PackHook pack, UnpackHook unpack)
    : was_disabled_(t_disabled) {
  t_hooks.push_back({std::move(pack), std::move(unpack)});
  t_disabled = false;  // a guard installed inside a pack/unpack applies (recomputation)
}
SavedTensorHooksGuard::~SavedTensorHooksGuard() {
  t_hooks.pop_back();
  t_disabled = was_disabled_;
}

DisableSavedTensorHooksGuard::DisableSavedTensorHooksGuard() : saved_depth_(t_disabled ? 1 : 0) {
  t_disabled = true;
}
DisableSavedTensorHooksGuard::~DisableSavedTensorHooksGuard() { t_disabled = saved_depth_ != 0; }

SavedTensor::SavedTensor(const Tensor& t, const char* name) : defined_(t.defined()), name_(name) {
  if (!t.defined()) return;
  version_counter_ = t.storage()->version_counter();
  version_ = version_counter_->load(std::memory_order_relaxed);
  if (!t_hooks.empty() && !t_disabled) {
    HookPair hooks = t_hooks.back();
    {
      DisableSavedTensorHooksGuard no_nested_hooks;  // a pack hook's own ops are not packed
      packed_ = hooks.pack(t);
    }
    unpack_ = std::move(hooks.unpack);
  } else {
    data_ = t.detach();
  }
}

Tensor SavedTensor::unpack() const {
  if (!defined_) return Tensor();
  const uint64_t now = version_counter_->load(std::memory_order_relaxed);
  MW_CHECK_T(AutogradError, now == version_, "the ", name_,
             " saved for backward was modified in place (version ", version_, " -> ", now,
             "); compute on a copy (clone()) instead of writing into a tensor autograd saved");
  if (unpack_) {
    DisableSavedTensorHooksGuard no_nested_hooks;
    Tensor t = unpack_(packed_);
    return t.detach();
  }
  return data_;
}

}  // namespace mw
