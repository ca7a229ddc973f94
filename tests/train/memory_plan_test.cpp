// The memory plan (train/memory_plan.h) against the allocators' measured peaks after real
// training steps in this process: host and sim, with and without recomputation, with and without
// Gemini. The refusals: memory_check_test.cpp.
#include "train/memory_plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <optional>

#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/random.h"
#include "data/random_tokens.h"
#include "models/gpt2/model.h"
#include "models/gpt2/spec.h"
#include "nn/checkpoint.h"
#include "offload/activation/activation_offload.h"
#include "optim/hybrid_adam.h"
#include "optim/optimizer.h"
#include "plan_test_inputs.h"

namespace mw::train {
namespace {

using gpt2::GPT2;
using gpt2::ParameterFactory;
using gpt2::tensor_specs;
using gpt2::TensorSpec;
using test::expect_within;
using test::inputs;
using test::kSim;
using test::kTolerance;
using test::on_sim;
using test::small_ish;
using test::tiny;
using test::wide;

// Note [Host caching]: on the cpu device a cached block is split for a smaller request unless
// less than 1 MiB would be left, so the allocator counts the bytes asked for within 1 MiB a block.
// (Before splitting it handed out whole blocks of up to twice the request: 20-45% above the plan
// at a 256-wide model, docs/reliability.md.) The shapes: plan_test_inputs.h.

struct Peaks {
  int64_t host_bytes = 0, device_bytes = 0;
  int64_t disk_bytes = 0;  // the NVMe states' file
};

// Gemini as gpt2_train builds it for these inputs.
std::unique_ptr<gemini::Gemini> make_gemini(const PlanInputs& in, const Device& dev) {
  gemini::GeminiOptions g = in.gemini_options;
  g.device = dev;
  g.verbose = false;
  g.search.interval_numel = in.config.n_embd;
  g.adam.nvme.window_bytes = in.nvme_window_bytes;  // as gpt2_train passes --nvme-window
  g.adam.nvme.slice_numel = in.nvme_slice_numel;
  g.keeps_gradients_until_step = !in.update_in_backward;
  std::vector<std::pair<std::string, Shape>> tensors;
  for (const auto& spec : tensor_specs(in.config)) tensors.emplace_back(spec.name, spec.shape);
  auto gem = std::make_unique<gemini::Gemini>(g, tensors);
  gem->set_deferred_updates(!in.update_in_backward);  // as the trainer, under --grad-accum
  return gem;
}

// Two training steps as gpt2_train runs them (the second with the Adam states in place).
// The optimizer the plan assumes: Gemini (already built into `gem`), AdamW or HybridAdam.
std::unique_ptr<optim::Optimizer> make_optimizer(const PlanInputs& in, GPT2& model,
                                                 std::unique_ptr<gemini::Gemini>& gem) {
  if (in.gemini) {
    gem->attach(model);
    return std::move(gem);
  }
  if (in.adamw) return std::make_unique<optim::AdamW>(model.parameters(), optim::AdamHyper{});
  optim::NvmeOffloadOptions nvme;
  nvme.fraction = in.nvme_fraction;
  nvme.window_bytes = in.nvme_window_bytes;
  nvme.slice_numel = in.nvme_slice_numel;
  optim::HybridAdamOptions o{optim::AdamHyper{}, -1.f, nvme};
  o.update_in_backward = in.update_in_backward;
  return std::make_unique<optim::HybridAdam>(model.parameters(), o);
}

// Recomputation as gpt2_train sets it up (Trainer::build_recomputation): every block
// (--checkpoint-activations) or sqrt(L) segments (--checkpoint-segments 0); with an offloader
// the checkpoints' inputs go through it.
void recompute(GPT2& model, const PlanInputs& in, offload::ActivationOffloader* offloader) {
  const int64_t n_layer = in.config.n_layer;
  std::vector<nn::Segment> plan;
  if (in.checkpoint_segments >= 0)
    plan = nn::plan_segments(
        n_layer, in.checkpoint_segments == 0 ? nn::sqrt_segments(n_layer) : in.checkpoint_segments);
  else
    for (int64_t i = 0; i < n_layer; ++i) plan.push_back({i, i + 1, true});
  nn::CheckpointOptions copts;
  if (offloader) {
    copts.pack_input = offloader->pack_hook();
    copts.unpack_input = offloader->unpack_hook();
  }
  auto runner = std::make_shared<nn::SegmentedRunner>(
      std::vector<std::shared_ptr<nn::Module>>(model.blocks().begin(), model.blocks().end()), plan,
      copts);
  model.run_block = [runner](nn::Block&, int64_t i, const Tensor& x) { return (*runner)(i, x); };
}

// A sampling forward as Trainer::sample_by_forwards runs it under Gemini (Note [Sampling during
// training]): no grad, eval mode, inside an EvalScope, the longest context the plan assumes.
void sample_forward(GPT2& model, const PlanInputs& in, const Device& dev, gemini::Gemini& gem) {
  gemini::EvalScope scope(gem);
  NoGradGuard no_grad;
  model.eval();
  const int64_t t = std::min(in.sample_context, in.config.n_positions);
  const std::vector<int32_t> ids(static_cast<size_t>(t), 1);
  const Tensor logits = model(Tensor::from_vector(ids, {1, t}, dev));
  EXPECT_EQ(logits.size(1), t);
  model.train();
}

Peaks measure(const PlanInputs& in) {
  const Device dev = in.device.is_cpu() ? Device::cpu() : Device::sim(kSim);
  Allocator& host = allocator_for(Device::cpu());
  host.empty_cache();
  const int64_t host_base = host.stats().current_bytes;
  host.reset_peak();
  if (dev.is_sim()) {
    set_sim_capacity(kSim, in.device_capacity_bytes);
    allocator_for(dev).reset_peak();
  }
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<gemini::Gemini> gem_owned;
  int64_t disk_bytes = 0, staging_bytes = 0;
  ParameterFactory factory;
  if (in.gemini) {  // streaming construction, as gpt2_train does
    gem_owned = make_gemini(in, dev);
    factory.make = [&](const TensorSpec& spec) { return gem_owned->make_parameter(spec.name); };
    factory.ready = [&](const TensorSpec& spec) { gem_owned->parameter_ready(spec.name); };
  }
  {
    GPT2 model(in.config, 3, DType::F32, in.gemini ? Device::cpu() : dev, factory);
    opt = make_optimizer(in, model, gem_owned);
    model.train();
    // --offload-activations, as gpt2_train sets it up (Trainer::build_recomputation: forward's
    // pending copies held to the prefetch's bytes), with the plan's window.
    std::unique_ptr<offload::ActivationOffloader> offloader;
    if (in.offload_activations) {
      offload::ActivationOffloadOptions o;
      o.prefetch_bytes = in.offload_in_flight_bytes;
      o.max_pending_bytes = in.offload_in_flight_bytes;
      offloader = std::make_unique<offload::ActivationOffloader>(o);
    }
    if (in.checkpoint_every_block || in.checkpoint_segments >= 0)
      recompute(model, in, offloader.get());
    for (int step = 0; step < 2; ++step) {
      std::vector<int32_t> tokens(static_cast<size_t>(in.batch * in.seq));
      data::random_tokens(9, step, in.batch, in.seq, in.config.vocab_size, tokens.data());
      Tensor ids = Tensor::from_vector(tokens, {in.batch, in.seq}, dev);
      opt->zero_grad();
      for (int64_t micro = 0; micro < in.micro_batches; ++micro) {  // --grad-accum
        if (in.gemini)
          static_cast<gemini::Gemini*>(opt.get())->set_final_backward(micro + 1 ==
                                                                      in.micro_batches);
        std::unique_ptr<offload::OffloadScope> scope;
        if (offloader) scope = std::make_unique<offload::OffloadScope>(*offloader);
        std::optional<AutocastGuard> autocast(std::in_place, in.precision);
        Tensor logits = model(ids);
        Tensor loss = shifted_cross_entropy(logits, ids);
        scope.reset();
        autocast.reset();
        logits = Tensor();
        backward(loss);
      }
      opt->step();
    }
    if (in.sample_tokens > 0) {  // Gemini's path (the KV-cache decoder's heap is no allocator's)
      EXPECT_TRUE(in.gemini);
      if (in.gemini) sample_forward(model, in, dev, *static_cast<gemini::Gemini*>(opt.get()));
    }
    optim::HybridAdam* adam = in.gemini ? &static_cast<gemini::Gemini*>(opt.get())->adam()
                                        : dynamic_cast<optim::HybridAdam*>(opt.get());
    if (adam && adam->nvme()) disk_bytes = adam->nvme()->stats().file_bytes;
    if (adam && adam->nvme()) staging_bytes = adam->nvme()->stats().staging_bytes;  // its slots
    opt.reset();
  }
  Peaks p;
  p.disk_bytes = disk_bytes;
  p.host_bytes = host.stats().peak_bytes - host_base + staging_bytes;
  if (dev.is_sim()) {
    p.device_bytes = allocator_for(dev).stats().peak_bytes;
    set_sim_capacity(kSim, 0);
  }
  return p;
}

// check_host = false only where the host peak depends on timing (printed, not compared);
// host_timing_bytes as expect_within's.
void check(const PlanInputs& in, bool check_host = true, int64_t host_timing_bytes = 0) {
  const MemoryPlan plan = plan_memory(in);
  std::printf("%s", plan.table().c_str());
  Peaks measured = measure(in);
  // A run measures less than the plan where a copy worker lagged behind the moment the plan
  // counts (activations prefetched back after the LM head's backward had freed the logits: sim
  // -15% in one CI run, 0% in every local one, loaded or not); the highest of three is compared.
  const auto below = [](int64_t planned, int64_t got, int64_t timing) {
    return planned - timing - got > kTolerance * static_cast<double>(got);
  };
  for (int run = 1; run < 3 && (below(plan.device_bytes, measured.device_bytes, 0) ||
                                below(plan.host_bytes, measured.host_bytes, host_timing_bytes));
       ++run) {
    const Peaks again = measure(in);
    measured.host_bytes = std::max(measured.host_bytes, again.host_bytes);
    measured.device_bytes = std::max(measured.device_bytes, again.device_bytes);
  }
  if (check_host)
    expect_within(plan.host_bytes, measured.host_bytes, "host", host_timing_bytes);
  else
    std::printf("host (not compared): plan %.2f MiB, measured %.2f MiB\n",
                static_cast<double>(plan.host_bytes) / (1 << 20),
                static_cast<double>(measured.host_bytes) / (1 << 20));
  if (!in.device.is_cpu()) expect_within(plan.device_bytes, measured.device_bytes, "sim");
  if (plan.disk_bytes > 0) expect_within(plan.disk_bytes, measured.disk_bytes, "disk");
}

TEST(MemoryPlan, TinyOnSim) { check(on_sim(inputs(tiny(), 4, 32))); }

TEST(MemoryPlan, SmallIshOnSim) { check(on_sim(inputs(small_ish(), 4, 128))); }

TEST(MemoryPlan, SmallIshOnSimWithRecomputation) {
  PlanInputs in = on_sim(inputs(small_ish(), 4, 128));
  in.checkpoint_every_block = true;
  check(in);
}

// sqrt(L) segments, the last not checkpointed: its backward frees its saved tensors before any
// segment is recomputed, so the two moments are the head's (everything stored) and a
// recomputation (the checkpoints' inputs only). Counting what is stored at both was +59% for a
// 6-block 256-wide model (122.6 MiB planned, 77 measured); here +33% (L 9, 3 segments of 3).
TEST(MemoryPlan, SmallIshOnSimWithSqrtSegments) {
  Config c = small_ish();
  c.n_layer = 9;
  PlanInputs in = on_sim(inputs(c, 4, 128));
  in.checkpoint_segments = 0;
  check(in);
}

// Note [Activations under autocast]. fp16's loss scaling defers the updates, as the trainer sets
// it: with every block checkpointed, all gradients beside the first block's backward and its f32
// transients (4 blocks of width 256, B8 T128, 48 MiB measured against 39.3 planned with the
// MLP's gradient alone; here -15.1%).
TEST(MemoryPlan, SmallIshOnSimInBf16AndFp16) {
  for (DType low : {DType::BF16, DType::F16})
    for (bool recompute : {false, true}) {
      PlanInputs in = on_sim(inputs(small_ish(), 8, 128));
      in.precision = low, in.checkpoint_every_block = recompute;
      in.update_in_backward = low != DType::F16;
      check(in);
    }
  PlanInputs in = on_sim(inputs(wide(), 4, 128));  // GPT-2 small's vocabulary: the head's peak
  in.precision = DType::BF16;
  check(in);
}

// A block's backward holds its op's weight gradient until the update in backward steps it: with
// a small vocabulary and few tokens that moment, not the LM head's, is the peak (1 block of width
// 512, B4 T16, vocabulary 257: 22 MiB against 17.5 planned from the head alone; here -21.2%).
TEST(MemoryPlan, OneWideBlockOnSimWithASmallVocabulary) {
  Config c = small_ish();
  c.n_layer = 1;
  c.n_embd = 512;
  c.n_head = 8;
  c.vocab_size = 257;
  check(on_sim(inputs(c, 4, 16)));
}

TEST(MemoryPlan, SmallIshOnSimWithAdamW) {  // no update in backward: every gradient at once
  PlanInputs in = on_sim(inputs(small_ish(), 2, 64));
  in.adamw = true;
  check(in);
}

// --grad-accum: from the second micro-batch on, the gradients so far live beside its
// activations. Without the plan's row for them the sim peak was 36% above the plan for GPT-2 small
// B2 T128 (1292.7 MiB measured, 949.6 planned); 22% with recomputation.
TEST(MemoryPlan, SmallIshOnSimWithGradientAccumulation) {
  PlanInputs in = on_sim(inputs(small_ish(), 4, 128));
  in.update_in_backward = false;  // as the trainer sets it under --grad-accum
  in.micro_batches = 2;
  check(in);
  in.checkpoint_every_block = true;
  check(in);
}

TEST(MemoryPlan, SmallIshOnSimWithHalfTheAdamStatesOnNvme) {
  PlanInputs in = on_sim(inputs(small_ish(), 4, 128));
  in.nvme_fraction = 0.5;
  in.nvme_window_bytes = 1 << 20;
  check(in);
}

// --offload-activations (issue #17). The host is measured with the cpu cache off: its best-fit
// slack is not planned (next test). With a 128 MiB window (gpt2_train's before Note [Offload
// window]) every offloaded activation of this model is prefetched back from the head's backward
// on, so the device peak is the plain run's; with gpt2_train's (two blocks) or a 4 MiB window the
// device holds a block's backward or the head's and the window (the in-flight bound is
// timing-dependent, within the bar here: -4%).
// Whether the logits' copy to the host starts before the loss's backward cancels it is timing too
// (the host 61.9 MiB against 65.9 planned in 98 of 200 runs on a loaded machine), so the plan may
// count it and the run not.
void check_offloaded(const PlanInputs& in) {
  set_host_max_cached_bytes(0);
  check(in, true, in.batch * in.seq * in.config.vocab_size * 4);
  set_host_max_cached_bytes(int64_t{4} << 30);  // the cpu allocator's default (allocator.cpp)
}

TEST(MemoryPlan, SmallIshOnSimWithOffloadedActivations) {
  PlanInputs in = on_sim(inputs(small_ish(), 4, 128));
  in.offload_activations = true;
  check_offloaded(in);
  in.offload_in_flight_bytes = offload_window_bytes(in);
  check_offloaded(in);
  in.offload_in_flight_bytes = 4 << 20;
  check_offloaded(in);
  // No update in backward (--grad-clip): every gradient at the end of backward, beside what the
  // device holds of the activations, not all of them (planned so, this case was -27%).
  in.update_in_backward = false;
  check_offloaded(in);
  in.offload_in_flight_bytes = 128 << 20;
  check_offloaded(in);
  in.offload_activations = false;
  check_offloaded(in);
}

// Recomputation, offload and autocast at once: the device's moments as activation_peak counts
// them, the LM head's f32 accumulators and a recomputed block's f32 transients (4 blocks of width
// 256, B8 T128, bf16: the sim peak 41 MiB against 28.3 planned with the gradients alone; here
// -16.2%). The host is not compared: whether the logits' copy (4 MiB of the 9.5 planned) starts
// before the loss's backward cancels it is timing (measured +11.7% without it).
TEST(MemoryPlan, SmallIshOnSimInBf16WithRecomputationAndOffload) {
  PlanInputs in = on_sim(inputs(small_ish(), 8, 128));
  in.precision = DType::BF16;
  in.checkpoint_every_block = true;
  in.offload_activations = true;
  check(in, /*check_host=*/false);
}

// With recomputation the host holds what recomputation stores (the checkpoints' inputs, packed by
// the offloader) and the head's and loss's saved tensors; the device a recomputed segment, the
// gradients in flight and what has been prefetched back (all of it, or the 1 MiB bound).
TEST(MemoryPlan, SmallIshOnSimWithOffloadedActivationsAndRecomputation) {
  PlanInputs in = on_sim(inputs(small_ish(), 4, 128));
  in.config.n_layer = 9;  // sqrt segments: [0,3) [3,6) checkpointed, [6,9) stored whole
  in.offload_activations = true;
  in.checkpoint_every_block = true;
  check_offloaded(in);
  in.offload_in_flight_bytes = 1 << 20;
  check_offloaded(in);
  in.checkpoint_every_block = false;
  in.checkpoint_segments = 0;
  check_offloaded(in);
  in.offload_in_flight_bytes = PlanInputs{}.offload_in_flight_bytes;
  check_offloaded(in);
}

// Issue #17: the cpu plan at small widths. The plan counts the bytes the ops ask for; the cpu
// allocator counts what each request was given, which splitting keeps to the request (Note [Host
// caching]). Measured with the cache on and off, both are within the bar: no slack of reused
// blocks, small tensors, thread-local buffers or allocator headers is left out of the plan.
TEST(MemoryPlan, SmallIshOnTheCpuIsExactWithAndWithoutTheCache) {
  const PlanInputs in = inputs(small_ish(), 4, 128);
  const int64_t planned = plan_memory(in).host_bytes;
  const Peaks cached = measure(in);
  set_host_max_cached_bytes(0);
  const Peaks uncached = measure(in);
  set_host_max_cached_bytes(int64_t{4} << 30);
  expect_within(planned, cached.host_bytes, "host, cache on");
  expect_within(planned, uncached.host_bytes, "host, cache off");
}

TEST(MemoryPlan, WideOnTheCpu) { check(inputs(wide(), 4, 128)); }

TEST(MemoryPlan, WideOnTheCpuWithRecomputation) {
  PlanInputs in = inputs(wide(), 4, 128);
  in.checkpoint_every_block = true;
  check(in);
}

// Auto below the plain run's need, so it must evict: the device peak is capacity x (1 - margin).
PlanInputs gemini_auto(const Config& c, int64_t chunk_numel) {
  PlanInputs in = on_sim(inputs(c, 4, 128));
  in.gemini = true;
  in.gemini_options.policy = gemini::Policy::kAuto;
  in.gemini_options.chunk_numel = chunk_numel;
  PlanInputs plain = in;
  plain.gemini = false;
  in.device_capacity_bytes = round_up(plan_memory(plain).device_bytes * 9 / 10, kHostAlignment);
  return in;
}

TEST(MemoryPlan, SmallIshOnSimWithGeminiAuto) { check(gemini_auto(small_ish(), 300000)); }

// Note [Chunks moved to the device]: with room to spare, --gpu-margin-mem-ratio homes some chunks
// (0.2 of the room) or all of them (1) on the device after the warmup, with their m and v.
TEST(MemoryPlan, SmallIshOnSimWithGeminiAutoMovingChunksToTheDevice) {
  for (double ratio : {0.2, 1.0}) {
    SCOPED_TRACE(ratio);
    PlanInputs in = gemini_auto(small_ish(), 300000);
    in.device_capacity_bytes *= 3;
    in.gemini_options.gpu_margin_mem_ratio = ratio;
    check(in);
  }
}

// The sampling forward's arithmetic against a real no-grad forward of [1, t] on sim (the path of
// CUDA without Gemini): a context where the MLP is the widest moment (t 1024: 8 MiB of [t, F]; the
// attention's 16 MiB of probabilities are per-task scratch since Note [Row statistics instead of
// probabilities]) and one where the logits are (V 8192, t 512: 16 MiB). The plan counts the widest
// tensors of each moment; one short-lived [t, C] beside them is not (1 MiB of 13 at t 1024).
TEST(MemoryPlan, ASamplingForwardNeedsWhatThePlanSays) {
  struct Case {
    int64_t t, vocab;
  };
  for (const Case k : {Case{1024, 2048}, Case{512, 8192}}) {
    Config c = small_ish();
    c.n_positions = 1024;
    c.vocab_size = k.vocab;
    PlanInputs in = on_sim(inputs(c, 1, 8));
    in.sample_tokens = k.t - 1;
    in.sample_context = k.t;
    const Device dev = Device::sim(kSim);
    GPT2 model(in.config, 3, DType::F32, dev);
    model.eval();
    NoGradGuard no_grad;
    Allocator& sim = allocator_for(dev);
    const Tensor ids =
        Tensor::from_vector(std::vector<int32_t>(static_cast<size_t>(k.t), 1), {1, k.t}, dev);
    const int64_t before = sim.stats().current_bytes;
    sim.reset_peak();
    { const Tensor logits = model(ids); }
    expect_within(sampling_forward_bytes(in), sim.stats().peak_bytes - before, "sampling forward");
  }
}

// --sample-every under Gemini: a no-grad forward of the whole context (1024 tokens) between steps
// needs more than a B1 T8 step's activations (2.7 MiB, mostly wte's gradient). The plan counts
// every chunk on the device beside it; an evaluation releases each chunk after its last use (Note
// [Evaluation forward]), so the plan is an upper bound here (37.1 MiB planned, 27.0 measured),
// never below the need.
TEST(MemoryPlan, SmallIshOnSimWithGeminiAndSamplingIsBoundedByThePlan) {
  Config c = small_ish();
  c.n_positions = 1024;
  PlanInputs in = gemini_auto(c, 600000);
  in.batch = 1;
  in.seq = 8;
  const auto non_model = [](const MemoryPlan& p) {
    for (const PlanRow& r : p.rows)
      if (r.what == "activations + head") return r.bytes;
    return int64_t{0};
  };
  const int64_t step_activations = non_model(plan_memory(in));
  in.sample_tokens = 1100;
  in.sample_context = 1101;  // more than n_positions: the context stops there
  const MemoryPlan plan = plan_memory(in);
  // The non-model row becomes the sampling forward.
  EXPECT_GT(sampling_forward_bytes(in), step_activations);
  EXPECT_EQ(non_model(plan), sampling_forward_bytes(in));
  const Peaks measured = measure(in);
  std::printf("sim: plan %.2f MiB, measured %.2f MiB\n", plan.device_bytes / 1048576.0,
              measured.device_bytes / 1048576.0);
  EXPECT_LE(measured.device_bytes, plan.device_bytes);
  expect_within(plan.host_bytes, measured.host_bytes, "host");
}

// Under Gemini the parameters are chunk bytes: a model of many small tensors packed into 16 KiB
// chunks counts each chunk rounded once, not every tensor rounded to 4 KiB. (Counting tensors put
// 0.1 MiB of phantom Adam states on the device and refused tools/soak.sh's three-tier run, which
// fits: 13 chunks on an 840 KiB device, measured peak within it.)
TEST(MemoryPlan, GeminiCountsChunkBytesNotEveryTensorRounded) {
  PlanInputs in = on_sim(inputs(Config::preset("tiny"), 4, 32));  // the soak's model
  in.gemini = true;
  in.gemini_options.policy = gemini::Policy::kAuto;
  in.gemini_options.chunk_numel = 4096;
  in.device_capacity_bytes = 840 << 10;
  const MemoryPlan plan = plan_memory(in);
  for (const auto& r : plan.rows) {
    EXPECT_NE(r.what, "Adam m, v") << "auto keeps every chunk's states on the host:\n"
                                   << plan.table();
  }
  EXPECT_NO_THROW(check_plan_fits(plan, in, AvailableMemory{})) << plan.table();
}

TEST(MemoryPlan, WideOnSimWithGeminiAuto) { check(gemini_auto(wide(), 0)); }

// --gemini static with ColossalAI's fractions of the chunks offloaded.
PlanInputs gemini_static(PlanInputs in, double param_frac, double optim_frac) {
  in.gemini = true;
  in.gemini_options.policy = gemini::Policy::kStatic;
  in.gemini_options.offload_param_frac = param_frac;
  in.gemini_options.offload_optim_frac = optim_frac;
  return in;
}

// 4 blocks of width 128 with GPT-2's vocabulary, static 0.3/0.5, activations offloaded.
PlanInputs large_vocabulary_offloaded() {
  Config c = small_ish();
  c.n_embd = 128;
  c.n_head = 8;
  c.vocab_size = 50257;
  PlanInputs in = gemini_static(on_sim(inputs(c, 4, 128)), 0.3, 0.5);
  in.offload_activations = true;
  // Under a loaded machine (a parallel ctest) gpt2_train's run once held 73 MiB more on the device
  // at its peak, 240.7 against 167.4 MiB: a copy cancelled by its unpack kept a reference to the
  // logits through its queued job, so the loss's backward could not write its gradient into
  // them (ActivationOffload.ACancelledCopyLeavesTheUnpackedTensorItsBytesAlone).
  in.offload_in_flight_bytes = 4 << 20;
  return in;
}

// With offloaded activations the host holds them all at the end of forward, and gradient buffers
// only after the loss's backward has freed its logits: a large vocabulary makes the difference
// (+14% when both were counted at once).
TEST(MemoryPlan, LargeVocabularyOnSimWithGeminiStaticAndOffloadedActivations) {
  check_offloaded(large_vocabulary_offloaded());
}

// ... but under --grad-accum the first micro-batch's gradient buffers are on the host when the
// second forward ends with every offloaded activation there too (-12.3% with the logits taken off).
TEST(MemoryPlan, LargeVocabularyOnSimWithGeminiStaticOffloadedActivationsAndAccumulation) {
  PlanInputs in = large_vocabulary_offloaded();
  in.update_in_backward = false;  // as the trainer sets it under --grad-accum
  in.micro_batches = 2;
  check_offloaded(in);
}

TEST(MemoryPlan, SmallIshOnSimWithGeminiStaticHalfOffloaded) {
  PlanInputs in = gemini_static(on_sim(inputs(small_ish(), 4, 128)), 0.5, 0.5);
  in.gemini_options.chunk_numel = 300000;
  check(in);
}

// Static with every chunk offloaded gathers each chunk for the ops that use it, and an op whose
// weight and bias straddle two chunks holds both in its backward (Note [Minimal residency]). With
// a vocabulary of 256 wte's chunk is small, and a block op's chunks beside the activations still
// saved, the op's weight gradient and the block's temporaries are the peak, not wte's chunk at the
// LM head (GPT-2 small B4 T64 on sim measured 560 MiB against 490.3 planned from the head alone;
// here -15.6% without the block ops' rows).
TEST(MemoryPlan, SmallIshOnSimWithGeminiStaticEveryChunkOffloaded) {
  Config c = small_ish();
  c.vocab_size = 256;
  PlanInputs in = gemini_static(on_sim(inputs(c, 2, 32)), 1, 1);
  in.gemini_options.chunk_numel = 600000;  // each block (789,760 elements) spans two chunks
  check(in);
}

// Static's default, nothing offloaded: the Adam states stay on the device, and so does each
// chunk's gradient buffer until its update (-22% without the plan's row for it).
TEST(MemoryPlan, SmallIshOnSimWithGeminiStaticNothingOffloaded) {
  Config c = small_ish();
  c.vocab_size = 256;
  check(gemini_static(on_sim(inputs(c, 2, 32)), 0, 0));
}

// Gemini under --grad-accum: from the second micro-batch on each gradient is added into its
// chunk's host buffer, brought over from the device in 16 MiB slices (gemini::kAddSliceNumel).
// Brought over whole, wte's gradient (147 MiB here) was a second copy on the host: GPT-2 small B4
// T64 measured 2046 MiB against 1898.8 planned; now 1915 against 1914.8 with the slice planned.
TEST(MemoryPlan, WideOnSimWithGeminiStaticAndGradientAccumulation) {
  PlanInputs in = gemini_static(on_sim(inputs(wide(), 2, 32)), 1, 1);
  in.update_in_backward = false;  // as the trainer sets it under --grad-accum
  in.micro_batches = 2;
  check(in);
}

TEST(MemoryPlan, SmallIshOnSimWithGeminiThreeTiers) {
  // 20 MiB of host RAM: the Adam states (28.8 MiB) go to disk, the chunks (14.4 MiB) stay.
  PlanInputs in = gemini_auto(small_ish(), 300000);
  in.gemini_options.host_capacity_bytes = 20 << 20;
  in.nvme_window_bytes = 1 << 20;
  const MemoryPlan plan = plan_memory(in);
  EXPECT_GT(plan.disk_bytes, 28 << 20);
  // Gradients queued behind the disk-bound updater made the host peak vary (19.6 to 26.6 MiB over
  // six runs); backward now waits once more than one is queued (Note [Three tiers]). Whether that
  // one is queued at the peak is timing (18.33 MiB here, 17.33 under ASan on a loaded machine, of
  // 19.32 planned): one chunk's gradient of over-estimate is allowed.
  check(in, true, int64_t{300000} * 4);
}

}  // namespace
}  // namespace mw::train
