// Note [16-bit copies] (offload/gemini/low_copies.cpp): chunks whose weights only autocast's
// products read go to the device in bf16 or fp16, and training is bit for bit the plain autocast
// run's, with fewer bytes on the device and on the way there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "checkpoint_blocks.h"
#include "core/allocator.h"
#include "core/random.h"
#include "data/random_tokens.h"
#include "models/gpt2/model.h"
#include "models/gpt2/spec.h"
#include "nn/checkpoint.h"
#include "offload/gemini/chunk.h"
#include "offload/gemini/gemini.h"

namespace mw::gemini {
namespace {

constexpr int kSim = 5;  // a sim device of its own (capacity and peak are per index)

// A chunk of three members, the last two after f32_part: the copy holds the first in f32 and the
// others rounded to `low`; the members' views read the copy, and release gives the f32 home back.
void expect_chunk_copy(DType low) {
  const Device sim = Device::sim(kSim);
  Chunk c(0, {{0, 0, 3000}, {1, 3000, 4000}, {2, 7000, 5000}}, 12000);
  c.storage()->materialize();
  std::vector<float> home(12000);
  for (size_t i = 0; i < home.size(); ++i) home[i] = 1.0f + static_cast<float>(i) / 3.0f;
  std::memcpy(c.storage()->data(), home.data(), sizeof(float) * home.size());
  c.set_f32_part(3000);
  std::vector<Tensor> views;
  for (const ChunkMember& m : c.members())
    views.push_back(Tensor::from_storage(c.storage(), m.offset, {m.numel}, {1}, DType::F32));
  c.set_views(views);
  const int64_t before = allocator_for(sim).stats().current_bytes;
  c.gather(sim, low);
  EXPECT_EQ(c.copy_dtype(), low);
  EXPECT_EQ(c.copy_nbytes(), 3000 * 4 + 9000 * 2);
  EXPECT_EQ(allocator_for(sim).stats().current_bytes - before, 32768);  // 4096-byte granules
  EXPECT_EQ(views[0].dtype(), DType::F32);
  EXPECT_EQ(views[0].to_vector<float>(), std::vector<float>(home.begin(), home.begin() + 3000));
  for (size_t k = 1; k < 3; ++k) {
    ASSERT_EQ(views[k].dtype(), low);
    const auto* bits = static_cast<const uint16_t*>(views[k].raw_data());
    for (int64_t i = 0; i < views[k].numel(); ++i) {
      const float f = home[static_cast<size_t>(c.members()[k].offset + i)];
      const uint16_t want = low == DType::BF16 ? float_to_bf16(f) : float_to_half(f);
      if (bits[i] != want) {
        ADD_FAILURE() << "member " << k << " element " << i << ": " << bits[i] << " vs " << want;
        break;
      }
    }
  }
  c.release_copy();
  EXPECT_EQ(allocator_for(sim).stats().current_bytes, before);
  EXPECT_EQ(c.copy_dtype(), DType::F32);
  for (size_t k = 0; k < 3; ++k) {
    ASSERT_EQ(views[k].dtype(), DType::F32);
    const auto& m = c.members()[k];
    EXPECT_EQ(views[k].to_vector<float>(),
              std::vector<float>(home.begin() + m.offset, home.begin() + m.offset + m.numel));
  }
}

TEST(SixteenBitCopies, AChunkCopyRoundsItsSixteenBitPartOnlyAndReleaseRestoresTheViews) {
  expect_chunk_copy(DType::BF16);
  expect_chunk_copy(DType::F16);
}

// Note [Staged copies] (chunk.cpp): a copy filled in slices, by the thread pool or by one thread,
// is the home's f32 part as it is and the rest rounded, whatever the slices' bounds (across the
// f32 part's end too); in f32 it is the home. Large enough for the pool to split every slice.
TEST(SixteenBitCopies, ACopyFilledInSlicesIsTheCopyFilledAtOnce) {
  const Device sim = Device::sim(kSim);
  const int64_t numel = int64_t{1} << 21, f32_part = 300001;
  for (DType low : {DType::F32, DType::BF16, DType::F16}) {
    Chunk c(0, {{0, 0, f32_part}, {1, f32_part, numel - f32_part}}, numel);
    c.storage()->materialize();
    std::vector<float> home(static_cast<size_t>(numel));
    for (size_t i = 0; i < home.size(); ++i)
      home[i] = 3.0f * std::sin(0.001f * static_cast<float>(i));
    std::memcpy(c.storage()->data(), home.data(), sizeof(float) * home.size());
    c.set_f32_part(f32_part);
    std::vector<Tensor> views;
    for (const ChunkMember& m : c.members())
      views.push_back(Tensor::from_storage(c.storage(), m.offset, {m.numel}, {1}, DType::F32));
    c.set_views(views);
    c.gather(sim, low);
    const int64_t n = c.copy_nbytes();
    std::vector<char> want(static_cast<size_t>(n));
    const int64_t head = low == DType::F32 ? numel : f32_part;
    std::memcpy(want.data(), home.data(), static_cast<size_t>(4 * head));
    for (int64_t i = head; i < numel; ++i) {
      const float f = home[static_cast<size_t>(i)];
      const uint16_t bits = low == DType::BF16 ? float_to_bf16(f) : float_to_half(f);
      std::memcpy(want.data() + 4 * head + 2 * (i - head), &bits, 2);
    }
    for (int64_t slice : {int64_t{4096}, (int64_t{1} << 20) + 12, n})
      for (bool parallel : {false, true}) {
        std::vector<char> out(static_cast<size_t>(n), 0);
        for (int64_t b = 0; b < n; b += slice)
          c.fill_copy(out.data() + b, b, std::min(n, b + slice), parallel);
        EXPECT_EQ(std::memcmp(out.data(), want.data(), want.size()), 0)
            << dtype_name(low) << ", slices of " << slice << " bytes, "
            << (parallel ? "by the pool" : "on one thread");
      }
    EXPECT_EQ(std::memcmp(c.storage()->data(), want.data(), want.size()), 0) << "the gather's";
    c.release_copy();
  }
}

TEST(SixteenBitCopies, AGatherThatDoesNotFitLeavesTheChunkAsItWas) {
  const Device sim = Device::sim(kSim);
  Chunk c(0, {{0, 0, 1024}}, 1024);
  c.storage()->materialize();
  Tensor view = Tensor::from_storage(c.storage(), 0, {1024}, {1}, DType::F32);
  view.zero_();
  c.set_views({view});
  set_sim_capacity(kSim, allocator_for(sim).stats().current_bytes + 1024);
  EXPECT_THROW(c.gather(sim, DType::BF16), OutOfMemory);
  set_sim_capacity(kSim, 0);
  EXPECT_FALSE(c.gathered());
  EXPECT_EQ(view.dtype(), DType::F32);
  EXPECT_EQ(view.device(), Device::cpu());
}

gpt2::Config test_config() {
  gpt2::Config c = gpt2::Config::preset("tiny");
  c.n_layer = 3;
  c.n_embd = 64;
  c.vocab_size = 257;
  c.set_dropout(0.1);
  return c;
}

struct CopiesRun {
  std::vector<float> losses, f32_logits;
  std::vector<std::vector<float>> weights;
  GeminiStats stats;
  int64_t sim_peak = 0, illegal = 0;
};

// `steps` steps under autocast to `low`, each followed by an evaluation under autocast and an f32
// forward without gradients (as a sample is drawn: Note [Sampling during training]); Gemini (when
// `options` is given) with auto, static or const placement, 16-bit copies as `options` say.
CopiesRun train(DType low, const GeminiOptions* options, int steps = 4, bool recompute = false) {
  const gpt2::Config config = test_config();
  const Device sim = Device::sim(kSim);
  allocator_for(sim).reset_peak();
  gpt2::GPT2 model(config, 21, DType::F32, options ? Device::cpu() : sim);
  if (recompute) testing::checkpoint_every_block(model);
  optim::AdamHyper hyper;
  hyper.lr = 1e-2f;
  std::unique_ptr<optim::Optimizer> opt;
  Gemini* gem = nullptr;
  if (options) {
    GeminiOptions o = *options;
    o.adam = optim::HybridAdamOptions(hyper);
    auto g = std::make_unique<Gemini>(model, o);
    gem = g.get();
    opt = std::move(g);
  } else {
    optim::HybridAdamOptions o(hyper);
    o.update_in_backward = true;
    opt = std::make_unique<optim::HybridAdam>(model.parameters(), o);
  }
  CopiesRun r;
  default_generator().manual_seed(5);
  for (int step = 0; step < steps; ++step) {
    std::vector<int32_t> tokens(4 * 32);
    data::random_tokens(9, step, 4, 32, config.vocab_size, tokens.data());
    Tensor ids = Tensor::from_vector(tokens, {4, 32}, sim);
    model.train();
    opt->zero_grad();
    Tensor loss;
    {
      AutocastGuard autocast(low);
      loss = shifted_cross_entropy(model(ids), ids);
    }
    backward(loss);
    opt->step();
    r.losses.push_back(static_cast<float>(loss.item()));
    model.eval();
    NoGradGuard no_grad;
    std::unique_ptr<EvalScope> scope = gem ? std::make_unique<EvalScope>(*gem) : nullptr;
    {  // an evaluation under autocast leaves chunks gathered in 16 bits (auto, with room) ...
      AutocastGuard autocast(low);
      r.losses.push_back(static_cast<float>(shifted_cross_entropy(model(ids), ids).item()));
    }
    // ... which the f32 forward of the same scope must not read
    const std::vector<float> logits =
        model(ids.narrow(0, 0, 1)).to(Device::cpu()).to_vector<float>();
    r.f32_logits.insert(r.f32_logits.end(), logits.begin(), logits.begin() + 64);
  }
  auto read = [&] {
    for (auto& [name, p] : model.named_parameters()) {
      EXPECT_EQ(p.dtype(), DType::F32) << name << " between steps";
      r.weights.push_back(p.to(Device::cpu()).to_vector<float>());
    }
  };
  if (gem) {
    gem->with_parameters_readable(read);
    r.stats = gem->run_stats();
    r.illegal = gem->illegal_transitions();
  } else {
    read();
  }
  r.sim_peak = allocator_for(sim).stats().peak_bytes;
  return r;
}

void expect_bitwise(const CopiesRun& a, const CopiesRun& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  EXPECT_EQ(std::memcmp(a.losses.data(), b.losses.data(), 4 * a.losses.size()), 0) << what;
  ASSERT_EQ(a.f32_logits.size(), b.f32_logits.size());
  EXPECT_EQ(std::memcmp(a.f32_logits.data(), b.f32_logits.data(), 4 * a.f32_logits.size()), 0)
      << what << ": the f32 forwards";
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t t = 0; t < a.weights.size(); ++t)
    EXPECT_EQ(a.weights[t], b.weights[t]) << what << ": tensor " << t;
  EXPECT_EQ(b.illegal, 0) << what;
}

GeminiOptions options(Policy policy, DType low) {
  GeminiOptions o;
  o.policy = policy;
  o.device = Device::sim(kSim);
  o.chunk_numel = 20000;  // several chunks per block, most of them mixed
  o.verbose = false;
  if (policy == Policy::kStatic) o.offload_param_frac = o.offload_optim_frac = 1;
  o.const_budget_bytes = 100000;
  o.low_copies = low;
  o.low_copy_tensors = gpt2::read_only_by_products(test_config());
  return o;
}

// Bit for bit the plain autocast run under every policy, in bf16 and fp16; with 16-bit copies
// the host->device bytes and the device peak are below those of f32 copies of the same chunks.
TEST(SixteenBitCopies, TrainingIsBitwiseThePlainAutocastRunWithFewerBytes) {
  for (DType low : {DType::BF16, DType::F16})
    for (Policy policy : {Policy::kStatic, Policy::kAuto, Policy::kConst}) {
      const std::string what = std::string(dtype_name(low)) + " " + policy_name(policy);
      const CopiesRun plain = train(low, nullptr);
      GeminiOptions o16 = options(policy, low);
      o16.copy_worker = policy != Policy::kStatic;  // Note [Copy worker]: rounded on its thread
      GeminiOptions o32 = o16;
      o32.low_copies = DType::F32;
      const CopiesRun r16 = train(low, &o16), r32 = train(low, &o32);
      expect_bitwise(plain, r16, what + ", 16-bit copies");
      expect_bitwise(plain, r32, what + ", f32 copies");
      if (o16.copy_worker) {
        EXPECT_GT(r16.stats.prefetches, 0) << what;
      }
      // The blocks' matrices are 12 x 64^2 of each block's 12.6k elements: the copies of the
      // chunks holding them shrink by about a third of their bytes. Each step gathers every chunk
      // in f32 once more for the f32 forward, which the f32 copies also do.
      EXPECT_LT(r16.stats.h2d_bytes, 0.85 * r32.stats.h2d_bytes) << what;
      EXPECT_LT(r16.stats.d2h_bytes, 0.85 * r32.stats.d2h_bytes) << what;
      // Auto keeps what fits: every chunk, in fewer bytes (static and const peak at the LM head,
      // with wte's f32 chunk).
      if (policy == Policy::kAuto) {
        EXPECT_LT(r16.sim_peak, r32.sim_peak) << what;
      }
    }
}

// Recomputation runs a block's forward ops again in backward, under the forward's autocast: the
// copy worker prefetches their chunks in 16 bits, as the ops gather them. It prefetched them in
// f32 (backward runs without autocast), and each op released that copy and gathered again: 34%
// more host->device bytes than without the worker on a 6-block model, 6.6% on this one.
TEST(SixteenBitCopies, PrefetchesForRecomputedOpsAreInTheirSixteenBits) {
  const CopiesRun plain = train(DType::BF16, nullptr, 3, true);
  GeminiOptions inline_copies = options(Policy::kAuto, DType::BF16);
  GeminiOptions worker = inline_copies;
  worker.copy_worker = true;
  // Below auto's 1.3 MB when unlimited, so chunks leave between a block's forward and its
  // recomputation (at 1000 KiB the worker's f32 prefetches were 6476288 bytes against 6075392).
  set_sim_capacity(kSim, 1000 << 10);
  const CopiesRun a = train(DType::BF16, &inline_copies, 3, true);
  const CopiesRun b = train(DType::BF16, &worker, 3, true);
  set_sim_capacity(kSim, 0);
  expect_bitwise(plain, a, "recompute");
  expect_bitwise(plain, b, "recompute, copy worker");
  std::printf(
      "recompute: host->device %lld bytes, %lld gathers inline; %lld, %lld with the worker\n",
      static_cast<long long>(a.stats.h2d_bytes), static_cast<long long>(a.stats.gathers),
      static_cast<long long>(b.stats.h2d_bytes), static_cast<long long>(b.stats.gathers));
  EXPECT_GT(b.stats.prefetches, 0);
  EXPECT_LE(b.stats.h2d_bytes, a.stats.h2d_bytes) << "the worker only moves copies earlier";
  EXPECT_LE(b.stats.gathers, a.stats.gathers);
}

// Evictions free a 16-bit copy's bytes, not its f32 home's: a const budget of one f32 chunk
// (80000 bytes) holds every op's own 16-bit copies (74496 at the most), so the gathered copies stay
// within it. Crediting each eviction with the f32 bytes stopped evicting early: 108032 gathered.
TEST(SixteenBitCopies, ConstBudgetCountsEachCopyInItsOwnBytes) {
  GeminiOptions o = options(Policy::kConst, DType::BF16);
  o.const_budget_bytes = 80000;
  const CopiesRun r = train(DType::BF16, &o, 2);
  EXPECT_GT(r.stats.evictions, 0);
  EXPECT_GT(r.stats.gathered_peak_bytes, 0);
  EXPECT_LE(r.stats.gathered_peak_bytes, o.const_budget_bytes);
  expect_bitwise(train(DType::BF16, nullptr, 2), r, "const, one chunk's budget");
}

// Chunks that stay f32 (Note [16-bit copies]): homed on the device, or on disk, copy in f32; the
// layout puts the 16-bit part after the f32 members in every chunk.
TEST(SixteenBitCopies, TheSixteenBitPartFollowsTheF32MembersInEveryChunk) {
  const gpt2::Config config = test_config();
  gpt2::GPT2 model(config, 21, DType::F32, Device::cpu());
  GeminiOptions o = options(Policy::kAuto, DType::BF16);
  Gemini g(model, o);
  const std::vector<char> low = gpt2::read_only_by_products(config);
  int mixed = 0;
  for (const auto& c : g.chunks()) {
    int64_t f32 = 0;
    for (const ChunkMember& m : c->members()) {
      if (low[m.tensor]) {
        EXPECT_GE(m.offset, c->f32_part()) << "chunk " << c->index();
      } else {
        f32 += m.numel;
      }
    }
    EXPECT_EQ(c->f32_part(), f32) << "chunk " << c->index();
    mixed += f32 > 0 && f32 < c->numel();
  }
  EXPECT_GT(mixed, 0);
}

// A module called under autocast and then outside it while its chunk is still gathered (one
// evaluation, its chunk needed by both calls): the second call gets an f32 copy, not the 16-bit
// one (GPT-2's own op orders never do this; a model may).
TEST(SixteenBitCopies, AnF32UseOfAChunkGatheredIn16BitsGathersItAgainInF32) {
  const gpt2::Config config = test_config();
  const Device sim = Device::sim(kSim);
  auto c_fc_of = [](gpt2::GPT2& m) -> nn::Module& {
    for (auto& [name, module] : m.named_modules())
      if (name == "transformer.h.1.mlp.c_fc") return *module;
    throw std::runtime_error("no c_fc");
  };
  std::vector<float> x(2 * 64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.3f * static_cast<float>(i));
  const Tensor input = Tensor::from_vector(x, {2, 64}, sim);
  auto calls = [&](gpt2::GPT2& m, Gemini* g) {
    NoGradGuard no_grad;
    std::unique_ptr<EvalScope> scope = g ? std::make_unique<EvalScope>(*g) : nullptr;
    Tensor low;
    {
      AutocastGuard autocast(DType::BF16);
      low = c_fc_of(m)(input).to(DType::F32);
    }
    const Tensor f32 = c_fc_of(m)(input);
    EXPECT_EQ(f32.dtype(), DType::F32);
    return std::make_pair(low.to(Device::cpu()).to_vector<float>(),
                          f32.to(Device::cpu()).to_vector<float>());
  };
  gpt2::GPT2 plain(config, 21, DType::F32, sim);
  gpt2::GPT2 model(config, 21, DType::F32, Device::cpu());
  Gemini g(model, options(Policy::kAuto, DType::BF16));
  EXPECT_EQ(calls(plain, nullptr), calls(model, &g));
}

}  // namespace
}  // namespace mw::gemini
