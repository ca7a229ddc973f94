// Gemini in the full training loop (Note [Deferred updates], Note [Evaluation forward] in
// offload/gemini/deferred.cpp): the Trainer with --grad-clip, --grad-accum, fp16 loss scaling
// (Note [Loss scaling under Gemini]) and validation under every policy, three tiers included,
// gives the plain Trainer's losses, gradient norms, evaluation losses and weights bit for bit,
// within the device capacity.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "../data/temp_dir.h"
#include "autograd/functions.h"
#include "core/allocator.h"
#include "data/token_shard.h"
#include "dir_entries.h"
#include "nn/layers.h"
#include "optim/grad_norm.h"
#include "train/trainer.h"

namespace mw::train {
namespace {

using data::testing::TempDir;
constexpr int kSim = 4;  // a sim device of its own (capacity and peak are per index)

std::string write_val_shard(const TempDir& tmp) {
  std::mt19937 gen(11);
  std::vector<uint16_t> tokens(4096);
  for (auto& t : tokens) t = static_cast<uint16_t>(gen() % 257);
  data::write_token_shard(tmp.file("val.bin"), tokens);
  return tmp.file("val.bin");
}

// Three blocks of width 64 in chunks of 20000 elements: ten chunks, so that policies have
// something to place. Dropout on: a wrong RNG order changes every loss.
TrainOptions base_options(int64_t steps) {
  TrainOptions o;
  o.model = "tiny";
  o.n_layer = 3;
  o.n_embd = 64;
  o.vocab_size = 257;
  o.batch = 4;
  o.seq = 32;
  o.threads = 2;
  o.steps = steps;
  o.seed = 21;
  o.dropout = 0.1;
  o.hyper.lr = 1e-2f;
  o.hyper.weight_decay = 0.01f;
  o.device = Device::sim(kSim);
  o.skip_memory_check = true;  // the plan is not under test; the allocator enforces the capacity
  return o;
}

enum class Mode { kPlain, kStaticCpu, kStaticHalf, kAuto, kConst, kThreeTiers };

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kPlain: return "plain";
    case Mode::kStaticCpu: return "static 1/1";
    case Mode::kStaticHalf: return "static 0.5/0.5";
    case Mode::kAuto: return "auto";
    case Mode::kConst: return "const";
    case Mode::kThreeTiers: return "three tiers";
  }
  return "?";
}

void set_mode(TrainOptions& o, Mode m, const std::string& nvme_dir) {
  if (m == Mode::kPlain) return;
  auto& g = o.gemini_options;
  o.gemini = m == Mode::kConst                                   ? "const"
             : (m == Mode::kStaticCpu || m == Mode::kStaticHalf) ? "static"
                                                                 : "auto";
  g.policy = gemini::parse_policy(o.gemini);
  g.device = o.device;
  g.chunk_numel = 20000;  // 80 KB chunks
  g.verbose = false;
  g.offload_param_frac = g.offload_optim_frac = m == Mode::kStaticHalf ? 0.5 : 1.0;
  g.const_budget_bytes = 3 * 80000;  // three chunks: evictions
  if (m == Mode::kThreeTiers) {
    g.host_capacity_bytes = (64 << 10) /* window */ + 3 * 80000 /* reserve */ + 2 * 80000;
    g.nvme_dir = nvme_dir;
    o.nvme.slice_numel = 1024;  // small slices and window: a tiny model streams too
    o.gemini_nvme_window_bytes = 8 << 13;
  }
}

struct LoopRun {
  std::vector<StepResult> steps;
  std::vector<EvalResult> evals;
  std::vector<std::vector<float>> weights;
  int64_t sim_peak_bytes = 0;
  gemini::GeminiStats stats, eval_stats;
  int64_t illegal = 0;
  int moved_chunks = 0;     // Note [Chunks moved to the device]
  int64_t lower_bound = 0;  // auto's, after the warmup
  std::vector<int64_t> chunk_bytes;
};

LoopRun train(TrainOptions o, bool eval_each_step = false) {
  set_sim_capacity(
      kSim, o.device_capacity_limit_bytes);  // the Trainer sets it too; the peak is reset here
  allocator_for(o.device).reset_peak();
  LoopRun r;
  {
    Trainer t(o, nullptr);
    while (!t.done()) {
      r.steps.push_back(t.train_step());
      if (eval_each_step || t.eval_due()) r.evals.push_back(t.evaluate());
    }
    t.flush();
    auto read = [&] {
      for (const Tensor& p : t.model().parameters())
        r.weights.push_back(p.to(Device::cpu()).to_vector<float>());
    };
    if (gemini::Gemini* g = t.gemini()) {
      g->with_parameters_readable(read);
      r.stats = g->run_stats();
      r.eval_stats = g->eval_stats();
      r.illegal = g->illegal_transitions();
      r.moved_chunks = g->chunks_moved_to_device();
      r.lower_bound = g->lower_bound_bytes();
      for (const auto& c : g->chunks()) r.chunk_bytes.push_back(c->nbytes());
    } else {
      read();
    }
  }
  r.sim_peak_bytes = allocator_for(o.device).stats().peak_bytes;
  set_sim_capacity(kSim, 0);
  return r;
}

template <typename T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

void expect_bitwise(const LoopRun& plain, const LoopRun& run, const std::string& what) {
  ASSERT_EQ(plain.steps.size(), run.steps.size()) << what;
  for (size_t s = 0; s < plain.steps.size(); ++s) {
    EXPECT_TRUE(same_bits(plain.steps[s].loss, run.steps[s].loss))
        << what << ": loss of step " << s << " " << plain.steps[s].loss << " vs "
        << run.steps[s].loss;
    EXPECT_TRUE(same_bits(plain.steps[s].grad_norm, run.steps[s].grad_norm))
        << what << ": norm of step " << s << " " << plain.steps[s].grad_norm << " vs "
        << run.steps[s].grad_norm;
    EXPECT_EQ(plain.steps[s].clipped, run.steps[s].clipped) << what << " step " << s;
  }
  ASSERT_EQ(plain.evals.size(), run.evals.size()) << what;
  for (size_t e = 0; e < plain.evals.size(); ++e)
    EXPECT_TRUE(same_bits(plain.evals[e].loss, run.evals[e].loss))
        << what << ": eval " << e << " " << plain.evals[e].loss << " vs " << run.evals[e].loss;
  ASSERT_EQ(plain.weights.size(), run.weights.size()) << what;
  for (size_t t = 0; t < plain.weights.size(); ++t) {
    const auto& a = plain.weights[t];
    const auto& b = run.weights[t];
    ASSERT_EQ(a.size(), b.size());
    if (std::memcmp(a.data(), b.data(), a.size() * 4) != 0) {
      ADD_FAILURE() << what << ": weights of tensor " << t << " differ";
      break;
    }
  }
  EXPECT_EQ(run.illegal, 0) << what;
}

using mw::testing::entries;

constexpr Mode kGeminiModes[] = {Mode::kStaticCpu, Mode::kStaticHalf, Mode::kAuto, Mode::kConst,
                                 Mode::kThreeTiers};

// --grad-clip with a norm that clips some steps: every chunk is updated only once the norm is
// known, and the norm is the plain run's to the bit (Note [Norm order]).
TEST(GeminiLoop, GradClipIsBitwiseThePlainTrainer) {
  TempDir tmp;
  TrainOptions o = base_options(4);
  o.grad_clip = 1.0;
  const LoopRun plain = train(o);
  int clipped = 0;
  for (const StepResult& s : plain.steps) clipped += s.clipped ? 1 : 0;
  ASSERT_GT(clipped, 0) << "the test must clip (norms " << plain.steps[0].grad_norm << ", ...)";
  ASSERT_LT(clipped, 4) << "and not clip every step";
  for (Mode m : kGeminiModes) {
    TrainOptions g = o;
    set_mode(g, m, tmp.file("nvme"));
    const LoopRun run = train(g);
    expect_bitwise(plain, run, std::string("clip, ") + mode_name(m));
    if (m == Mode::kThreeTiers) {
      EXPECT_TRUE(entries(tmp.file("nvme")).empty()) << "a swap file was left behind";
      // Deferring moves only disk bytes more (Note [Deferred updates]): gradients of disk-homed
      // chunks to disk and back, their parameters read once more for the update. (Placed as if it
      // kept its gradients too, which the budget counts when deferring: the same chunks on disk.)
      TrainOptions in_backward = base_options(4);
      set_mode(in_backward, m, tmp.file("nvme"));
      in_backward.gemini_options.keeps_gradients_until_step = true;
      const LoopRun ib = train(in_backward);
      EXPECT_EQ(run.stats.h2d_bytes, ib.stats.h2d_bytes);
      EXPECT_EQ(run.stats.d2h_bytes, ib.stats.d2h_bytes);
      EXPECT_GT(run.stats.nvme_write_bytes, ib.stats.nvme_write_bytes);
      EXPECT_GT(run.stats.nvme_read_bytes, ib.stats.nvme_read_bytes);
      std::printf(
          "three tiers, 4 steps: disk read %lld / written %lld bytes deferred, %lld / %lld "
          "updating in backward\n",
          static_cast<long long>(run.stats.nvme_read_bytes),
          static_cast<long long>(run.stats.nvme_write_bytes),
          static_cast<long long>(ib.stats.nvme_read_bytes),
          static_cast<long long>(ib.stats.nvme_write_bytes));
    }
  }
}

// --precision fp16 (Note [Loss scaling under Gemini], train/trainer.cpp): a loss scale so large
// that the first steps overflow and are skipped, then steps that update. The chunk buffers stay
// scaled; the overflow check, the unscaled norm and the update are the plain fp16 run's bit for
// bit, and a skipped step leaves every chunk as it was, three tiers included.
TEST(GeminiLoop, Fp16LossScalingIsBitwiseThePlainTrainer) {
  TempDir tmp;
  TrainOptions o = base_options(5);
  o.precision = DType::F16;
  o.grad_clip = 1.0;
  o.loss_scaler.initial_scale = 68719476736.0;  // 2^36: fp16 overflows, the first steps skip
  o.loss_scaler.backoff = 1.0 / 1024;
  o.loss_scaler.hysteresis = 1;
  const LoopRun plain = train(o);
  int skipped = 0;
  for (const StepResult& s : plain.steps) skipped += s.skipped ? 1 : 0;
  std::printf("fp16 plain run: %d of %zu steps skipped, scale after them %g\n", skipped,
              plain.steps.size(), plain.steps.back().loss_scale);
  ASSERT_GT(skipped, 0) << "the test must skip a step";
  ASSERT_LT(skipped, 4) << "and update in others";
  for (Mode m : kGeminiModes) {
    TrainOptions g = o;
    set_mode(g, m, tmp.file("nvme"));
    const LoopRun run = train(g);
    expect_bitwise(plain, run, std::string("fp16, ") + mode_name(m));
    for (size_t k = 0; k < plain.steps.size(); ++k) {
      EXPECT_EQ(plain.steps[k].skipped, run.steps[k].skipped) << mode_name(m) << " step " << k;
      EXPECT_EQ(plain.steps[k].loss_scale, run.steps[k].loss_scale) << mode_name(m);
    }
    if (m == Mode::kThreeTiers) {
      EXPECT_TRUE(entries(tmp.file("nvme")).empty()) << "a swap file was left behind";
    }
    // A skipped step gives its gradient buffers back to the host count: its peak is a run's
    // whose steps all update (it grew by the buffers of every skipped step). Not on three tiers,
    // where when the writes of spilled gradient buffers complete moves the peak.
    if (m == Mode::kThreeTiers) continue;
    TrainOptions updating = g;
    updating.loss_scaler.initial_scale = 1024;
    const LoopRun none_skipped = train(updating);
    EXPECT_EQ(run.stats.host_chunk_peak_bytes, none_skipped.stats.host_chunk_peak_bytes)
        << mode_name(m);
  }
}

// --grad-accum 3 (with and without clipping): chunk gradient buffers accumulate over the
// micro-batches with the plain run's additions, including buffers spilled to disk. Without
// clipping the chunks are updated in the last micro-batch's backward as they complete (Note
// [Updates in the last backward]), all but the last and those still in use.
TEST(GeminiLoop, GradAccumIsBitwiseThePlainTrainer) {
  TempDir tmp;
  for (double clip : {0.0, 1.0}) {
    TrainOptions o = base_options(3);
    o.grad_accum = 3;
    o.grad_clip = clip;
    const LoopRun plain = train(o);
    for (Mode m : kGeminiModes) {
      TrainOptions g = o;
      set_mode(g, m, tmp.file("nvme"));
      const LoopRun run = train(g);
      expect_bitwise(plain, run,
                     std::string("accum 3, clip ") + std::to_string(clip) + ", " + mode_name(m));
      EXPECT_EQ(run.stats.off_plan, 0) << "the plan covers the step's three micro-batches";
      if (clip == 0.0)
        EXPECT_GT(run.stats.updated_in_backward, 0) << mode_name(m);
      else
        EXPECT_EQ(run.stats.updated_in_backward, 0) << mode_name(m);
    }
  }
}

// Recomputation fires the forward hooks again inside backward; accumulation, clipping and
// evaluations still give the plain run's bits (the plain run recomputes too).
TEST(GeminiLoop, CheckpointedBlocksWithAccumClipAndEvaluation) {
  TempDir tmp;
  TrainOptions o = base_options(3);
  o.grad_accum = 2;
  o.grad_clip = 1.0;
  o.checkpoint_every_block = true;
  o.val_data = write_val_shard(tmp);
  o.eval_every = 1;
  o.eval_batches = 2;
  const LoopRun plain = train(o);
  for (Mode m : {Mode::kStaticCpu, Mode::kAuto, Mode::kThreeTiers}) {
    TrainOptions g = o;
    set_mode(g, m, tmp.file("nvme"));
    expect_bitwise(plain, train(g), std::string("checkpointed, ") + mode_name(m));
  }
}

// Evaluations between steps: the same validation losses, and training after them unchanged.
// Auto runs under a capacity below the plain run's peak, so the evaluation follows a plan that
// evicts, and the capacity holds.
TEST(GeminiLoop, EvaluationBetweenStepsIsBitwiseAndWithinTheCapacity) {
  TempDir tmp;
  TrainOptions o = base_options(4);
  o.val_data = write_val_shard(tmp);
  o.eval_every = 1;
  o.eval_batches = 3;
  const LoopRun plain = train(o);
  ASSERT_EQ(plain.evals.size(), 4u);
  TrainOptions cpu_opts = o;
  set_mode(cpu_opts, Mode::kStaticCpu, "");
  const LoopRun cpu = train(cpu_opts);
  expect_bitwise(plain, cpu, "eval, static 1/1");
  for (Mode m : kGeminiModes) {
    TrainOptions g = o;
    set_mode(g, m, tmp.file("nvme"));
    if (m == Mode::kAuto)
      g.device_capacity_limit_bytes =
          round_up((cpu.sim_peak_bytes + plain.sim_peak_bytes) / 2, 4096);
    const LoopRun run = train(g);
    expect_bitwise(plain, run, std::string("eval, ") + mode_name(m));
    if (g.device_capacity_limit_bytes > 0) {
      EXPECT_LE(run.sim_peak_bytes, g.device_capacity_limit_bytes);
    }
    EXPECT_GT(run.eval_stats.gathers, 0) << "the evaluation gathered no chunk";
    // Evaluations follow the warmup's forward ops, and training its plan, after every evaluation.
    EXPECT_EQ(run.stats.off_plan, 0) << mode_name(m);
  }
}

// --eval-only --init-from DIR: a saved model evaluated under three tiers (its chunks read from
// disk for the forward only) gives the plain evaluation's loss, and leaves no file.
TEST(GeminiLoop, EvalOnlyFromASavedModelUnderThreeTiers) {
  TempDir tmp;
  TrainOptions o = base_options(2);
  o.val_data = write_val_shard(tmp);
  o.eval_batches = 2;
  {
    Trainer t(o, nullptr);
    while (!t.done()) t.train_step();
    t.flush();
    t.save_model(tmp.file("model"));
  }
  TrainOptions e = base_options(0);
  e.val_data = o.val_data;
  e.eval_batches = 2;
  e.eval_only = true;
  e.init_from = tmp.file("model");
  e.n_layer = e.n_embd = e.vocab_size = 0;  // from the folder's config
  e.dropout = 0.1;
  double want = 0;
  {
    Trainer t(e, nullptr);
    want = t.evaluate().loss;
  }
  set_mode(e, Mode::kThreeTiers, tmp.file("nvme"));
  Trainer t(e, nullptr);
  ASSERT_GT(t.gemini()->nvme_chunk_bytes(), 0) << "no chunk homed on disk";
  const double got = t.evaluate().loss;
  EXPECT_TRUE(same_bits(want, got)) << want << " vs " << got;
  EXPECT_GT(t.gemini()->eval_stats().nvme_read_bytes, 0);
  EXPECT_EQ(t.gemini()->illegal_transitions(), 0);
}

// Note [Chunks moved to the device]: with gpu_margin_mem_ratio, auto homes chunks on the device
// after the warmup, with their gradients and Adam states, while the room its plan leaves lasts.
// All of them on a roomy device, then about half on a device sized for it: the losses, norms and
// weights stay the plain run's bit for bit (with dropout, and with accumulation and clipping,
// which defer the updates), the device stays within its capacity, and a moved chunk's gradient
// no longer leaves the device (each step after the warmup sends down only what was not moved).
TEST(GeminiLoop, ChunksMovedToTheDeviceAreBitwiseThePlainTrainer) {
  TempDir tmp;
  for (int accum : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "grad accum " << accum);
    TrainOptions o = base_options(4);
    o.grad_accum = accum;
    o.grad_clip = accum > 1 ? 1.0 : 0.0;
    const LoopRun plain = train(o);
    TrainOptions a = o;
    set_mode(a, Mode::kAuto, tmp.file("nvme"));
    a.device_capacity_limit_bytes = 64 << 20;
    const LoopRun none = train(a);
    EXPECT_EQ(none.moved_chunks, 0);
    a.gemini_options.gpu_margin_mem_ratio = 1.0;
    const LoopRun all = train(a);
    expect_bitwise(plain, all, "all chunks moved");
    const int chunks = 10;  // base_options: ten chunks of up to 80000 bytes
    EXPECT_EQ(all.moved_chunks, chunks);
    // Gradients go down in the warmup only: a quarter of the four steps' bytes.
    EXPECT_EQ(4 * all.stats.d2h_bytes, none.stats.d2h_bytes);
    // Room for the first five chunks and half the sixth at 4x their bytes (parameters, m, v,
    // gradient) beyond the lower bound, after auto's 2% margin: the first five move.
    ASSERT_EQ(none.chunk_bytes.size(), static_cast<size_t>(chunks));
    double five = 0;
    for (int c = 0; c < 5; ++c) five += 4.0 * static_cast<double>(none.chunk_bytes[c]);
    const double room = five + 2.0 * static_cast<double>(none.chunk_bytes[5]);
    a.device_capacity_limit_bytes = static_cast<int64_t>((none.lower_bound + room) / 0.98);
    const LoopRun half = train(a);
    expect_bitwise(plain, half, "five chunks moved");
    EXPECT_EQ(half.moved_chunks, 5);
    EXPECT_LE(half.sim_peak_bytes, a.device_capacity_limit_bytes);
    EXPECT_LT(half.stats.d2h_bytes, none.stats.d2h_bytes);
    EXPECT_GT(half.stats.d2h_bytes, all.stats.d2h_bytes);
  }
}

// Note [Deferred updates] with a layer that some micro-batches of a step do not call: `extra`
// shares the one chunk with `body`, called after it (its gradients arrive first in backward) or
// before it (they arrive last).
class SometimesExtra : public nn::Module {
 public:
  SometimesExtra(Device device, bool extra_first) : extra_first_(extra_first) {
    auto random = [&](Shape shape, uint32_t seed) {
      std::mt19937 gen(seed);
      std::normal_distribution<float> normal(0.f, 0.5f);
      std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
      for (float& x : v) x = normal(gen);
      return Tensor::from_vector(v, shape).to(device);
    };
    body = register_module("body", std::make_shared<nn::Linear>(random({8, 8}, 1), random({8}, 2)));
    extra =
        register_module("extra", std::make_shared<nn::Linear>(random({8, 8}, 3), random({8}, 4)));
  }
  Tensor forward(const Tensor& x) override {
    if (!use_extra) return (*body)(x);
    return extra_first_ ? (*body)((*extra)(x)) : (*extra)((*body)(x));
  }
  std::string type_name() const override { return "SometimesExtra"; }
  std::shared_ptr<nn::Linear> body, extra;
  bool use_extra = true;

 private:
  bool extra_first_;
};

struct AccumRun {
  std::vector<double> norms;  // per step, before its update
  std::vector<std::vector<float>> weights;
};

// Steps of uses.size() micro-batches each; uses[k][s]: micro-batch k of step s calls `extra`.
// offload < 0: the plain HybridAdam run; else Gemini (static, that offload fraction), deferred.
AccumRun accumulate(const std::vector<std::vector<bool>>& uses, bool extra_first, double offload) {
  const Device sim = Device::sim(kSim);
  SometimesExtra model(offload < 0 ? sim : Device::cpu(), extra_first);
  optim::AdamHyper hyper;
  hyper.lr = 1e-2f;
  hyper.weight_decay = 0.01f;
  std::unique_ptr<optim::HybridAdam> plain;
  std::unique_ptr<gemini::Gemini> gem;
  if (offload < 0) {
    plain =
        std::make_unique<optim::HybridAdam>(model.parameters(), optim::HybridAdamOptions(hyper));
  } else {
    gemini::GeminiOptions o;
    o.device = sim;
    o.offload_param_frac = o.offload_optim_frac = offload;
    o.chunk_numel = 1024;  // one chunk: body.weight, body.bias, extra.weight, extra.bias
    o.adam = optim::HybridAdamOptions(hyper);
    o.verbose = false;
    gem = std::make_unique<gemini::Gemini>(model, o);
    EXPECT_EQ(gem->chunks().size(), 1u);
    gem->set_deferred_updates(true);
  }
  AccumRun r;
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (size_t s = 0; s < uses[0].size(); ++s) {
    for (size_t k = 0; k < uses.size(); ++k) {
      std::vector<float> x(4 * 8);
      for (float& v : x) v = normal(gen);
      model.use_extra = uses[k][s];
      Tensor y = model(Tensor::from_vector(x, {4, 8}).to(sim));
      if (gem) gem->set_final_backward(k + 1 == uses.size());
      backward(mean(mul(y, y)));
    }
    r.norms.push_back(gem ? gem->grad_norm() : optim::global_grad_norm(model.parameters()));
    if (gem) {
      gem->step();
    } else {
      plain->step();
      plain->zero_grad();
    }
  }
  auto read = [&] {
    for (const Tensor& p : model.parameters())
      r.weights.push_back(p.to(Device::cpu()).to_vector<float>());
  };
  if (gem)
    gem->with_parameters_readable(read);
  else
    read();
  return r;
}

// A chunk member without a gradient in some micro-batches (before, between or after the others'):
// its buffer holds the plain run's .grad sums, so the norm and the update are the plain run's,
// whichever order the gradients arrive in, with the buffer on the device or in RAM.
TEST(GeminiLoop, AChunkMemberMissingFromSomeMicroBatchesAccumulatesAsThePlainRun) {
  const std::vector<std::vector<bool>> uses = {{false, true, true}, {true, false, true}};
  const std::vector<std::vector<bool>> three = {{false, true}, {true, false}, {false, true}};
  for (const auto& u : {uses, three})
    for (bool extra_first : {false, true}) {
      const AccumRun plain = accumulate(u, extra_first, -1);
      for (double offload : {0.0, 1.0}) {
        SCOPED_TRACE(::testing::Message() << u.size() << " micro-batches, extra first "
                                          << extra_first << ", offload " << offload);
        const AccumRun run = accumulate(u, extra_first, offload);
        ASSERT_EQ(plain.norms.size(), run.norms.size());
        for (size_t s = 0; s < plain.norms.size(); ++s)
          EXPECT_TRUE(same_bits(plain.norms[s], run.norms[s]))
              << "norm of step " << s << ": " << plain.norms[s] << " vs " << run.norms[s];
        ASSERT_EQ(plain.weights.size(), run.weights.size());
        for (size_t t = 0; t < plain.weights.size(); ++t)
          for (size_t i = 0; i < plain.weights[t].size(); ++i)
            if (!same_bits(plain.weights[t][i], run.weights[t][i])) {
              ADD_FAILURE() << "tensor " << t << " element " << i
                            << " first differs: " << plain.weights[t][i] << " vs "
                            << run.weights[t][i];
              break;
            }
      }
    }
}

// A member without a gradient in every micro-batch of a step, beside members with one: a plain
// run leaves it as it is, Gemini would step the whole chunk, so the step is refused by its name
// before anything is stepped, and the step can be dropped.
TEST(GeminiLoop, AChunkMemberWithoutAnyGradientInAStepIsRefusedByName) {
  for (bool clip : {true, false}) {
    SometimesExtra model(Device::cpu(), false);
    gemini::GeminiOptions o;
    o.device = Device::sim(kSim);
    o.chunk_numel = 1024;
    o.verbose = false;
    gemini::Gemini gem(model, o);
    gem.set_deferred_updates(true);
    model.use_extra = false;
    for (int k = 0; k < 2; ++k) {
      gem.set_final_backward(k == 1);
      Tensor y = model(Tensor::from_vector(std::vector<float>(32, 0.5f), {4, 8}).to(o.device));
      backward(mean(mul(y, y)));
    }
    try {
      if (clip) gem.grad_norm();
      gem.step();
      ADD_FAILURE() << "a step with extra.weight's gradient missing was not refused";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("'extra.weight'"), std::string::npos) << e.what();
    }
    gem.skip_step();
    EXPECT_FALSE(gem.failed());
  }
}

}  // namespace
}  // namespace mw::train
