// HybridAdam: ColossalAI's optimizer. Each parameter is stepped by the kernel for where it lives:
// host-addressable parameters (cpu, sim) by CPUAdam with the best ISA found at run time by CPUID,
// CUDA parameters by the fused CUDA kernel. The result equals the reference AdamW bit for bit
// (Note [Adam math]).
#pragma once

#include "optim/adam_cpu.h"
#include "optim/optimizer.h"

namespace mw::optim {

struct HybridAdamOptions {
  AdamHyper hyper;
  float div_scale = -1.f;  // > 0: gradients are divided by it (loss scale, clipping)
};

class HybridAdam : public Optimizer {
 public:
  HybridAdam(std::vector<Tensor> params, HybridAdamOptions options = {});
  void step() override;
  std::string name() const override { return "hybridadam"; }
  int64_t state_bytes_in_memory() const override;
  Isa isa() const { return isa_; }
  const Tensor& exp_avg(size_t i) const { return exp_avg_[i]; }
  const Tensor& exp_avg_sq(size_t i) const { return exp_avg_sq_[i]; }

 protected:
  HybridAdamOptions options_;
  Isa isa_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
};

}  // namespace mw::optim
