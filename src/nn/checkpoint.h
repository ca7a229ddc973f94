// Activation recomputation (Chen et al. 2016): checkpoint, checkpoint_sequential,
// CheckpointWrapper.
//
// Note [Non-reentrant checkpoint]: checkpoint(fn, inputs) runs fn once, with grad, recording the
// ordinary graph, but under a saved-tensor hook whose pack stores nothing but the tensor's index.
// The only activations kept are fn's inputs (held by the checkpoint's frame). At the first unpack
// in backward, fn is run again on detached copies of the inputs, with grad enabled and under a
// recording hook that collects every saved tensor in order; each unpack is then served from that
// list (and drops its entry, so recomputed activations die as backward consumes them). Gradients
// flow through the original graph; the recomputed graph is thrown away at once.
//
// Invariants:
//  - The RNG state of default_generator() at the checkpoint's forward is restored for the
//    recomputation (and the caller's state put back afterwards), so dropout masks repeat exactly
//    and gradients are bitwise equal to a run without checkpointing.
//  - The recomputation must save the same number of tensors with the same shapes; otherwise an
//    AutogradError names the first difference (fn is not deterministic in its graph).
//  - An input modified in place between forward and backward is reported, not silently used.
//  - Under no-grad, checkpoint just calls fn.
//
// Inputs can be kept on the device (default), copied to the host (FairScale's offload_to_cpu), or
// handed to caller-supplied pack/unpack functions, e.g. an activation offloader's, which copies
// them in the background and prefetches them in reverse order (Note [Offload with checkpointing] in
// offload/activation/activation_offload.h).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "autograd/saved_tensor.h"
#include "nn/module.h"

namespace mw::nn {

using CheckpointFunction = std::function<Tensor(const std::vector<Tensor>& inputs)>;

struct CheckpointOptions {
  // FairScale offload_to_cpu: keep the inputs on Device::cpu() between forward and backward
  // (a synchronous copy), and copy them back to their device for the recomputation.
  bool offload_inputs_to_cpu = false;
  // When both are set they store the inputs instead (takes precedence over offload_inputs_to_cpu).
  PackHook pack_input;
  UnpackHook unpack_input;
};

Tensor checkpoint(const CheckpointFunction& fn, const std::vector<Tensor>& inputs,
                  const CheckpointOptions& options = {});
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input,
                  const CheckpointOptions& options = {});

// One run of consecutive modules [begin, end) of a sequence.
struct Segment {
  int64_t begin = 0, end = 0;
  bool checkpointed = false;
};
// PyTorch's checkpoint_sequential split: `segments` runs of n / segments modules, the last one
// taking the remainder and NOT checkpointed (its activations are needed at once by backward).
// Requires 1 <= segments <= n_modules.
std::vector<Segment> plan_segments(int64_t n_modules, int64_t segments);
// Chen et al.'s choice: round(sqrt(n)) segments, at least 1.
int64_t sqrt_segments(int64_t n_modules);

Tensor checkpoint_sequential(const std::vector<std::shared_ptr<Module>>& modules, int64_t segments,
                             const Tensor& input, const CheckpointOptions& options = {});

// Runs a model's own per-module loop (`for i: x = run(i, x)`, e.g. GPT2::run_block) with
// checkpoint_sequential's segments: the call for the first module of a segment runs the whole
// segment (checkpointed or not) and the calls for the rest of that segment pass x through, so the
// loop's result is checkpoint_sequential's. The loop must feed each result into the next call.
class SegmentedRunner {
 public:
  SegmentedRunner(std::vector<std::shared_ptr<Module>> modules, std::vector<Segment> plan,
                  CheckpointOptions options = {});
  Tensor operator()(int64_t index, const Tensor& x) const;

 private:
  std::vector<std::shared_ptr<Module>> modules_;
  std::vector<int64_t> segment_of_;  // module index -> segment index
  std::vector<Segment> plan_;
  CheckpointOptions options_;
};

// FairScale's checkpoint_wrapper: the wrapped module's forward is checkpointed; with
// offload_to_cpu its inputs are kept on the host between forward and backward.
class CheckpointWrapper : public Module {
 public:
  CheckpointWrapper(std::shared_ptr<Module> module, bool offload_to_cpu = false);
  // Store inputs through these instead (an activation offloader's pack/unpack).
  void set_input_hooks(PackHook pack, UnpackHook unpack);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "CheckpointWrapper"; }
  const std::shared_ptr<Module>& wrapped() const { return module_; }

 private:
  std::shared_ptr<Module> module_;
  CheckpointOptions options_;
};

}  // namespace mw::nn
