// The memory plan of a data-parallel run (train/memory_plan.h, docs/distributed.md) against
// what each rank measures: gpt2_train under `mpirun -np 2` prints its plan and, at the end, its
// host allocator's and sim device's peaks; for plain data parallel, ZeRO 1-3 and Gemini's policies
// the two agree within the memory plan's bar (10%, issue #17). Models of 26.8M and 7.9M
// parameters, so that the parts the plan counts (parameters, buckets, shards, chunks, Adam states,
// activations) dominate the peak.
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

// Runs gpt2_train under `mpirun -np 2` and checks rank 0's sim and host peaks against its plan:
// within the bar (10%) below, and `over` above.
void expect_plan_holds_at_two_ranks(const std::string& args, double over = 0.10,
                                    const std::string& env = "") {
  SCOPED_TRACE(env + args);
  const std::string app = std::string(MW_BINARY_DIR) + "/apps/gpt2_train";
  const auto r =
      testing::run_command(env + " " + testing::mpirun_prefix(2, 120) + app + args + " </dev/null");
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
    std::printf("%s: %s plan %.1f MiB per rank, measured %.0f MiB, error %+.1f%%\n", args.c_str(),
                what, planned, measured, 100 * error);
    EXPECT_GT(error, -0.10) << what;
    EXPECT_LT(error, over) << what;
  }
}

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
  for (const auto& [zero, accum] :
       std::vector<std::pair<int, int>>{{0, 1}, {0, 2}, {1, 1}, {2, 1}, {3, 1}})
    expect_plan_holds_at_two_ranks(
        str(" --model small --n-layer 4 --n-embd 384 --n-head 6 --batch 4 --seq 64 --steps 2 "
            "--dropout 0 --threads 1 --device sim:16GiB --zero ",
            zero, " --grad-accum ", accum));
}

// Plain ZeRO 3 under bf16 gathers the blocks' matrices in 2 bytes (Note [16-bit parameter
// gathers]): the two gathered buckets beside this rank's pieces are planned at their 16-bit size,
// 267.2 MiB against 267 measured on the device; counted in f32 the plan was 279.5 (+4.7%, the
// 3% bar here catches it), which is what --chunk-copy-dtype fp32 plans and measures (280).
TEST(DataParallelPlanOnSim, ZeroThreeUnderBf16PlansItsSixteenBitGathers) {
  if (testing::is_mpi_worker()) GTEST_SKIP() << "inside a worker";
  if (auto why = testing::mpi_unavailable(); !why.empty()) GTEST_SKIP() << why;
  for (const char* gathers : {"", " --chunk-copy-dtype fp32"})
    expect_plan_holds_at_two_ranks(
        str(" --model small --n-layer 4 --n-embd 384 --n-head 6 --batch 4 --seq 64 --steps 2 "
            "--dropout 0 --threads 1 --device sim:16GiB --zero 3 --precision bf16",
            gathers),
        0.03);
}

// Under NCCL's memory rule (Note [Device memory on the CPU]: every collective's tensors on the
// device, sim standing in for the GPU) the buckets, the gradient shard and the all_gather buffers
// are device memory (Note [Buckets on CUDA]): 315.4 / 366.6 / 329.3 MiB planned against 315 / 366
// / 329 at stages 0 / 1 / 2. Before: the all_gathers after the update counted beside the
// activations (stage 1 +14%), and the three largest buckets in flight beside the activations'
// peak, where none is yet (stage 2 +11%); the embedding's bucket, reduced whole at the end of
// backward beside the gradient it was copied from, is what stage 2 holds. Stage 3 is an upper
// bound, +9%: 340.1 planned against 312 (+33% before).
TEST(DataParallelPlanOnSim, UnderNcclsMemoryRuleTheBucketsAreDeviceMemory) {
  if (testing::is_mpi_worker()) GTEST_SKIP() << "inside a worker";
  if (auto why = testing::mpi_unavailable(); !why.empty()) GTEST_SKIP() << why;
  for (const auto& [zero, accum, over] : std::vector<std::tuple<int, int, double>>{
           {0, 1, 0.10}, {0, 2, 0.10}, {1, 1, 0.10}, {2, 1, 0.10}, {3, 1, 0.15}})
    expect_plan_holds_at_two_ranks(
        str(" --model small --n-layer 4 --n-embd 384 --n-head 6 --batch 4 --seq 64 --steps 2 "
            "--dropout 0 --threads 1 --device sim:16GiB --zero ",
            zero, " --grad-accum ", accum),
        over, "MW_DIST_DEVICE_MEMORY=sim");
}

// The Gemini plans' model: chunks of 2.5M elements of a model with a small vocabulary (so that
// blocks' chunks, not wte's, are the largest, as in GPT-2 small).
const std::string kGeminiModel =
    " --model small --n-layer 4 --n-embd 384 --n-head 6 --vocab-size 1000 --chunk-size 2500000 "
    "--batch 4 --seq 64 --steps 2 --dropout 0 --threads 1 --device sim:1GiB ";

// Gemini under NCCL's memory rule: a chunk off the device is reduced and gathered through device
// copies (Note [Staged collectives]), planned for static (sim peaks 34 / 34 / 46 MiB against 25.2 /
// 24.5 / 31.8 planned at stages 0 / 2 / 3 before, 34.3 / 34.3 / 45.4 now); auto places its chunks
// around them (its warmup samples them). 15% above: stage 3's peak moves with the timing of its
// gathers, 42-46 MiB in three runs.
TEST(DataParallelPlanOnSim, GeminiUnderNcclsMemoryRuleCountsTheStagedCopies) {
  if (testing::is_mpi_worker()) GTEST_SKIP() << "inside a worker";
  if (auto why = testing::mpi_unavailable(); !why.empty()) GTEST_SKIP() << why;
  for (const char* gemini :
       {"--gemini static --offload-param-frac 1 --offload-optim-frac 1 --zero 0",
        "--gemini static --offload-param-frac 1 --offload-optim-frac 1 --zero 2",
        "--gemini static --offload-param-frac 1 --offload-optim-frac 1 --zero 3",
        "--gemini auto --zero 2"})
    expect_plan_holds_at_two_ranks(kGeminiModel + gemini, 0.15, "MW_DIST_DEVICE_MEMORY=sim");
}

// Gemini under data parallel, each rank's plan against its peaks, on kGeminiModel. Host: the
// updated pieces' all_gathers after the update, two chunks at a time (stage 2; -15% when the plan
// had the backward's one buffer), two gradient buffers while one is reduced (stage 3, -15%), and
// the gradient buffers of chunks whose states stay on the device (static, -50%). Sim: a sharded
// chunk prefetched beside wte's at the LM head (-24%), and an op whose weight and bias straddle two
// chunks holding both (static, -17%), the figures before each was planned.
TEST(DataParallelPlanOnSim, GeminiRanksPeaksAreWithinTheBarOfTheirPlan) {
  if (testing::is_mpi_worker()) GTEST_SKIP() << "inside a worker";
  if (auto why = testing::mpi_unavailable(); !why.empty()) GTEST_SKIP() << why;
  for (const char* gemini :
       {"--gemini auto --zero 2", "--gemini auto --zero 3",
        "--gemini static --offload-param-frac 1 --offload-optim-frac 1 --zero 3"})
    expect_plan_holds_at_two_ranks(kGeminiModel + gemini);
  // Chunks of 20000 elements, smaller than a block's MLP weights (1M elements, each alone in its
  // chunk): the op after it (forward) or before it (backward) is gathered beside each op's own
  // chunks by the shard prefetch, 27 MiB against 22.8 planned (-15.6%) before they were counted.
  expect_plan_holds_at_two_ranks(
      " --model small --n-layer 6 --n-embd 512 --n-head 8 --vocab-size 1000 --chunk-size 20000 "
      "--batch 4 --seq 32 --steps 2 --dropout 0 --threads 1 --device sim:1GiB --gemini auto "
      "--zero 3");
  // Offloaded activations are gone when step()'s all_gathers of updated pieces run, the host's
  // peak at stage 2: +29.9% when both were counted at once.
  expect_plan_holds_at_two_ranks(
      " --model small --n-layer 2 --n-embd 128 --n-head 4 --vocab-size 50257 --chunk-size 300000 "
      "--batch 2 --seq 128 --steps 2 --dropout 0 --threads 1 --device sim:1GiB --gemini auto "
      "--offload-activations --zero 2");
  // Construction builds wte's chunk in RAM before any activation exists; with every state on the
  // device, it is the host's only other moment: +105% when counted beside the activations.
  expect_plan_holds_at_two_ranks(
      " --model small --n-layer 4 --n-embd 64 --n-head 4 --vocab-size 50257 --batch 4 --seq 32 "
      "--steps 2 --dropout 0 --threads 1 --device sim:1GiB --gemini static --offload-param-frac 0 "
      "--offload-optim-frac 0 --offload-activations --grad-accum 2 --zero 3");
  // Upper bounds, up to 15% above here (+9.6%, +10.4% measured): the plan counts a block's saved
  // tensors whole at its ops' backward, and two gradient buffers on the device while one is
  // reduced, where these small chunks' reductions were done before the next buffer was made.
  for (const char* gemini : {"--gemini static --offload-param-frac 1 --offload-optim-frac 1 "
                             "--zero 2 --shard-param-frac 0.5",
                             "--gemini static --zero 2"})
    expect_plan_holds_at_two_ranks(kGeminiModel + gemini, 0.15);
}

}  // namespace
}  // namespace mw
