// bf16 autocast training of the tiny GPT-2 fixture against our own fp32 and against PyTorch CPU
// autocast bf16 (tests/fixtures/gpt2_tiny/autocast_bf16.json, written by
// tools/autocast_parity.py): the loss before each of 5 AdamW steps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "data/file_io.h"
#include "data/json.h"
#include "data/safetensors.h"
#include "models/gpt2/hf_io.h"
#include "optim/optimizer.h"

namespace mw {
namespace {

const std::string kFixture = std::string(MW_SOURCE_DIR) + "/tests/fixtures/gpt2_tiny";

std::vector<double> train_losses(DType precision, const Tensor& ids) {
  auto model = std::make_unique<gpt2::GPT2>(gpt2::load_hf_config(kFixture), 0, DType::F32);
  gpt2::load_hf_weights(*model, kFixture);
  model->eval();
  optim::AdamHyper hyper;  // the fixture's: torch.optim.AdamW(lr=1e-3, weight_decay=0.1)
  hyper.lr = 1e-3f;
  hyper.weight_decay = 0.1f;
  optim::AdamW opt(model->parameters(), hyper);
  std::vector<double> losses;
  for (int step = 0; step < 5; ++step) {
    opt.zero_grad();
    Tensor loss;
    {
      AutocastGuard autocast(precision);
      loss = shifted_cross_entropy((*model)(ids), ids);
    }
    losses.push_back(loss.item());
    backward(loss);
    opt.step();
  }
  return losses;
}

std::vector<double> numbers(const json::Value& array) {
  std::vector<double> out;
  for (const auto& v : array.elements()) out.push_back(v.as_double());
  return out;
}

TEST(AutocastParity, Bf16LossesTrackFp32AndPyTorchAutocast) {
  data::SafeTensorsReader reader(kFixture + "/reference.safetensors");
  const auto& rec = reader.at("tokens");
  Tensor ids = Tensor::empty(rec.shape, rec.dtype);
  reader.read(rec, ids.raw_data());
  const auto fp32 = train_losses(DType::F32, ids), bf16 = train_losses(DType::BF16, ids);
  // tools/autocast_parity.py parses these two lines.
  for (const auto& [name, v] : {std::pair{"fp32", fp32}, std::pair{"bf16", bf16}}) {
    std::printf("memwall %s losses:", name);
    for (double x : v) std::printf(" %.7f", x);
    std::printf("\n");
  }
  const json::Value ref =
      json::parse(data::read_text_file(kFixture + "/autocast_bf16.json", "autocast reference",
                                       "run /usr/bin/python3 tools/autocast_parity.py --write"),
                  "autocast_bf16.json");
  const auto torch_fp32 = numbers(ref.at("torch_fp32")), torch_bf16 = numbers(ref.at("torch_bf16"));

  // The bound. bf16 keeps 8 significant bits: each rounding moves a value by at most u = 2^-8 of
  // itself. A logit is z = h . wte_v over C = 32 terms, with h the final layernorm's output (|h_i|
  // ~ 1) and wte ~ N(0, 0.02): sum |h_i w_i| ~ 32 * 0.8 * 0.016 ~ 0.4. Rounding h and wte gives
  // |dz| <= 2u * 0.4 ~ 3e-3, the logit's own rounding u|z| ~ 4e-4, and what the two blocks' bf16
  // products leave in the f32 residual stream ahead of ln_f is of the same order, so |dz| <~ 5e-3.
  // The loss (log-sum-exp minus the target logit, each 1-Lipschitz in the largest |dz|) moves by at
  // most 2 |dz| ~ 1e-2 in the worst case; row errors of both signs average out in the mean, which
  // is why the measured gaps are about 50 times smaller (2e-4, docs/precision.md). Later steps add
  // the effect of Adam updates computed from bf16 gradients, which differ from fp32's only where a
  // gradient is within its bf16 error of zero; Adam bounds each such update by lr = 1e-3 per step,
  // too little to show in 5 steps. So 1e-2 at every step, for us against our fp32 and against
  // torch's bf16 alike.
  const double bound = 1e-2;
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(bf16[i], fp32[i], bound) << "step " << i;
    EXPECT_NEAR(bf16[i], torch_bf16[i], bound) << "step " << i;
    // Our fp32 is the fixture's PyTorch fp32 run to f32 rounding (tests/gpt2/parity_test.cpp).
    EXPECT_NEAR(fp32[i], torch_fp32[i], 1e-4) << "step " << i;
  }
  // bf16 must differ from fp32 (autocast took effect) and train as fp32 does.
  EXPECT_NE(bf16[0], fp32[0]);
  EXPECT_LT(bf16[4], bf16[0] - 0.2);
}

}  // namespace
}  // namespace mw
