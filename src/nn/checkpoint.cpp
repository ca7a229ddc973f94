// Non-reentrant checkpointing on saved-tensor hooks (Note [Non-reentrant checkpoint]).
#include "nn/checkpoint.h"

#include <cmath>

#include "autograd/autocast.h"
#include "core/random.h"

namespace mw::nn {

namespace {

// What one checkpointed call keeps between its forward and its recomputation.
struct Frame {
  CheckpointFunction fn;
  // Inputs, in one of three forms: kept (detached) tensors, host copies, or packed by hooks.
  std::vector<Tensor> inputs;
  std::vector<std::shared_ptr<void>> packed_inputs;
  UnpackHook unpack_input;
  std::vector<Device> input_devices;
  std::vector<bool> input_requires_grad;
  // For the in-place check: each input's version counter, kept past its storage (Note [Version
  // counter]); null for an undefined input.
  std::vector<std::shared_ptr<const std::atomic<uint64_t>>> input_counters;
  std::vector<uint64_t> input_versions;
  RngState rng;                 // default_generator() before the forward
  DType autocast = DType::F32;  // autocast_dtype() at the forward (Note [Autocast policy])
  // Shapes of the tensors the forward saved, in order (the recomputation must match).
  std::vector<Shape> saved_shapes;
  // Tensors saved by the last recomputation; an entry is emptied when it is served.
  std::vector<Tensor> recomputed;
};

// What the forward's pack hook returns: the frame and the index of the saved tensor.
struct SavedIndex {
  std::shared_ptr<Frame> frame;
  size_t index;
};

// Restores default_generator()'s state on scope exit, also when fn throws.
class RngRestore {
 public:
  RngRestore() : saved_(default_generator().state()) {}
  ~RngRestore() { default_generator().set_state(saved_); }
  RngRestore(const RngRestore&) = delete;
  RngRestore& operator=(const RngRestore&) = delete;

 private:
  RngState saved_;
};

std::vector<Tensor> restore_inputs(const Frame& f) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < f.input_devices.size(); ++i) {
    if (const auto& counter = f.input_counters[i]) {
      const uint64_t now = counter->load(std::memory_order_relaxed);
      MW_CHECK_T(AutogradError, now == f.input_versions[i], "checkpoint: input ", i,
                 " was modified in place after the checkpointed forward (version ",
                 f.input_versions[i], " -> ", now,
                 "); recomputation would differ. Pass a copy (clone()) to checkpoint instead");
    }
    Tensor x;
    if (!f.packed_inputs.empty()) {
      x = f.unpack_input(f.packed_inputs[i]);
    } else {
      x = f.inputs[i];
    }
    if (x.defined() && x.device() != f.input_devices[i]) x = x.to(f.input_devices[i]);
    if (x.defined()) {
      x = x.detach();
      if (f.input_requires_grad[i]) set_requires_grad(x);
    }
    out.push_back(std::move(x));
  }
  return out;
}

// Runs fn again with the forward's RNG state, collecting every saved tensor in order.
void recompute(Frame& f) {
  std::vector<Tensor> recorded;
  {
    RngRestore restore_callers_rng;
    default_generator().set_state(f.rng);
    AutocastGuard same_precision(f.autocast);
    std::vector<Tensor> inputs = restore_inputs(f);
    EnableGradGuard grad;
    SavedTensorHooksGuard record(
        [&recorded](const Tensor& t) -> std::shared_ptr<void> {
          recorded.push_back(t.detach());
          return nullptr;
        },
        [](const std::shared_ptr<void>&) -> Tensor {
          throw AutogradError("checkpoint: a tensor saved during recomputation was unpacked");
        });
    Tensor out = f.fn(inputs);  // its graph is dropped here; only `recorded` is kept
  }
  const size_t n = f.saved_shapes.size();
  for (size_t i = 0; i < std::min(n, recorded.size()); ++i) {
    MW_CHECK_T(AutogradError, recorded[i].shape() == f.saved_shapes[i],
               "checkpoint: recomputation saved tensor ", i, " with shape ",
               shape_str(recorded[i].shape()), " but the forward saved ",
               shape_str(f.saved_shapes[i]),
               "; the checkpointed function must build the same graph every time");
  }
  MW_CHECK_T(AutogradError, recorded.size() == n, "checkpoint: the forward saved ", n,
             " tensors but the recomputation saved ", recorded.size(),
             "; the checkpointed function must build the same graph every time (no data-dependent "
             "branches on grad mode or random numbers outside default_generator())");
  f.recomputed = std::move(recorded);
}

Tensor unpack_saved(const std::shared_ptr<void>& packed) {
  auto* si = static_cast<SavedIndex*>(packed.get());
  Frame& f = *si->frame;
  if (si->index >= f.recomputed.size() || !f.recomputed[si->index].defined()) recompute(f);
  return std::move(f.recomputed[si->index]);  // served once: backward owns it from here
}

}  // namespace

Tensor checkpoint(const CheckpointFunction& fn, const std::vector<Tensor>& inputs,
                  const CheckpointOptions& options) {
  if (!grad_enabled()) return fn(inputs);
  auto frame = std::make_shared<Frame>();
  frame->fn = fn;
  frame->rng = default_generator().state();
  frame->autocast = autocast_dtype();
  const bool use_hooks = options.pack_input && options.unpack_input;
  if (use_hooks) frame->unpack_input = options.unpack_input;
  for (const Tensor& x : inputs) {
    frame->input_devices.push_back(x.defined() ? x.device() : Device::cpu());
    frame->input_requires_grad.push_back(x.defined() && requires_grad(x));
    frame->input_counters.push_back(x.defined() ? x.storage()->version_counter() : nullptr);
    frame->input_versions.push_back(x.defined() ? x.storage()->version() : 0);
    if (use_hooks) {
      frame->packed_inputs.push_back(x.defined() ? options.pack_input(x) : nullptr);
    } else if (x.defined() && options.offload_inputs_to_cpu && !x.device().is_cpu()) {
      frame->inputs.push_back(x.detach().to(Device::cpu()));
    } else {
      frame->inputs.push_back(x.defined() ? x.detach() : Tensor());
    }
  }
  std::weak_ptr<Frame> weak = frame;  // the forward's hook must not keep the frame alive itself
  SavedTensorHooksGuard hooks(
      [weak](const Tensor& t) -> std::shared_ptr<void> {
        auto f = weak.lock();
        f->saved_shapes.push_back(t.shape());
        return std::make_shared<SavedIndex>(SavedIndex{f, f->saved_shapes.size() - 1});
      },
      unpack_saved);
  return fn(inputs);
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input,
                  const CheckpointOptions& options) {
  return checkpoint([fn](const std::vector<Tensor>& in) { return fn(in[0]); }, {input}, options);
}

std::vector<Segment> plan_segments(int64_t n_modules, int64_t segments) {
  MW_CHECK_T(InvalidArgument, n_modules >= 1 && segments >= 1 && segments <= n_modules,
             "checkpoint_sequential: ", segments, " segments for ", n_modules,
             " modules; use between 1 and the number of modules");
  const int64_t size = n_modules / segments;
  std::vector<Segment> out;
  for (int64_t s = 0; s + 1 < segments; ++s) out.push_back({s * size, (s + 1) * size, true});
  out.push_back({(segments - 1) * size, n_modules, false});
  return out;
}

int64_t sqrt_segments(int64_t n_modules) {
  return std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(n_modules))));
}

namespace {
Tensor run_segment(const std::vector<std::shared_ptr<Module>>& modules, const Segment& seg,
                   const Tensor& x, const CheckpointOptions& options) {
  // Captures the modules by value: the recomputation runs in backward, after this call returns.
  auto run = [modules, seg](const Tensor& in) {
    Tensor y = in;
    for (int64_t i = seg.begin; i < seg.end; ++i) y = (*modules[static_cast<size_t>(i)])(y);
    return y;
  };
  return seg.checkpointed ? checkpoint(run, x, options) : run(x);
}
}  // namespace

Tensor checkpoint_sequential(const std::vector<std::shared_ptr<Module>>& modules, int64_t segments,
                             const Tensor& input, const CheckpointOptions& options) {
  Tensor x = input;
  for (const Segment& seg : plan_segments(static_cast<int64_t>(modules.size()), segments))
    x = run_segment(modules, seg, x, options);
  return x;
}

SegmentedRunner::SegmentedRunner(std::vector<std::shared_ptr<Module>> modules,
                                 std::vector<Segment> plan, CheckpointOptions options)
    : modules_(std::move(modules)),
      segment_of_(modules_.size(), -1),
      plan_(std::move(plan)),
      options_(std::move(options)) {
  for (size_t s = 0; s < plan_.size(); ++s) {
    MW_CHECK_T(InvalidArgument,
               plan_[s].begin >= 0 && plan_[s].begin < plan_[s].end &&
                   plan_[s].end <= static_cast<int64_t>(modules_.size()),
               "SegmentedRunner: segment [", plan_[s].begin, ", ", plan_[s].end,
               ") is empty or outside ", modules_.size(), " modules");
    for (int64_t i = plan_[s].begin; i < plan_[s].end; ++i) {
      MW_CHECK_T(InvalidArgument, segment_of_[static_cast<size_t>(i)] < 0,
                 "SegmentedRunner: module ", i, " is in two segments");
      segment_of_[static_cast<size_t>(i)] = static_cast<int64_t>(s);
    }
  }
  for (size_t i = 0; i < segment_of_.size(); ++i)
    MW_CHECK_T(InvalidArgument, segment_of_[i] >= 0, "SegmentedRunner: module ", i,
               " is in no segment");
}

Tensor SegmentedRunner::operator()(int64_t index, const Tensor& x) const {
  MW_CHECK_T(InvalidArgument, index >= 0 && index < static_cast<int64_t>(modules_.size()),
             "SegmentedRunner: module ", index, " of ", modules_.size());
  const Segment& seg = plan_[static_cast<size_t>(segment_of_[static_cast<size_t>(index)])];
  if (index != seg.begin) return x;  // already run as part of its segment
  return run_segment(modules_, seg, x, options_);
}

CheckpointWrapper::CheckpointWrapper(std::shared_ptr<Module> module, bool offload_to_cpu)
    : module_(std::move(module)) {
  MW_CHECK_T(InvalidArgument, module_ != nullptr, "CheckpointWrapper: no module to wrap");
  register_module("module", module_);
  options_.offload_inputs_to_cpu = offload_to_cpu;
}

void CheckpointWrapper::set_input_hooks(PackHook pack, UnpackHook unpack) {
  options_.pack_input = std::move(pack);
  options_.unpack_input = std::move(unpack);
}

Tensor CheckpointWrapper::forward(const Tensor& x) {
  std::shared_ptr<Module> m = module_;
  return checkpoint([m](const Tensor& in) { return (*m)(in); }, x, options_);
}

}  // namespace mw::nn
