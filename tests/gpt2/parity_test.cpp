// GPT-2 against the PyTorch reference state written by tools/make_gpt2_reference.py (a plain-torch
// copy of HF GPT2LMHeadModel): logits, loss, every parameter gradient, in f32 and f64, and the
// losses and final weights of 10 AdamW steps.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "autograd/functions.h"
#include "data/safetensors.h"
#include "models/gpt2/hf_io.h"
#include "optim/hybrid_adam.h"
#include "optim/optimizer.h"

namespace mw {
namespace {

const std::string kFixture = std::string(MW_SOURCE_DIR) + "/tests/fixtures/gpt2_tiny";

struct Reference {
  data::SafeTensorsReader reader{kFixture + "/reference.safetensors"};
  Tensor get(const std::string& name) const {
    const auto& rec = reader.at(name);
    Tensor t = Tensor::empty(rec.shape, rec.dtype);
    reader.read(rec, t.raw_data());
    return t;
  }
};

// Largest |a - b| / (atol + rtol * |b|); <= 1 passes. Prints the first offenders.
double compare(const std::string& what, const Tensor& actual, const Tensor& expected, double atol,
               double rtol) {
  auto a = actual.to_vector<double>(), e = expected.to_vector<double>();
  EXPECT_EQ(a.size(), e.size()) << what;
  double worst = 0;
  int shown = 0;
  for (size_t i = 0; i < std::min(a.size(), e.size()); ++i) {
    double r = std::abs(a[i] - e[i]) / (atol + rtol * std::abs(e[i]));
    if (std::isnan(r)) r = INFINITY;  // a NaN fails (it compares false with any bar)
    if (r > 1 && shown++ < 3)
      ADD_FAILURE() << what << "[" << i << "]: got " << a[i] << ", expected " << e[i];
    worst = std::max(worst, r);
  }
  return worst;
}

std::unique_ptr<gpt2::GPT2> load_model(DType dtype) {
  auto config = gpt2::load_hf_config(kFixture);
  auto model = std::make_unique<gpt2::GPT2>(config, 0, dtype);
  gpt2::load_hf_weights(*model, kFixture);
  return model;
}

TEST(Gpt2Parity, ParameterNamesAndOrderAreHuggingFaces) {
  auto model = load_model(DType::F32);
  auto named = model->named_parameters();
  const auto& specs = model->specs();
  ASSERT_EQ(named.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(named[i].first, specs[i].name);
    EXPECT_EQ(named[i].second.shape(), specs[i].shape);
  }
  EXPECT_EQ(gpt2::num_parameters(gpt2::Config::preset("small")), 124439808);
}

// f32 tolerances: our GEMMs (OpenBLAS, tiled) and PyTorch's sum in different orders. With K <= 128
// terms of size ~1 and f32 epsilon 6e-8, each logit can differ by ~1e-6; errors compound through
// two blocks, so 2e-5 absolute + 1e-4 relative bounds honest differences, while any wrong formula
// moves values by >1e-2.
TEST(Gpt2Parity, Float32LogitsLossAndGradientsMatchPyTorch) {
  Reference ref;
  auto model = load_model(DType::F32);
  model->eval();
  Tensor ids = ref.get("tokens");
  Tensor logits = (*model)(ids);
  EXPECT_LE(compare("logits", logits, ref.get("logits"), 2e-5, 1e-4), 1.0);
  Tensor loss = shifted_cross_entropy(logits, ids);
  EXPECT_LE(compare("loss", loss.reshape({1}), ref.get("loss").reshape({1}), 1e-6, 1e-6), 1.0);
  backward(loss);
  for (const auto& spec : model->specs()) {
    SCOPED_TRACE(spec.name);
    // Gradients are ~1e-2..1e-4 in size; 1e-6 absolute is ~100 f32 ulps of the largest.
    EXPECT_LE(compare(spec.name, grad(model->parameter(spec.name)), ref.get("grad." + spec.name),
                      1e-6, 1e-4),
              1.0);
  }
}

// f64: both sides compute in double from the same weights. Rounding differences are ~1e-16
// relative per operation; 1e-10 leaves a factor 1e6 for accumulation and still catches any error
// that float32 tolerances could hide.
TEST(Gpt2Parity, Float64MatchesPyTorchToTenDigits) {
  Reference ref;
  auto model = load_model(DType::F64);
  model->eval();
  Tensor ids = ref.get("tokens");
  Tensor logits = (*model)(ids);
  EXPECT_LE(compare("f64 logits", logits, ref.get("f64.logits"), 1e-12, 1e-10), 1.0);
  Tensor loss = shifted_cross_entropy(logits, ids);
  EXPECT_LE(compare("f64 loss", loss.reshape({1}), ref.get("f64.loss").reshape({1}), 1e-12, 1e-10),
            1.0);
  backward(loss);
  for (const auto& spec : model->specs())
    EXPECT_LE(compare(spec.name, grad(model->parameter(spec.name)),
                      ref.get("f64.grad." + spec.name), 1e-14, 1e-9),
              1.0);
}

template <typename Opt>
void check_adamw_steps() {
  Reference ref;
  auto model = load_model(DType::F32);
  model->eval();
  Tensor ids = ref.get("tokens");
  optim::AdamHyper hyper;
  hyper.lr = 1e-3f;
  hyper.weight_decay = 0.1f;
  std::unique_ptr<optim::Optimizer> opt;
  if constexpr (std::is_same_v<Opt, optim::AdamW>)
    opt = std::make_unique<Opt>(model->parameters(), hyper);
  else
    opt = std::make_unique<Opt>(model->parameters(), optim::HybridAdamOptions{hyper});
  std::vector<double> losses;
  for (int step = 0; step < 10; ++step) {
    opt->zero_grad();
    Tensor loss = shifted_cross_entropy((*model)(ids), ids);
    losses.push_back(loss.item());
    backward(loss);
    opt->step();
  }
  // Losses drift from PyTorch's only by the f32 rounding of the forward (above) amplified over ten
  // updates of lr 1e-3: 1e-5 relative.
  EXPECT_LE(compare("adamw losses", Tensor::from_vector(losses, {10}), ref.get("adamw_losses"),
                    1e-6, 1e-5),
            1.0);
  // Adam normalises each update to ~lr per step, so f32 gradient noise can move a weight by at most
  // a few lr-sized steps' worth of relative error in m/v: 2e-5 absolute on weights of size
  // ~0.02..1.
  for (const auto& spec : model->specs())
    EXPECT_LE(compare(spec.name, model->parameter(spec.name), ref.get("adamw_final." + spec.name),
                      2e-5, 1e-4),
              1.0);
}

TEST(Gpt2Parity, TenAdamWStepsMatchTorchOptimAdamW) { check_adamw_steps<optim::AdamW>(); }
TEST(Gpt2Parity, TenHybridAdamStepsMatchTorchOptimAdamW) { check_adamw_steps<optim::HybridAdam>(); }

}  // namespace
}  // namespace mw
