// Helpers of the NVMe offload tests (nvme_offload_test.cpp, nvme_failure_test.cpp): small slices,
// parameters of awkward sizes, seeded gradients, a tiny GPT-2's training step.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "data/random_tokens.h"
#include "models/gpt2/model.h"
#include "optim/hybrid_adam.h"
#include "optim/optimizer.h"

namespace mw::optim::test {

// Number of elements whose bits differ; prints the first few.
inline int64_t bit_mismatches(const char* what, const Tensor& got, const Tensor& want) {
  std::vector<float> a = got.to_vector<float>(), b = want.to_vector<float>();
  EXPECT_EQ(a.size(), b.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (std::memcmp(&a[i], &b[i], 4) != 0) {
      if (bad < 5) std::printf("  %s[%zu]: got %.9g want %.9g\n", what, i, a[i], b[i]);
      ++bad;
    }
  }
  return bad;
}

// Small slices and a two-slot window, so that parameters span many slices, the pump stalls on
// in-flight writes, and (with consumption out of the expected order) the spare slot is used.
inline NvmeOffloadOptions small_nvme(double fraction, std::string dir = "") {
  NvmeOffloadOptions o;
  o.fraction = fraction;
  o.dir = std::move(dir);
  o.slice_numel = 1024;
  o.window_bytes = 2 * 8 * 1024;
  o.record_timeline = true;
  return o;
}

// Parameters of awkward sizes (a slice boundary inside, a tail slice, one shorter than a slice).
inline std::vector<Tensor> make_params(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<Tensor> ps;
  for (int64_t n : {3000, 1024, 100, 5000, 7}) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = u(rng);
    Tensor p = Tensor::from_vector(v, {n});
    set_requires_grad(p);
    ps.push_back(p);
  }
  return ps;
}

inline void set_grads(const std::vector<Tensor>& ps, int step, bool skip_one) {
  std::mt19937 rng(1000 + step);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (size_t i = 0; i < ps.size(); ++i) {
    if (skip_one && i == 2) {  // a parameter without gradient this step is not stepped
      zero_grad(ps[i]);
      continue;
    }
    std::vector<float> g(static_cast<size_t>(ps[i].numel()));
    for (auto& x : g) x = u(rng);
    set_grad(ps[i], Tensor::from_vector(g, ps[i].shape()));
  }
}

inline gpt2::Config tiny_config() {
  gpt2::Config c = gpt2::Config::preset("tiny");
  c.set_dropout(0.0);  // resumed runs must not depend on the generator's position
  return c;
}

// One training step on seeded random tokens; `after_backward` (if any) runs between backward and
// step(), where a test can look at the gradients.
inline float train_step(gpt2::GPT2& model, Optimizer& opt, int64_t step,
                        const std::function<void()>& after_backward = {}) {
  const int64_t B = 2, T = 16;
  std::vector<int32_t> tokens(static_cast<size_t>(B * T));
  data::random_tokens(3, step, B, T, model.config().vocab_size, tokens.data());
  Tensor ids = Tensor::from_vector(tokens, {B, T});
  opt.zero_grad();
  Tensor loss = shifted_cross_entropy(model(ids), ids);
  backward(loss);
  if (after_backward) after_backward();
  opt.step();
  return static_cast<float>(loss.item());
}

}  // namespace mw::optim::test
