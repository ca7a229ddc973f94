// The fp16 dynamic loss scaler (Note [Dynamic loss scaling], optim/loss_scaler.h), fp16 training of
// a tiny GPT-2 with it, and HybridAdam (in memory and with NVMe-offloaded states) stepping f32
// masters from bf16/f16 gradients against the reference AdamW.
#include "optim/loss_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "../recompute/recompute_test_util.h"
#include "autograd/autocast.h"
#include "core/allocator.h"
#include "core/ops.h"
#include "optim/hybrid_adam.h"

namespace mw {
namespace {

using optim::DynamicLossScaler;

TEST(LossScaler, HysteresisBackoffAndGrowthFollowTheSchedule) {
  DynamicLossScaler s;
  EXPECT_EQ(s.scale(), 65536.0);
  s.update(true);  // first overflow: hysteresis 2 -> 1, scale kept
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.state().hysteresis_left, 1);
  s.update(true);  // second: backoff
  EXPECT_EQ(s.scale(), 32768.0);
  s.update(true);  // hysteresis is not refilled by a backoff: at once again
  EXPECT_EQ(s.scale(), 16384.0);
  for (int i = 0; i < 999; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 16384.0);
  EXPECT_EQ(s.state().growth_tracker, 999);
  s.update(false);  // the 1000th good step in a row doubles and refills the hysteresis
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_EQ(s.state().growth_tracker, 0);
  EXPECT_EQ(s.state().hysteresis_left, 2);
  EXPECT_EQ(s.state().skipped_steps, 3);
  // An overflow resets the run of good steps.
  for (int i = 0; i < 500; ++i) s.update(false);
  s.update(true);
  EXPECT_EQ(s.state().growth_tracker, 0);
  EXPECT_EQ(s.scale(), 32768.0);
  // The state round-trips (for checkpoints) and bad states are refused.
  DynamicLossScaler t;
  t.load_state(s.state());
  EXPECT_EQ(t.scale(), s.scale());
  EXPECT_EQ(t.state().hysteresis_left, s.state().hysteresis_left);
  optim::LossScalerState bad = s.state();
  bad.scale = -1;
  EXPECT_THROW(t.load_state(bad), InvalidArgument);
  // A start above the 2^24 cap (--initial-loss-scale 2^30) is never lowered by a growth: it was
  // cut to 2^24 by the first one.
  optim::LossScalerState high = t.state();
  high.scale = 1073741824.0;
  high.growth_tracker = 0;
  t.load_state(high);
  for (int i = 0; i < 1000; ++i) t.update(false);
  EXPECT_EQ(t.scale(), 1073741824.0);
}

// A gradient larger than the scaler's slices (4M elements): an inf in its last slice is found,
// the unscaled values are the whole tensor's scaled bitwise, and the device holds one slice's
// temporary at a time, not a copy of the gradient (whole, GPT-2 small's wte gradient cost 147 MiB
// on the host and on the device at every fp16 step), and the host none.
TEST(LossScaler, LargeGradientsAreCheckedAndUnscaledBySlices) {
  const Device sim = Device::sim(5);
  const int64_t n = (int64_t{1} << 23) + 5;  // two full slices and five elements: 32 MiB
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>((i % 1000) - 500) * 3.0f;
  Tensor p = Tensor::zeros({n}, DType::F32, sim);
  set_requires_grad(p);
  DynamicLossScaler scaler;
  std::vector<float> bad = values;
  bad[static_cast<size_t>(n - 1)] = std::numeric_limits<float>::infinity();
  set_grad(p, Tensor::from_vector(bad, {n}).to(sim));
  EXPECT_FALSE(scaler.unscale_and_check({p})) << "an inf in the last slice";
  set_grad(p, Tensor::from_vector(values, {n}).to(sim));
  const std::vector<float> want =
      ops::affine_scalar(Tensor::from_vector(values, {n}), 1.0 / scaler.scale(), 0.0)
          .to_vector<float>();
  Allocator& a = allocator_for(sim);
  Allocator& host = allocator_for(Device::cpu());
  const int64_t before = a.stats().current_bytes, host_before = host.stats().current_bytes;
  a.reset_peak();
  host.reset_peak();
  ASSERT_TRUE(scaler.unscale_and_check({p}));
  EXPECT_LE(a.stats().peak_bytes - before, int64_t{16} << 20) << "more than one slice at once";
  // sim's memory is the host's: the check reads it in place (a slice's copy was 16 MiB here).
  EXPECT_LT(host.stats().peak_bytes - host_before, int64_t{1} << 20) << "a host copy to check";
  const std::vector<float> got = grad(p).to_vector<float>();
  ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0);
}

// One fp16 forward/backward of the tiny GPT-2 with the scaled loss.
void fp16_backward(gpt2::GPT2& model, const Tensor& ids, const DynamicLossScaler& scaler) {
  nn::zero_grad(model);
  Tensor loss;
  {
    AutocastGuard fp16(DType::F16);
    loss = shifted_cross_entropy(model(ids), ids);
  }
  backward(loss, scaler.backward_seed(loss));
}

TEST(LossScaler, AnInfGradientSkipsTheStepAndLeavesWeightsBitwiseUnchanged) {
  auto config = test::small_config(2);
  gpt2::GPT2 model(config, 5);
  Tensor ids = test::token_batch(config, 2, 16, Device::cpu());
  optim::HybridAdamOptions hopts;
  hopts.update_in_backward = false;
  optim::HybridAdam opt(model.parameters(), hopts);
  DynamicLossScaler scaler;
  auto snapshot = [&] {
    std::vector<std::vector<float>> w;
    for (const Tensor& p : model.parameters()) w.push_back(p.to_vector<float>());
    return w;
  };
  for (int overflow = 1; overflow <= 2; ++overflow) {
    const auto before = snapshot();
    fp16_backward(model, ids, scaler);
    Tensor g = grad(model.parameters()[3]);
    ASSERT_TRUE(g.defined());
    g.data<float>()[g.numel() / 2] = std::numeric_limits<float>::infinity();  // the injected inf
    EXPECT_FALSE(scaler.step(opt));
    const auto after = snapshot();
    for (size_t i = 0; i < before.size(); ++i)
      ASSERT_EQ(std::memcmp(before[i].data(), after[i].data(), before[i].size() * 4), 0)
          << "parameter " << i << " changed in a skipped step";
    EXPECT_FALSE(grad(model.parameters()[3]).defined()) << "the bad gradients are dropped";
    EXPECT_EQ(opt.step_count(), 0);
    EXPECT_EQ(scaler.scale(), overflow < 2 ? 65536.0 : 32768.0) << "after overflow " << overflow;
  }
  // A clean step goes through, unscaled: the update equals the reference on the unscaled grads.
  fp16_backward(model, ids, scaler);
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_EQ(opt.step_count(), 1);
  // A HybridAdam that updates inside backward cannot be skipped: refused with a clear error.
  optim::HybridAdamOptions in_bwd;
  in_bwd.update_in_backward = true;
  optim::HybridAdam eager2(model.parameters(), in_bwd);
  EXPECT_THROW(scaler.step(eager2), InvalidArgument);
}

TEST(LossScaler, Fp16TrainingTracksFp32) {
  auto config = test::small_config(2);
  config.set_dropout(0.0);
  Tensor ids = test::token_batch(config, 2, 16, Device::cpu());
  std::vector<double> losses[2];
  for (int fp16 = 0; fp16 < 2; ++fp16) {
    gpt2::GPT2 model(config, 5);
    optim::AdamHyper hyper;
    hyper.lr = 1e-3f;
    optim::AdamW opt(model.parameters(), hyper);
    DynamicLossScaler scaler;
    for (int step = 0; step < 5; ++step) {
      Tensor loss;
      nn::zero_grad(model);
      {
        AutocastGuard guard(fp16 ? DType::F16 : DType::F32);
        loss = shifted_cross_entropy(model(ids), ids);
      }
      losses[fp16].push_back(loss.item());
      if (fp16) {
        backward(loss, scaler.backward_seed(loss));
        EXPECT_TRUE(scaler.step(opt)) << "step " << step << " overflowed at scale 2^16";
      } else {
        backward(loss);
        opt.step();
      }
    }
  }
  // f16 keeps 11 significant bits (u = 2^-11): the loss of each step agrees with fp32 far inside
  // 1e-2 (bf16's bound in mixed_ops_test), and training lowers it the same way.
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(losses[1][i], losses[0][i], 1e-2) << "step " << i;
  EXPECT_LT(losses[1][4], losses[1][0] - 0.01);
}

// HybridAdam (the in-memory CPU kernel, and NVMe-offloaded states) updates f32 masters from bf16
// and f16 gradients exactly as the reference AdamW does from the same values widened to f32
// (widening is exact and Note [Adam math] is one formula): bitwise equal over three steps.
TEST(LowPrecisionGradients, HybridAdamMatchesAdamWBitwise) {
  for (DType low : {DType::BF16, DType::F16}) {
    for (double fraction : {0.0, 1.0}) {
      SCOPED_TRACE(str(dtype_name(low), " nvme fraction ", fraction));
      std::vector<Tensor> ref_params, params;
      for (int64_t n : {1000, 37, 4096}) {
        std::vector<float> v(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) v[i] = std::sin(0.1f * static_cast<float>(i + n));
        ref_params.push_back(Tensor::from_vector(v, {n}));
        params.push_back(Tensor::from_vector(v, {n}));
      }
      for (auto& p : ref_params) set_requires_grad(p);
      for (auto& p : params) set_requires_grad(p);
      optim::AdamHyper hyper;
      hyper.lr = 1e-2f;
      hyper.weight_decay = 0.01f;
      optim::AdamW ref(ref_params, hyper);
      optim::NvmeOffloadOptions nvme;
      nvme.fraction = fraction;
      nvme.slice_numel = 1024;
      nvme.window_bytes = 64 << 10;
      optim::HybridAdam opt(params, optim::HybridAdamOptions(hyper, -1.f, nvme));
      for (int step = 1; step <= 3; ++step) {
        for (size_t k = 0; k < params.size(); ++k) {
          const int64_t n = params[k].numel();
          std::vector<float> g(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) g[i] = std::cos(0.37f * static_cast<float>(i * step + k));
          Tensor low_grad = Tensor::from_vector(g, {n}).to(low);
          set_grad(params[k], low_grad);
          set_grad(ref_params[k], low_grad.to(DType::F32));
        }
        ref.step();
        opt.step();
      }
      opt.flush();
      for (size_t k = 0; k < params.size(); ++k)
        EXPECT_EQ(params[k].to_vector<float>(), ref_params[k].to_vector<float>()) << "param " << k;
    }
  }
}

}  // namespace
}  // namespace mw
