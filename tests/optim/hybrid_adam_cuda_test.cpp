// HybridAdam on a GPU parameter whose m and v are on the host (Note [GPU parameters with host
// states], optim/hybrid_adam.cpp: Gemini's device-homed chunks under --offload-optim-frac): the
// parameter is stepped on the host and copied back, bit for bit the all-host run (the CPU and CUDA
// kernels compute the same adam_element, so a GPU run with GPU states matches too).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../cuda/cuda_test_util.h"
#include "../data/temp_dir.h"
#include "autograd/autograd.h"
#include "optim/decay_ranges.h"
#include "optim/hybrid_adam.h"

namespace mw::optim {
namespace {

// `ranges`: elements the decay leaves alone (Note [Weight decay by ranges]); `adamw`: decoupled
// decay, else L2 added to the gradient.
std::vector<float> run(Device param_device, Device state_device, Device grad_device,
                       const NoDecayRanges& ranges = {}, bool adamw = true) {
  const int64_t n = 100003;
  Tensor p = test::random_tensor({n}, 21).to(param_device);
  set_requires_grad(p);
  HybridAdamOptions o;
  o.update_in_backward = false;
  o.state_devices = {state_device};
  o.hyper.weight_decay = 0.1f;
  o.hyper.adamw_mode = adamw;
  if (!ranges.empty()) o.no_decay = {ranges};
  HybridAdam adam({p}, o);
  for (uint64_t step = 0; step < 3; ++step) {
    set_grad(p, test::random_tensor({n}, 100 + step).to(grad_device));
    adam.step();
  }
  return p.to_vector<float>();
}

TEST(HybridAdamCuda, GpuParametersWithHostStatesStepAsOnTheHostBitForBit) {
  MW_SKIP_WITHOUT_GPU();
  const Device cpu = Device::cpu(), gpu = test::gpu();
  const std::vector<float> want = run(cpu, cpu, cpu);
  for (const auto& [states, grads] :
       {std::pair{cpu, cpu}, std::pair{cpu, gpu}, std::pair{gpu, gpu}}) {
    SCOPED_TRACE(states.str() + " states, " + grads.str() + " gradients");
    const std::vector<float> got = run(gpu, states, grads);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
  }
}

// HybridAdam's CUDA update runs once per decay segment (Note [Weight decay by ranges]): ranges the
// decay leaves alone, at the start, inside and at the end of the parameter, in both decay modes,
// bit for bit the host's. (Session 38: suggested by a review; never run on a GPU yet.)
TEST(HybridAdamCuda, DecaySegmentsStepAsOnTheHostBitForBit) {
  MW_SKIP_WITHOUT_GPU();
  const Device cpu = Device::cpu(), gpu = test::gpu();
  const NoDecayRanges ranges = {{0, 7}, {10, 500}, {70000, 100003}};
  for (const bool adamw : {true, false}) {
    SCOPED_TRACE(adamw ? "decoupled decay" : "L2 decay");
    const std::vector<float> want = run(cpu, cpu, cpu, ranges, adamw);
    const std::vector<float> got = run(gpu, gpu, gpu, ranges, adamw);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
    EXPECT_NE(run(cpu, cpu, cpu, {}, adamw), want) << "the ranges changed nothing";
  }
}

// A reloaded optimizer keeps each parameter's m and v where the run keeps them, not beside the
// parameter (on a GPU that stepped a host gradient with the CUDA kernel after --resume).
TEST(HybridAdamStates, LoadedStatesGoWhereTheRunKeepsThem) {
  data::testing::TempDir tmp;
  const int64_t n = 1000;
  std::vector<Device> params = {Device::sim(3)};
  if (cuda_device_count() > 0) params.push_back(test::gpu());
  for (const Device& dev : params) {
    SCOPED_TRACE(dev.str());
    Tensor p = test::random_tensor({n}, 31).to(dev);
    set_requires_grad(p);
    HybridAdamOptions o;
    o.update_in_backward = false;
    o.state_devices = {Device::cpu()};
    HybridAdam adam({p}, o);
    set_grad(p, test::random_tensor({n}, 32).to(dev));
    adam.step();
    ASSERT_TRUE(adam.exp_avg(0).device().is_cpu());
    adam.save_state(tmp.file("adam.bin"));
    HybridAdam reloaded({p}, o);
    reloaded.load_state(tmp.file("adam.bin"));
    EXPECT_TRUE(reloaded.exp_avg(0).device().is_cpu()) << reloaded.exp_avg(0).device().str();
    EXPECT_TRUE(reloaded.exp_avg_sq(0).device().is_cpu());
    set_grad(p, test::random_tensor({n}, 33));  // on the host, as Gemini's buffer for such chunks
    reloaded.step();                            // the host path: no CUDA kernel on host memory
  }
}

}  // namespace
}  // namespace mw::optim
