// Gemini trains GPT-2 bitwise like the plain run: the same losses and weights after several steps,
// for static placement at several fractions, auto and const, with dropout on and with activation
// checkpointing; the device capacity is never exceeded; no illegal state transition happens.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "autograd/functions.h"
#include "checkpoint_blocks.h"
#include "core/allocator.h"
#include "core/cuda_stream.h"
#include "core/random.h"
#include "data/random_tokens.h"
#include "dir_entries.h"
#include "models/gpt2/model.h"
#include "nn/checkpoint.h"
#include "offload/gemini/gemini.h"
#include "offload/gemini/use_order.h"

namespace mw::gemini {
namespace {

constexpr int kSim = 3;  // a sim device of its own (capacity and peak are per index)

gpt2::Config test_config() {
  gpt2::Config c = gpt2::Config::preset("tiny");
  c.n_layer = 3;
  c.n_embd = 64;
  c.vocab_size = 257;
  c.set_dropout(0.1);  // a wrong RNG order or a wrong chunk byte changes everything
  return c;
}

struct Variant {
  bool gemini = false;
  Policy policy = Policy::kStatic;
  double param_frac = 0, optim_frac = 0;
  int64_t capacity_bytes = 0;  // 0: unlimited
  int64_t const_budget_bytes = 0;
  bool checkpoint = false;
  int64_t host_capacity_bytes = 0;  // three tiers
  std::string nvme_dir;
  bool disk_reads_through_host = false;
  bool copy_worker = false;            // Note [Copy worker]
  std::vector<std::string> use_order;  // Note [First-use order]
  std::function<void(Gemini&)> before_training;
  // Note [Memory pressure]: device bytes held from the first c_fc forward after the warmup to the
  // end of the step, which the warmup never saw (as activation offload's late copies).
  int64_t unexpected_bytes = 0;
  bool cuda = false;  // cuda:0 instead of the sim device, capped by limit_cuda_memory
};

struct TrainRun {
  std::vector<float> losses;
  std::vector<std::vector<float>> weights;
  int64_t sim_peak_bytes = 0;
  GeminiStats stats;
  int64_t illegal = 0;
  int64_t lower_bound_bytes = 0;
  int unexpected_steps = 0;  // steps that held Variant::unexpected_bytes
};

// Variant::unexpected_bytes, allocated by a pre-hook added after Gemini's: inside the op.
struct Unexpected {
  Tensor held;
  int step = 0;
  int steps_held = 0;
};

void hold_unexpected(nn::Module& model, int64_t bytes, Device device, Unexpected& u) {
  for (auto& [name, m] : model.named_modules())
    if (name == "transformer.h.0.mlp.c_fc")
      m->add_forward_pre_hook([bytes, device, &u](nn::Module&, const Tensor&) {
        if (u.step == 0 || u.held.defined()) return;
        u.held = Tensor::empty({bytes / 4}, DType::F32, device);
        ++u.steps_held;
      });
}

GeminiOptions gemini_options(const Variant& v, const optim::AdamHyper& hyper, Device sim) {
  GeminiOptions o;
  o.policy = v.policy;
  o.device = sim;
  o.offload_param_frac = v.param_frac;
  o.offload_optim_frac = v.optim_frac;
  o.const_budget_bytes = v.const_budget_bytes;
  o.chunk_numel = 20000;  // several chunks per block: 80 KB each
  o.adam = optim::HybridAdamOptions(hyper);
  o.verbose = false;
  o.host_capacity_bytes = v.host_capacity_bytes;
  o.nvme_dir = v.nvme_dir;
  o.disk_reads_through_host = v.disk_reads_through_host;
  o.copy_worker = v.copy_worker;
  o.use_order = v.use_order;
  o.adam.nvme.slice_numel = 1024;      // small slices and window: a tiny model streams too
  o.adam.nvme.window_bytes = 8 << 13;  // two 32 KiB slots
  return o;
}

TrainRun train(const Variant& v, int steps = 4) {
  const gpt2::Config config = test_config();
  const Device device = v.cuda ? Device::cuda(0) : Device::sim(kSim);
  auto set_capacity = [&](int64_t bytes) {
    if (v.cuda)
      limit_cuda_memory(0, bytes);
    else
      set_sim_capacity(kSim, bytes);
  };
  set_capacity(v.capacity_bytes);
  allocator_for(device).reset_peak();
  gpt2::GPT2 model(config, 21, DType::F32, v.gemini ? Device::cpu() : device);
  optim::AdamHyper hyper;
  hyper.lr = 1e-2f;
  hyper.weight_decay = 0.01f;
  std::unique_ptr<optim::Optimizer> opt;
  Gemini* gem = nullptr;
  if (v.gemini) {
    auto g = std::make_unique<Gemini>(model, gemini_options(v, hyper, device));
    gem = g.get();
    opt = std::move(g);
  } else {
    optim::HybridAdamOptions o(hyper);
    o.update_in_backward = true;  // gpt2_train's default
    o.states_on_host = true;
    opt = std::make_unique<optim::HybridAdam>(model.parameters(), o);
  }
  if (v.checkpoint) testing::checkpoint_every_block(model);
  if (gem && v.before_training) v.before_training(*gem);
  Unexpected unexpected;
  if (v.unexpected_bytes > 0) hold_unexpected(model, v.unexpected_bytes, device, unexpected);
  TrainRun r;
  default_generator().manual_seed(5);
  model.train();
  for (int step = 0; step < steps; ++step) {
    unexpected.step = step;
    std::vector<int32_t> tokens(4 * 32);
    data::random_tokens(9, step, 4, 32, config.vocab_size, tokens.data());
    Tensor ids = Tensor::from_vector(tokens, {4, 32}, device);
    opt->zero_grad();
    Tensor logits = model(ids);
    Tensor loss = shifted_cross_entropy(logits, ids);
    logits = Tensor();
    backward(loss);
    opt->step();
    r.losses.push_back(static_cast<float>(loss.item()));
    unexpected.held = Tensor();
  }
  r.unexpected_steps = unexpected.steps_held;
  auto read_weights = [&] {
    for (auto& [name, p] : model.named_parameters())
      r.weights.push_back(p.to(Device::cpu()).to_vector<float>());
  };
  if (gem)
    gem->with_parameters_readable(read_weights);
  else
    read_weights();
  r.sim_peak_bytes = allocator_for(device).stats().peak_bytes;
  if (gem) {
    r.stats = gem->run_stats();
    r.illegal = gem->illegal_transitions();
    r.lower_bound_bytes = gem->lower_bound_bytes();
  }
  set_capacity(0);
  return r;
}

// The documents' placement_policy='cpu': every chunk and every Adam state on the host.
Variant static_cpu() {
  Variant v;
  v.gemini = true;
  v.param_frac = v.optim_frac = 1;
  return v;
}

void expect_bitwise(const TrainRun& plain, const TrainRun& run, const char* what) {
  ASSERT_EQ(plain.losses.size(), run.losses.size());
  for (size_t s = 0; s < plain.losses.size(); ++s)
    EXPECT_EQ(std::memcmp(&plain.losses[s], &run.losses[s], 4), 0)
        << what << ": loss of step " << s << " " << plain.losses[s] << " vs " << run.losses[s];
  ASSERT_EQ(plain.weights.size(), run.weights.size());
  for (size_t t = 0; t < plain.weights.size(); ++t) {
    const auto& a = plain.weights[t];
    const auto& b = run.weights[t];
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
      if (std::memcmp(&a[i], &b[i], 4) != 0) {
        ADD_FAILURE() << what << ": tensor " << t << " element " << i << " first differs: " << a[i]
                      << " vs " << b[i];
        break;
      }
  }
  EXPECT_EQ(run.illegal, 0) << what;
}

// `v` again with three tiers: no device cap, a host budget that homes chunks on disk (window,
// reserve and two 80 KB chunks), in a private directory that must be left empty.
void expect_three_tiers_bitwise(const TrainRun& plain, Variant v, const char* what) {
  char dir[] = "/tmp/gemini-tiers-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  v.capacity_bytes = 0;
  v.nvme_dir = dir;
  v.host_capacity_bytes = (64 << 10) + 3 * 80000 + 2 * 80000;
  const TrainRun run = train(v);
  expect_bitwise(plain, run, what);
  EXPECT_GT(run.stats.nvme_read_bytes, 0) << what;
  EXPECT_TRUE(mw::testing::entries(dir).empty()) << "a swap file was left behind in " << dir;
  ::rmdir(dir);
}

TEST(GeminiTrain, StaticAtSeveralFractionsIsBitwiseThePlainRun) {
  const TrainRun plain = train({});
  for (auto [pf, of] : std::vector<std::pair<double, double>>{{0, 0}, {0, 1}, {0.5, 0.5}, {1, 1}}) {
    Variant v;
    v.gemini = true;
    v.param_frac = pf;
    v.optim_frac = of;
    const TrainRun run = train(v);
    expect_bitwise(plain, run, ("static " + std::to_string(pf) + "/" + std::to_string(of)).c_str());
    if (pf == 0) {
      EXPECT_EQ(run.stats.h2d_bytes, 0) << "nothing offloaded, nothing moves";
    }
    if (pf == 1) {
      EXPECT_GT(run.stats.h2d_bytes, 0);
    }
  }
}

TEST(GeminiTrain, StaticCpuHoldsLessOnTheDeviceThanThePlainRun) {
  const TrainRun plain = train({});
  const TrainRun cpu = train(static_cpu());
  // Parameters are 0.63 MiB of the plain peak; the cpu placement keeps only one op's chunks.
  EXPECT_LT(cpu.sim_peak_bytes, plain.sim_peak_bytes);
}

// Auto under a capacity halfway between static cpu's peak and the plain run's.
Variant auto_between(const TrainRun& plain, const TrainRun& cpu) {
  Variant v;
  v.gemini = true;
  v.policy = Policy::kAuto;
  v.capacity_bytes = round_up((cpu.sim_peak_bytes + plain.sim_peak_bytes) / 2, 4096);
  return v;
}

// Auto under a capacity between the static-cpu peak and the plain peak: it must fit (the allocator
// throws past the capacity, and the peak is checked), be bitwise the plain run, and move fewer
// bytes to the device than static cpu, which re-gathers every chunk in every pass.
TEST(GeminiTrain, AutoFitsACapacityBelowThePlainPeakAndMovesLessThanStaticCpu) {
  const TrainRun cpu = train(static_cpu());
  const Variant v = auto_between(train({}), cpu);
  const TrainRun run = train(v, 5);
  TrainRun plain5 = train({}, 5);
  expect_bitwise(plain5, run, "auto");
  EXPECT_LE(run.sim_peak_bytes, v.capacity_bytes);
  EXPECT_GT(run.lower_bound_bytes, 0);
  EXPECT_LE(run.lower_bound_bytes, v.capacity_bytes);
  EXPECT_LT(run.stats.h2d_bytes * 4, cpu.stats.h2d_bytes * 5)
      << "auto " << run.stats.h2d_bytes << " (5 steps) vs static cpu " << cpu.stats.h2d_bytes
      << " (4 steps)";
}

// Auto at exactly the capacity static cpu needs still trains: it degrades to minimal residency.
TEST(GeminiTrain, AutoNeverFailsWhereStaticCpuFits) {
  const TrainRun cpu = train(static_cpu());
  Variant v;
  v.gemini = true;
  v.policy = Policy::kAuto;
  v.capacity_bytes = round_up(cpu.sim_peak_bytes, 4096);
  const TrainRun run = train(v);
  expect_bitwise(train({}), run, "auto at the static-cpu peak");
  EXPECT_LE(run.sim_peak_bytes, v.capacity_bytes);
}

// Note [Non-model memory]: the warmup samples its periods' peaks with the allocator's window
// watermark, so the run's peak still counts the warmup step. Until session 24 it reset the run's
// peak at every period, and a one-step auto run reported the last period's peak (4 KiB for a run
// whose activations alone are far above it: `gpt2_train --gemini auto`, step 0's
// device_peak_bytes). The warmup keeps the static cpu placement's minimal residency, so its peak
// is that run's.
TEST(GeminiTrain, AutoReportsTheWarmupStepsPeak) {
  const TrainRun cpu = train(static_cpu(), 1);
  Variant v;
  v.gemini = true;
  v.policy = Policy::kAuto;
  const TrainRun warmup_only = train(v, 1);
  EXPECT_EQ(warmup_only.sim_peak_bytes, cpu.sim_peak_bytes);
}

// Note [Memory pressure]: a step whose non-model memory comes out above the warmup's (activation
// offload's copies finish at other moments from step to step) must not fail where static cpu
// placement fits: auto gives back the chunk copies no running op pins, and the bits are the plain
// run's. Without the handler this run stops with the allocator's OutOfMemory in step 1.
TEST(GeminiTrain, AutoGivesBackChunksWhenAStepNeedsMoreThanTheWarmup) {
  const TrainRun plain = train({});
  const TrainRun cpu = train(static_cpu());
  Variant v = auto_between(plain, cpu);
  v.unexpected_bytes = (v.capacity_bytes - cpu.sim_peak_bytes) / 4096 * 4096;
  Variant cpu_extra = static_cpu();
  cpu_extra.capacity_bytes = v.capacity_bytes;
  cpu_extra.unexpected_bytes = v.unexpected_bytes;
  const TrainRun cpu_run = train(cpu_extra);
  expect_bitwise(plain, cpu_run, "static cpu with the unexpected bytes (the premise)");
  EXPECT_EQ(cpu_run.unexpected_steps, 3);
  const TrainRun run = train(v);
  expect_bitwise(plain, run, "auto with the unexpected bytes");
  EXPECT_GT(run.stats.pressure_evictions, 0);
  EXPECT_LE(run.sim_peak_bytes, v.capacity_bytes);
}

// The same on a GPU: the CUDA caching allocator calls the handler, and the bits are the plain
// CUDA run's.
TEST(GeminiTrain, OnCudaAutoGivesBackChunksWhenAStepNeedsMoreThanTheWarmup) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible (or a build without CUDA)";
  Variant plain_v, cpu_v = static_cpu();
  plain_v.cuda = cpu_v.cuda = true;
  const TrainRun plain = train(plain_v);
  const TrainRun cpu = train(cpu_v);
  Variant v = auto_between(plain, cpu);
  v.cuda = true;
  v.unexpected_bytes = (v.capacity_bytes - cpu.sim_peak_bytes) / 4096 * 4096;
  const TrainRun run = train(v);
  expect_bitwise(plain, run, "auto on cuda with the unexpected bytes");
  EXPECT_GT(run.stats.pressure_evictions, 0);
  EXPECT_LE(run.sim_peak_bytes, v.capacity_bytes);
}

// Note [Copy worker]: the chunks the plan needs in the next two ops are copied by a worker thread
// while the current op computes. The same bits as the plain run, the capacity kept, and chunks
// really gathered ahead (without the worker RAM-homed chunks never are); also under const, with
// recomputation (the recompute's ops re-gather) and with some chunks on disk.
TEST(GeminiTrain, CopyWorkerPrefetchesAndIsBitwise) {
  const TrainRun plain = train({});
  const Variant v = auto_between(plain, train(static_cpu()));
  const TrainRun inline_copies = train(v);
  EXPECT_EQ(inline_copies.stats.prefetches, 0) << "RAM-homed chunks need the worker to go ahead";
  Variant worker = v;
  worker.copy_worker = true;
  const TrainRun run = train(worker);
  expect_bitwise(plain, run, "auto, copy worker");
  EXPECT_GT(run.stats.prefetches, 0);
  EXPECT_LE(run.sim_peak_bytes, v.capacity_bytes);
  Variant c = worker;
  c.policy = Policy::kConst;
  c.capacity_bytes = 0;
  c.const_budget_bytes = 4 * 20000 * 4;
  const TrainRun constant = train(c);
  expect_bitwise(plain, constant, "const, copy worker");
  EXPECT_GT(constant.stats.prefetches, 0);
  Variant checkpointed_plain;
  checkpointed_plain.checkpoint = true;
  Variant checkpointed = worker;
  checkpointed.checkpoint = true;
  checkpointed.capacity_bytes = 0;
  expect_bitwise(train(checkpointed_plain), train(checkpointed), "auto, copy worker, recompute");
  expect_three_tiers_bitwise(plain, worker, "three tiers, copy worker");
}

TEST(GeminiTrain, ConstBudgetIsBitwiseAndCapsGatheredChunks) {
  Variant v;
  v.gemini = true;
  v.policy = Policy::kConst;
  v.const_budget_bytes = 3 * 20000 * 4;  // three chunks
  const TrainRun run = train(v);
  expect_bitwise(train({}), run, "const");
  EXPECT_GT(run.stats.evictions, 0) << "a three-chunk budget forces evictions";
  EXPECT_GT(run.stats.gathered_peak_bytes, 0);
  EXPECT_LE(run.stats.gathered_peak_bytes, v.const_budget_bytes) << "no op needs four chunks";
}

TEST(GeminiTrain, CheckpointedBlocksAreBitwiseToo) {
  Variant plain_v;
  plain_v.checkpoint = true;
  const TrainRun plain = train(plain_v);
  for (Policy p : {Policy::kStatic, Policy::kAuto}) {
    Variant v;
    v.gemini = true;
    v.checkpoint = true;
    v.policy = p;
    v.param_frac = v.optim_frac = 1;
    expect_bitwise(plain, train(v), policy_name(p));
  }
}

using mw::testing::entries;

// Three tiers: a host budget that holds neither the Adam states nor every chunk sends the states
// to disk (NvmeAdamStates) and homes chunks on disk (Note [NVMe-homed chunks]). Same bits as the
// plain run, real disk traffic, and no file left behind; also with CUDA's way of reading chunks.
TEST(GeminiTrain, ThreeTiersAreBitwiseAndLeaveNoFiles) {
  char dir[] = "/tmp/gemini-tiers-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  Variant v;
  v.gemini = true;
  v.policy = Policy::kAuto;
  v.nvme_dir = dir;
  v.host_capacity_bytes = (64 << 10) /* window */ + 3 * 80000 /* reserve */ + 2 * 80000;
  const TrainRun run = train(v);
  const TrainRun plain = train({});
  expect_bitwise(plain, run, "three tiers");
  EXPECT_GT(run.stats.nvme_read_bytes, 0);
  EXPECT_GT(run.stats.nvme_write_bytes, 0);
  // Note [Disk reads through the host]: cuda's path (a host buffer, then a copy to the device),
  // run on sim: the same bits, and every chunk read from disk for an op also crosses host->device.
  v.disk_reads_through_host = true;
  const TrainRun through = train(v);
  expect_bitwise(plain, through, "three tiers, disk reads through the host");
  EXPECT_EQ(through.stats.nvme_read_bytes, run.stats.nvme_read_bytes);
  EXPECT_GT(through.stats.h2d_bytes, run.stats.h2d_bytes);
  EXPECT_TRUE(entries(dir).empty()) << "a swap file was left behind in " << dir;
  ::rmdir(dir);
}

TEST(GeminiTrain, HostBudgetTooSmallIsRefusedWithTheNeededBytes) {
  Variant v;
  v.gemini = true;
  v.param_frac = v.optim_frac = 1;  // chunks and states homed on the host (static 0/0 needs none)
  v.host_capacity_bytes = 4096;
  try {
    train(v, 1);
    FAIL() << "a 4 KiB host budget was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--host-capacity"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--nvme-window"), std::string::npos) << e.what();
    // The bytes it names are enough: the run goes with exactly that budget.
    const std::string msg = e.what();
    const size_t at = msg.find("at least ");
    ASSERT_NE(at, std::string::npos) << msg;
    v.host_capacity_bytes = std::stoll(msg.substr(at + 9));
    EXPECT_GT(v.host_capacity_bytes, 4096);
    EXPECT_NO_THROW(train(v, 1)) << "with --host-capacity " << v.host_capacity_bytes;
  }
}

// An I/O error while a chunk comes from disk in forward: a clear IoError, and the parameters are
// those of before the step (nothing was stepped yet: the failure guarantee in docs/gemini.md). The
// check: once the disk works again, the model's logits equal those of a fresh model of the same
// seed, bit for bit.
TEST(GeminiTrain, ReadErrorInForwardLeavesTheParametersAsBefore) {
  const gpt2::Config config = test_config();
  const Device sim = Device::sim(kSim);
  set_sim_capacity(kSim, 0);
  gpt2::GPT2 model(config, 21, DType::F32, Device::cpu());
  gpt2::GPT2 fresh(config, 21, DType::F32, sim);
  GeminiOptions o;
  o.device = sim;
  o.offload_param_frac = o.offload_optim_frac = 1;
  o.chunk_numel = 20000;
  o.verbose = false;
  o.host_capacity_bytes = (64 << 10) + 5 * 80000;
  o.adam.nvme.slice_numel = 1024;
  o.adam.nvme.window_bytes = 8 << 13;
  Gemini gem(model, o);
  ASSERT_NE(gem.io_engine(), nullptr) << "no chunk was homed on disk";
  gem.io_engine()->set_fault_injector([](const io::IoRequest& r, int64_t) {
    io::Fault f;
    if (r.op == io::IoOp::kRead) f.error = EIO;
    return f;
  });
  std::vector<int32_t> tokens(4 * 32);
  data::random_tokens(9, 0, 4, 32, config.vocab_size, tokens.data());
  Tensor ids = Tensor::from_vector(tokens, {4, 32}, sim);
  model.eval();
  fresh.eval();
  try {
    model(ids);
    FAIL() << "the forward read no chunk from disk";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("Input/output error"), std::string::npos) << e.what();
  }
  gem.io_engine()->set_fault_injector({});
  gem.abandon_step();  // nothing was stepped: training may go on (Note [Abandoning a step])
  EXPECT_FALSE(gem.failed());
  NoGradGuard no_grad;
  const std::vector<float> got = model(ids).to(Device::cpu()).to_vector<float>();
  const std::vector<float> want = fresh(ids).to(Device::cpu()).to_vector<float>();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
}

TEST(GeminiTrain, OutOfMemoryNamesTheBytes) {
  Variant v;
  v.gemini = true;
  v.param_frac = v.optim_frac = 1;
  v.capacity_bytes = 64 << 10;  // less than one op's activations
  try {
    train(v, 1);
    FAIL() << "trained on a 64 KiB device";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.capacity_bytes, 64 << 10);
  }
  set_sim_capacity(kSim, 0);
}

// Note [First-use order]: GPT-2 uses its parameters in parameter order, so its chunks are already
// packed in first-use order (and streaming construction, which cannot probe, loses nothing).
TEST(GeminiUseOrder, Gpt2FirstUseIsParameterOrder) {
  gpt2::GPT2 model(test_config(), 21, DType::F32, Device::cpu());
  std::vector<int32_t> tokens(2 * 8);
  data::random_tokens(9, 0, 2, 8, test_config().vocab_size, tokens.data());
  const Tensor ids = Tensor::from_vector(tokens, {2, 8});
  const std::vector<std::string> order = record_use_order(model, [&] { model(ids); });
  std::vector<std::string> names;
  for (auto& [name, p] : model.named_parameters()) names.push_back(name);
  EXPECT_EQ(order, names);
}

// A model that registers its modules in another order than it calls them: the probe records the
// call order, and Gemini packs the first-called module's tensors into the first chunk.
class CalledInReverse : public nn::Module {
 public:
  CalledInReverse() {
    auto filled = [](Shape shape, float x) {
      return Tensor::from_vector(std::vector<float>(static_cast<size_t>(shape_numel(shape)), x),
                                 shape);
    };
    head = register_module("head",
                           std::make_shared<nn::Linear>(filled({16, 4}, 0.01f), filled({4}, 0.f)));
    body = register_module("body",
                           std::make_shared<nn::Linear>(filled({8, 16}, 0.02f), filled({16}, 0.f)));
  }
  Tensor forward(const Tensor& x) override { return (*head)((*body)(x)); }
  std::string type_name() const override { return "CalledInReverse"; }
  std::shared_ptr<nn::Linear> head, body;
};

TEST(GeminiUseOrder, AModelCalledInAnotherOrderIsPackedInCallOrder) {
  CalledInReverse model;
  const Tensor x = Tensor::from_vector(std::vector<float>(2 * 8, 1.f), {2, 8});
  const std::vector<std::string> order = record_use_order(model, [&] { model(x); });
  EXPECT_EQ(order,
            (std::vector<std::string>{"body.weight", "body.bias", "head.weight", "head.bias"}));
  GeminiOptions o;
  o.device = Device::sim(kSim);
  o.chunk_numel = 8 * 16 + 16;  // body alone fills a chunk
  o.verbose = false;
  o.use_order = order;
  Gemini gem(model, o);
  ASSERT_EQ(gem.chunks().size(), 2u);
  std::vector<size_t> first;  // tensor indices, parameter order: head.weight 0 ... body.bias 3
  for (const ChunkMember& m : gem.chunks()[0]->members()) first.push_back(m.tensor);
  EXPECT_EQ(first, (std::vector<size_t>{2, 3}));
  o.use_order = {"body.weight", "nope"};
  EXPECT_THROW(Gemini(model, o), InvalidArgument);
}

// The packing order changes which tensors share a chunk, nothing else: GPT-2 packed in reverse
// (the embeddings last, each block's tensors from the last block's) trains bitwise like the plain
// run under static, auto and three tiers.
TEST(GeminiUseOrder, AnyPackingOrderIsBitwiseThePlainRun) {
  const TrainRun plain = train(Variant{});
  gpt2::GPT2 shapes(test_config(), 21, DType::F32, Device::cpu());
  std::vector<std::string> reversed;
  for (auto& [name, p] : shapes.named_parameters()) reversed.insert(reversed.begin(), name);
  Variant cpu = static_cpu();
  cpu.use_order = reversed;
  cpu.before_training = [&](Gemini& g) {  // the last parameter (ln_f.bias) opens the first chunk
    EXPECT_EQ(g.chunks()[0]->members()[0].tensor, reversed.size() - 1);
  };
  const TrainRun on_host = train(cpu);
  expect_bitwise(plain, on_host, "static cpu, reversed packing");
  Variant automatic;
  automatic.gemini = true;
  automatic.policy = Policy::kAuto;
  automatic.capacity_bytes = round_up((on_host.sim_peak_bytes + plain.sim_peak_bytes) / 2, 4096);
  automatic.use_order = reversed;
  expect_bitwise(plain, train(automatic), "auto, reversed packing");
  expect_three_tiers_bitwise(plain, automatic, "three tiers, reversed packing");
}

}  // namespace
}  // namespace mw::gemini
