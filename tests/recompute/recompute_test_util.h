// Shared helpers for the recomputation / offload / sim tests: one GPT-2 training step whose loss,
// parameter gradients and final RNG state can be compared bitwise between modes.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "core/allocator.h"
#include "core/random.h"
#include "data/random_tokens.h"
#include "models/gpt2/model.h"

namespace mw::test {

// A tiny GPT-2 with enough blocks for several segment counts; dropout 0.1 everywhere, so a wrong
// RNG restore in recomputation changes the gradients.
inline gpt2::Config small_config(int64_t n_layer = 4) {
  gpt2::Config c = gpt2::Config::preset("tiny");
  c.n_layer = n_layer;
  c.set_dropout(0.1);
  return c;
}

inline Tensor token_batch(const gpt2::Config& c, int64_t B, int64_t T, Device device,
                          int64_t step = 0) {
  std::vector<int32_t> tokens(static_cast<size_t>(B * T));
  data::random_tokens(7, step, B, T, c.vocab_size, tokens.data());
  return Tensor::from_vector(tokens, {B, T}, device);
}

struct StepResult {
  std::vector<float> loss;                // one value
  std::vector<std::vector<float>> grads;  // per parameter, in named_parameters order
  std::vector<std::string> names;
  RngState rng_after;
};

// forward (inside `around_forward`, which calls the given forward) + loss + backward.
inline StepResult run_step(
    gpt2::GPT2& model, const Tensor& ids,
    const std::function<void(const std::function<void()>&)>& around_forward = nullptr) {
  nn::zero_grad(model);
  default_generator().manual_seed(11);
  Tensor loss;
  auto fwd = [&] {
    Tensor logits = model(ids);
    loss = shifted_cross_entropy(logits, ids);
  };
  if (around_forward)
    around_forward(fwd);
  else
    fwd();
  backward(loss);
  StepResult r;
  r.loss = loss.to(Device::cpu()).to_vector<float>();
  for (auto& [name, p] : model.named_parameters()) {
    r.names.push_back(name);
    Tensor g = grad(p);
    r.grads.push_back(g.defined() ? g.to(Device::cpu()).to_vector<float>() : std::vector<float>());
  }
  r.rng_after = default_generator().state();
  return r;
}

// Bitwise equality of two float vectors; reports the first mismatches.
inline void expect_bitwise(const std::string& what, const std::vector<float>& a,
                           const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size()) << what;
  int shown = 0;
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      ++bad;
      if (shown++ < 3)
        ADD_FAILURE() << what << "[" << i << "]: " << a[i] << " vs " << b[i] << " (diff "
                      << (a[i] - b[i]) << ")";
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << a.size() << " elements differ";
}

inline void expect_same_step(const StepResult& a, const StepResult& b, const std::string& label) {
  SCOPED_TRACE(label);
  expect_bitwise("loss", a.loss, b.loss);
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_FALSE(a.grads[i].empty()) << a.names[i] << " has no gradient";
    expect_bitwise("grad " + a.names[i], a.grads[i], b.grads[i]);
  }
  EXPECT_EQ(a.rng_after.seed, b.rng_after.seed);
  EXPECT_EQ(a.rng_after.offset, b.rng_after.offset);
}

}  // namespace mw::test
