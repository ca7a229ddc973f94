// The memory plan of a data-parallel run (train/memory_plan.h, docs/distributed.md) against
// what each rank measures: gpt2_train under `mpirun -np 2` prints its plan and, at the end, its
// host allocator's peak; for plain data parallel and ZeRO 1 and 2 the two agree within the memory
// plan's bar (10%, issue #17). A model of 26.8M parameters, so that the parts the plan counts
// (parameters, buckets, shards, Adam states, activations) dominate the peak.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "mpi_launch.h"

namespace mw {
namespace {

// The MiB figure after `label` in the output, or -1.
double mib_after(const std::string& out, const std::string& label) {
  const size_t at = out.find(label);
  if (at == std::string::npos) return -1;
  double value = -1;
  std::sscanf(out.c_str() + at + label.size(), "%lf", &value);
  return value;
}

class DataParallelPlan : public ::testing::TestWithParam<int> {};

TEST_P(DataParallelPlan, EachRanksHostPeakIsWithinTheBarOfItsPlan) {
  if (testing::is_mpi_worker()) GTEST_SKIP() << "inside a worker";
  if (auto why = testing::mpi_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const std::string app = std::string(MW_BINARY_DIR) + "/apps/gpt2_train";
  const std::string args =
      " --model small --n-layer 4 --n-embd 384 --n-head 6 --batch 4 --seq 64 --steps 2 "
      "--dropout 0 --threads 1 --zero " +
      std::to_string(GetParam());
  const auto r = testing::run_command(testing::mpirun_prefix(2, 120) + app + args + " </dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double planned = mib_after(r.output, "total: host ");
  const double measured = mib_after(r.output, "Host allocator: peak ");
  ASSERT_GT(planned, 0) << r.output;
  ASSERT_GT(measured, 0) << r.output;
  EXPECT_NE(r.output.find("2 ranks on this host"), std::string::npos) << r.output;
  const double error = (planned - measured) / measured;
  std::printf("ZeRO %d: plan %.1f MiB per rank, measured %.0f MiB, error %+.1f%%\n", GetParam(),
              planned, measured, 100 * error);
  EXPECT_LT(std::abs(error), 0.10);
}

INSTANTIATE_TEST_SUITE_P(Stages, DataParallelPlan, ::testing::Values(0, 1, 2));

// On a device the buckets stay in host memory (the collectives run on host buffers): the plan once
// counted them on the device, 58% above the sim peak at stage 0 (and as much too little on the
// host). With --grad-accum 2 the device keeps every gradient through the second micro-batch. At
// stages 1 and 2 the host's peak is the all_gathers after the update and, at stage 2, the two
// largest buckets in flight (wte's alone is 73.6 MiB here): -17% / -31% before they were planned.
// At stage 3 the device holds this rank's pieces and two gathered buckets: -18% when the plan
// counted the parameters whole.
TEST(DataParallelPlanOnSim, EachRanksDeviceAndHostPeaksAreWithinTheBarOfItsPlan) {
  if (testing::is_mpi_worker()) GTEST_SKIP() << "inside a worker";
  if (auto why = testing::mpi_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const std::string app = std::string(MW_BINARY_DIR) + "/apps/gpt2_train";
  for (const auto& [zero, accum] :
       std::vector<std::pair<int, int>>{{0, 1}, {0, 2}, {1, 1}, {2, 1}, {3, 1}}) {
    const std::string args =
        str(" --model small --n-layer 4 --n-embd 384 --n-head 6 --batch 4 --seq 64 --steps 2 "
            "--dropout 0 --threads 1 --device sim:16GiB --zero ",
            zero, " --grad-accum ", accum);
    SCOPED_TRACE(args);
    const auto r =
        testing::run_command(testing::mpirun_prefix(2, 120) + app + args + " </dev/null");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const auto& [what, planned_label, measured_label] :
         std::vector<std::tuple<const char*, const char*, const char*>>{
             {"sim", "| sim:0 ", "sim:0: peak "},
             {"host", "total: host ", "Host allocator: peak "}}) {
      const double planned = mib_after(r.output, planned_label);
      const double measured = mib_after(r.output, measured_label);
      ASSERT_GT(planned, 0) << r.output;
      ASSERT_GT(measured, 0) << r.output;
      const double error = (planned - measured) / measured;
      std::printf(
          "ZeRO %d, --grad-accum %d: %s plan %.1f MiB per rank, measured %.0f MiB, error %+.1f%%\n",
          zero, accum, what, planned, measured, 100 * error);
      EXPECT_LT(std::abs(error), 0.10) << what;
    }
  }
}

}  // namespace
}  // namespace mw
