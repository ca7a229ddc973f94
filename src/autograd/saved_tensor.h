// SavedTensor: what a Node keeps for its backward, with the version check and pack/unpack hooks.
//
// Note [Saved-tensor hooks]: while a SavedTensorHooksGuard is alive on a thread, every tensor that
// a node saves goes through its pack function, and unpack turns the packed value back into a tensor
// when backward needs it. Guards nest; only the innermost applies (PyTorch's saved_tensors_hooks).
// Recomputation (nn/checkpoint) and activation offload (offload/activation) are built on this.
// Hooks are disabled while a pack or unpack function runs (its own ops are not packed), but a guard
// created inside one applies again for its lifetime: recomputation runs its forward inside an
// unpack, under its own recording hook.
//
// A saved tensor never keeps the saving op's output's grad_fn alive (it is stored detached), so the
// graph has no reference cycles. Its storage version is recorded at save time and checked at unpack
// (Note [Version counter] in core/storage.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "core/tensor.h"

namespace mw {

using PackHook = std::function<std::shared_ptr<void>(const Tensor&)>;
using UnpackHook = std::function<Tensor(const std::shared_ptr<void>&)>;

class SavedTensorHooksGuard {
 public:
  SavedTensorHooksGuard(PackHook pack, UnpackHook unpack);
  ~SavedTensorHooksGuard();
  SavedTensorHooksGuard(const SavedTensorHooksGuard&) = delete;
  SavedTensorHooksGuard& operator=(const SavedTensorHooksGuard&) = delete;

 private:
  bool was_disabled_;
};

// Temporarily disables any saved-tensor hooks (for code that runs inside a hook).
class DisableSavedTensorHooksGuard {
 public:
  DisableSavedTensorHooksGuard();
  ~DisableSavedTensorHooksGuard();
  DisableSavedTensorHooksGuard(const DisableSavedTensorHooksGuard&) = delete;
  DisableSavedTensorHooksGuard& operator=(const DisableSavedTensorHooksGuard&) = delete;

 private:
  size_t saved_depth_;
};

class SavedTensor {
 public:
  SavedTensor() = default;
  // `name` identifies the tensor in error messages ("layernorm input").
  SavedTensor(const Tensor& t, const char* name);
  Tensor unpack() const;
  bool defined() const { return defined_; }

 private:
  bool defined_ = false;
  const char* name_ = "";
  Tensor data_;                   // set when no hook packed it
  std::shared_ptr<void> packed_;  // set when a hook packed it
  UnpackHook unpack_;
  // The saved storage's version counter, kept past the storage (Note [Version counter]).
  std::shared_ptr<const std::atomic<uint64_t>> version_counter_;
  uint64_t version_ = 0;
};

}  // namespace mw
