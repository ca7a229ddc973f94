// The memory plan (train/memory_plan.h) for a CUDA device, against the allocator peaks that
// gpt2_train --device cuda --dropout 0 measured on an H100 (session 15, docs/cuda.md): no GPU is
// needed to plan. On CUDA the attention keeps only its log-sum-exp and HybridAdam steps m and v on
// the device. The plan had put the states on the host and a [B, H, T, T] probability matrix per
// layer on the device (GPT-2 large B4 T1024: 27086 MiB planned where 21556 were used).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "train/memory_plan.h"

namespace mw::train {
namespace {

// The bar of memory_plan_test.cpp's measured cases.
constexpr double kTolerance = 0.10;

TEST(MemoryPlan, CudaMatchesThePeaksMeasuredOnAnH100) {
  struct Case {
    const char* model;
    int64_t batch, seq;
    bool recompute;
    double measured_mib;
  };
  for (const Case& c :
       {Case{"small", 8, 1024, false, 7829}, Case{"small", 8, 1024, true, 3503},
        Case{"medium", 4, 1024, false, 11242}, Case{"large", 4, 1024, false, 21556}}) {
    PlanInputs in;
    in.config = Config::preset(c.model);
    in.config.set_dropout(0.0);
    in.batch = c.batch;
    in.seq = c.seq;
    in.device = Device::cuda(0);
    in.checkpoint_every_block = c.recompute;
    const MemoryPlan plan = plan_memory(in);
    std::printf("%s", plan.table().c_str());
    const double planned_mib = static_cast<double>(plan.device_bytes) / (1 << 20);
    const double error = (planned_mib - c.measured_mib) / c.measured_mib;
    std::printf("%s B%lld T%lld%s: plan %.1f MiB, measured %.0f MiB, error %+.1f%%\n", c.model,
                static_cast<long long>(c.batch), static_cast<long long>(c.seq),
                c.recompute ? " recompute" : "", planned_mib, c.measured_mib, 100 * error);
    EXPECT_LE(std::abs(error), kTolerance) << c.model;
    EXPECT_LT(plan.host_bytes, int64_t{64} << 20) << c.model << ": the states are on the GPU";
  }
}

}  // namespace
}  // namespace mw::train
