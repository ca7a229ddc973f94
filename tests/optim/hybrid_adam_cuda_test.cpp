// HybridAdam on a GPU parameter whose m and v are on the host (Note [GPU parameters with host
// states], optim/hybrid_adam.cpp: Gemini's device-homed chunks under --offload-optim-frac): the
// parameter is stepped on the host and copied back, bit for bit the all-host run (the CPU and CUDA
// kernels compute the same adam_element, so a GPU run with GPU states matches too).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../cuda/cuda_test_util.h"
#include "autograd/autograd.h"
#include "optim/hybrid_adam.h"

namespace mw::optim {
namespace {

std::vector<float> run(Device param_device, Device state_device, Device grad_device) {
  const int64_t n = 100003;
  Tensor p = test::random_tensor({n}, 21).to(param_device);
  set_requires_grad(p);
  HybridAdamOptions o;
  o.update_in_backward = false;
  o.state_devices = {state_device};
  o.hyper.weight_decay = 0.01f;
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

}  // namespace
}  // namespace mw::optim
