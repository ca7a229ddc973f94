// The simulated accelerator: out-of-memory errors that say requested / free / capacity, and GPT-2
// training on sim giving losses and weights bitwise equal to the cpu.
#include <gtest/gtest.h>

#include "optim/hybrid_adam.h"
#include "optim/optimizer.h"
#include "recompute_test_util.h"

namespace mw {
namespace {

TEST(SimDevice, OverCapacityRaisesOutOfMemoryWithTheNumbers) {
  const int idx = 1;
  set_sim_capacity(idx, 64 << 10);
  Tensor a = Tensor::empty({8 * 1024}, DType::F32, Device::sim(idx));  // 32 KiB
  try {
    Tensor b = Tensor::empty({10 * 1024}, DType::F32, Device::sim(idx));  // 40 KiB: does not fit
    FAIL() << "allocated 72 KiB on a 64 KiB device";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.requested_bytes, 40 << 10);
    EXPECT_EQ(e.free_bytes, 32 << 10);
    EXPECT_EQ(e.capacity_bytes, 64 << 10);
    std::string msg = e.what();
    EXPECT_NE(msg.find("sim:1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("40960"), std::string::npos) << msg;
    EXPECT_NE(msg.find("32768"), std::string::npos) << msg;
    EXPECT_NE(msg.find("65536"), std::string::npos) << msg;
  }
  EXPECT_LE(allocator_for(Device::sim(idx)).stats().peak_bytes, 64 << 10);
  a = Tensor();
  EXPECT_NO_THROW(Tensor::empty({16 * 1024}, DType::F32, Device::sim(idx)));  // freed: fits now
  set_sim_capacity(idx, 0);
}

TEST(SimDevice, TensorToRoundTripsAndIsCountedOnTheSimAllocator) {
  const int idx = 2;
  set_sim_capacity(idx, 0);
  Tensor h = Tensor::from_vector<float>({1.5f, -2.0f, 3.25f}, {3});
  const int64_t before = allocator_for(Device::sim(idx)).stats().current_bytes;
  Tensor s = h.to(Device::sim(idx));
  EXPECT_EQ(s.device(), Device::sim(idx));
  EXPECT_EQ(allocator_for(Device::sim(idx)).stats().current_bytes - before, kHostAlignment);
  EXPECT_EQ(s.to(Device::cpu()).to_vector<float>(), h.to_vector<float>());
}

std::vector<std::vector<float>> train(Device device, bool hybrid, std::vector<float>& losses) {
  auto config = test::small_config(2);
  gpt2::GPT2 model(config, 21, DType::F32, device);
  optim::AdamHyper hyper;
  hyper.lr = 1e-2f;
  std::unique_ptr<optim::Optimizer> opt;
  if (hybrid)
    opt = std::make_unique<optim::HybridAdam>(model.parameters(), optim::HybridAdamOptions{hyper});
  else
    opt = std::make_unique<optim::AdamW>(model.parameters(), hyper);
  default_generator().manual_seed(5);
  for (int64_t step = 0; step < 3; ++step) {
    Tensor ids = test::token_batch(config, 2, 16, device, step);
    opt->zero_grad();
    Tensor loss = shifted_cross_entropy(model(ids), ids);
    backward(loss);
    opt->step();
    losses.push_back(loss.to(Device::cpu()).to_vector<float>()[0]);
  }
  std::vector<std::vector<float>> weights;
  for (auto& p : model.parameters()) weights.push_back(p.to(Device::cpu()).to_vector<float>());
  return weights;
}

TEST(SimDevice, TrainingOnSimIsBitwiseEqualToCpu) {
  set_sim_capacity(0, 0);
  for (bool hybrid : {false, true}) {
    SCOPED_TRACE(hybrid ? "HybridAdam" : "AdamW");
    std::vector<float> cpu_losses, sim_losses;
    auto w_cpu = train(Device::cpu(), hybrid, cpu_losses);
    auto w_sim = train(Device::sim(0), hybrid, sim_losses);
    test::expect_bitwise("losses", cpu_losses, sim_losses);
    ASSERT_EQ(w_cpu.size(), w_sim.size());
    for (size_t i = 0; i < w_cpu.size(); ++i)
      test::expect_bitwise("weight " + std::to_string(i), w_cpu[i], w_sim[i]);
    EXPECT_NE(cpu_losses[0], cpu_losses[2]) << "training did not move";
  }
}

}  // namespace
}  // namespace mw
