// The trainer's weight decay takes the matrices only, as HF Trainer's and nanoGPT's param groups
// do, under every placement of the parameters and their states (Note [Weight decay by ranges]).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../data/temp_dir.h"
#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "models/gpt2/model.h"
#include "optim/optimizer.h"
#include "train/token_stream.h"
#include "trainer_fixtures.h"

namespace mw::train {
namespace {

using data::testing::TempDir;
using testing::on_gemini_auto;
using testing::tiny;
using testing::weights;
using testing::write_shard;

constexpr float kDecay = 0.5f;  // large: a decayed LayerNorm gain moves 5e-4 a step at lr 1e-3

// torch's loop with two param groups: AdamW(lr 1e-3, weight_decay kDecay) over the parameters of
// two dimensions or more, weight_decay 0 over the rest (all of them with `decay_all`).
std::vector<std::vector<float>> two_groups(const std::string& shard, int64_t steps,
                                           bool decay_all) {
  gpt2::Config c = gpt2::Config::preset("tiny");
  c.set_dropout(0);
  default_generator().manual_seed(3);
  gpt2::GPT2 model(c, 3);
  std::vector<Tensor> matrices, rest;
  for (const Tensor& p : model.parameters())
    (p.dim() >= 2 || decay_all ? matrices : rest).push_back(p);
  optim::AdamHyper decayed;
  decayed.weight_decay = kDecay;
  optim::AdamW a(matrices, decayed), b(rest, optim::AdamHyper{});
  TokenStream data({shard}, false, 0);
  std::vector<int32_t> tokens(32);
  model.train();
  for (int64_t s = 0; s < steps; ++s) {
    a.zero_grad();
    b.zero_grad();
    data.batch(s, 2, 16, tokens.data());
    Tensor ids = Tensor::from_vector(tokens, {2, 16});
    backward(shifted_cross_entropy(model(ids), ids));
    a.step();
    if (!rest.empty()) b.step();
  }
  std::vector<std::vector<float>> w;
  for (const Tensor& p : model.parameters()) w.push_back(p.contiguous().to_vector<float>());
  return w;
}

std::vector<std::vector<float>> run(TrainOptions o) {
  Trainer t(o, nullptr);
  for (int64_t s = 0; s < o.steps; ++s) t.train_step();
  t.flush();
  if (!t.gemini()) return weights(t);
  std::vector<std::vector<float>> w;  // chunks homed on disk are read back for this
  t.gemini()->with_parameters_readable([&] {
    for (const Tensor& p : t.model().parameters())
      w.push_back(p.to(Device::cpu()).to_vector<float>());
  });
  return w;
}

// The names of the parameters whose weights differ in a bit.
std::vector<std::string> differing(const std::vector<std::vector<float>>& a,
                                   const std::vector<std::vector<float>>& b) {
  gpt2::Config c = gpt2::Config::preset("tiny");
  gpt2::GPT2 model(c, 3);
  const auto named = model.named_parameters();
  std::vector<std::string> out;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), 4 * a[i].size()) != 0)
      out.push_back(named[i].first);
  return out;
}

TEST(WeightDecayOn, MatricesIsTorchsTwoParamGroupsUnderEveryPlacement) {
  TempDir tmp;
  const std::string shard = write_shard(tmp, "train.bin", 4);
  const auto want = two_groups(shard, 3, false);
  TrainOptions o = tiny(shard, 3);
  o.hyper.weight_decay = kDecay;  // decay_on: kMatrices, the trainer's default
  o.optimizer = "adamw";
  EXPECT_EQ(differing(run(o), want), std::vector<std::string>{});
  // Decaying everything is torch.optim.AdamW over model.parameters(): the LayerNorms and biases
  // differ (and through them, after the first step, everything else).
  TrainOptions all = o;
  all.decay_on = optim::DecayOn::kAll;
  const auto decay_all = run(all);
  EXPECT_EQ(differing(decay_all, two_groups(shard, 3, true)), std::vector<std::string>{});
  const std::vector<std::string> moved = differing(decay_all, want);
  EXPECT_NE(std::find(moved.begin(), moved.end(), "transformer.h.0.ln_1.weight"), moved.end())
      << ::testing::PrintToString(moved);

  // HybridAdam with the updates in backward, its states on disk, and Gemini's chunks (each holds
  // matrices, biases and gains: ranges inside the chunks) on a sim device, their states and the
  // chunks in RAM or on disk.
  o.optimizer = "hybridadam";
  o.update_in_backward = true;
  EXPECT_EQ(differing(run(o), want), std::vector<std::string>{}) << "in memory";
  TrainOptions nvme = o;
  nvme.nvme.fraction = 1.0;
  nvme.nvme.slice_numel = 1024;
  nvme.nvme.dir = tmp.file("nvme");
  EXPECT_EQ(differing(run(nvme), want), std::vector<std::string>{}) << "states on disk";
  TrainOptions auto_ = o;
  on_gemini_auto(auto_);
  auto_.gemini_options.chunk_numel = 4096;
  EXPECT_EQ(differing(run(auto_), want), std::vector<std::string>{}) << "Gemini auto";
  TrainOptions tiers = auto_;
  tiers.gemini_options.host_capacity_bytes = 180 << 10;  // most chunks and states on disk
  tiers.gemini_options.nvme_dir = tmp.file("tiers");
  tiers.gemini_nvme_window_bytes = 64 << 10;
  EXPECT_EQ(differing(run(tiers), want), std::vector<std::string>{}) << "three tiers";
}

// A checkpoint records the rule: resuming under the other one says the run is no longer the
// uninterrupted run; under the same one it says nothing.
TEST(WeightDecayOn, AResumeUnderTheOtherRuleWarns) {
  TempDir tmp;
  TrainOptions o = tiny(write_shard(tmp, "train.bin", 5), 3);
  o.hyper.weight_decay = kDecay;
  o.checkpoint_dir = tmp.file("ckpt");
  {
    Trainer t(o, nullptr);
    t.train_step(), t.train_step();
    t.save_checkpoint();
  }
  for (const optim::DecayOn on : {optim::DecayOn::kMatrices, optim::DecayOn::kAll}) {
    TrainOptions r = o;
    r.resume = o.checkpoint_dir;
    r.decay_on = on;
    std::string printed;
    Trainer t(r, [&](const std::string& line) { printed += line; });
    const bool warned =
        printed.find("with weight_decay_on = \"all\" (the checkpoint's run had \"matrices\")") !=
        std::string::npos;
    EXPECT_EQ(warned, on == optim::DecayOn::kAll) << printed;
  }
}

}  // namespace
}  // namespace mw::train
