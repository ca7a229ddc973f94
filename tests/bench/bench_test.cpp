// The benchmarks behind the apps (src/bench), run small: their report lines are the ones the
// README and docs quote, the side-by-side comparisons find bitwise-equal losses, and the option
// checks refuse what the apps refuse. Timings themselves are not checked (the machine is shared).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "../data/temp_dir.h"
#include "bench/adam_bench.h"
#include "bench/cpu_time.h"
#include "bench/format.h"
#include "bench/gpt2_bench.h"
#include "bench/nvme_bench.h"
#include "bench/step_compare.h"
#include "core/cuda_stream.h"
#include "core/error.h"
#include "optim/adam_cpu.h"

namespace mw::bench {
namespace {

bool has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// A LineSink that keeps everything.
struct Collect {
  std::string text;
  LineSink sink() {
    return [this](const std::string& s) { text += s; };
  }
};

TEST(BenchFormat, StrprintfFormatsLikePrintfAtAnyLength) {
  EXPECT_EQ(strprintf("%-7s|%5.2f|%lld", "ab", 3.14159, 42LL), "ab     | 3.14|42");
  const std::string long_text(5000, 'x');
  EXPECT_EQ(strprintf("<%s>", long_text.c_str()).size(), 5002u);
  EXPECT_EQ(format_bytes(int64_t{2} << 30), "2GiB");
  EXPECT_EQ(format_bytes(int64_t{256} << 10), "256KiB");
  EXPECT_EQ(format_bytes(4097), "4097B");
}

TEST(NvmeBench, NoConfigurationOptionMeansTheTwelveWaySweepAndBadOnesAreRefused) {
  EXPECT_EQ(nvme_bench_configs(0, 0, "").size(), 12u);
  const std::vector<NvmeBenchConfig> one = nvme_bench_configs(0, 8, "");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].backend, io::BackendKind::kUring);
  EXPECT_EQ(one[0].block_bytes, int64_t{1} << 20);
  EXPECT_EQ(one[0].depth, 8);
  EXPECT_THROW(nvme_bench_configs(5000, 0, ""), InvalidArgument) << "not a multiple of 4096";
  EXPECT_THROW(nvme_bench_configs(0, 0, "auto"), InvalidArgument);
  EXPECT_THROW(nvme_bench_configs(0, 2000, ""), InvalidArgument);
}

TEST(NvmeBench, OneRepetitionWithoutFioGivesTheTextAndJsonLines) {
  data::testing::TempDir tmp;
  NvmeBenchRun run;
  run.dir = tmp.path();
  run.size_bytes = 1 << 20;
  run.fio = false;
  const NvmeBenchConfig c{io::BackendKind::kThreads, 256 << 10, 4};
  std::string line;
  try {
    line = run_nvme_bench(run, c);
  } catch (const Error& e) {
    if (has(e.what(), "refuses O_DIRECT")) GTEST_SKIP() << "no O_DIRECT under " << tmp.path();
    throw;
  }
  EXPECT_TRUE(has(line, "threads block 256KiB depth 4   size 1MiB (median of 1): write ")) << line;
  EXPECT_TRUE(has(line, " GB/s  read ")) << line;
  EXPECT_FALSE(has(line, "fio")) << line;
  run.json = true;
  line = run_nvme_bench(run, c);
  EXPECT_TRUE(has(line, "{\"backend\": \"threads\", \"block\": 262144, \"depth\": 4")) << line;
  EXPECT_TRUE(has(line, "\"write_GBps_reps\": [")) << line;
}

TEST(AdamBench, ReportsTheCeilingsAndOneLinePerKernel) {
  AdamBenchOptions o;
  o.numel = 100000;
  o.steps = 2;
  o.threads = 1;
  o.isas = {optim::Isa::Scalar};
  Collect text;
  run_adam_bench(o, text.sink());
  EXPECT_TRUE(has(text.text, "adam_bench: numel 100000 (0.00 GB moved per step at 28 B/param)"))
      << text.text;
  EXPECT_TRUE(has(text.text, "ceilings: copy ")) << text.text;
  EXPECT_TRUE(has(text.text, "scalar  median ")) << text.text;
  o.json = true;
  Collect json;
  run_adam_bench(o, json.sink());
  EXPECT_TRUE(has(json.text, "{\"numel\": 100000, \"isa\": \"scalar\", \"threads\": 1"))
      << json.text;
  EXPECT_FALSE(has(json.text, "ceilings:")) << "JSON mode prints only the JSON objects";
}

TEST(Gpt2Bench, TheReportWithoutAPeerSaysWhyAndTheJsonLineHasTheRatios) {
  Gpt2StepTiming ours;
  ours.median_ms = 100;
  ours.gemm_ms_per_step = 60;
  ours.gemm_gflops = 50;
  ours.gemm_flops_per_step = 3'000'000'000;
  ours.peak_rss_bytes = int64_t{512} << 20;
  ours.forward_ms = ours.backward_ms = ours.optimizer_ms = {1, 2, 3};
  ours.forward_other_ms = ours.backward_other_ms = {1};
  const IsolatedGemm iso{40, 60};
  TorchPeer none;
  const std::string text = gpt2_bench_report("tiny", ours, iso, none, false);
  EXPECT_TRUE(has(text, "(no PyTorch comparison: --torch off)")) << text;
  EXPECT_TRUE(has(text, "GEMM in a step: 60 ms = 60% of the step, at 50.0 GFLOP/s")) << text;
  EXPECT_TRUE(has(text, "achieved: 30.0 GFLOP/s over the whole step")) << text;
  TorchPeer torch;
  torch.ok = true;
  torch.median_ms = 200;
  torch.peak_rss_mb = 1024;  // the script's "peak_rss_mb" is ru_maxrss / 1024: MiB
  const std::string json = gpt2_bench_report("tiny", ours, iso, torch, true);
  EXPECT_TRUE(has(json, "median step (ms)")) << json;
  EXPECT_TRUE(has(json, "\"step_ratio\":0.5")) << json;
  EXPECT_TRUE(has(json, "\"rss_ratio\":0.5")) << json;
  EXPECT_FALSE(has(json, "device peak")) << "a cpu run has no device row: " << json;
  // On CUDA: our allocator's peak next to torch.cuda.max_memory_allocated.
  ours.device = Device::cuda(0);
  ours.device_peak_bytes = int64_t{300} << 20;
  torch.device_peak_mb = 1200;
  const std::string cuda = gpt2_bench_report("tiny", ours, iso, torch, true);
  EXPECT_TRUE(has(cuda, "device peak (MiB)                     300         1200     0.25")) << cuda;
  EXPECT_TRUE(has(cuda, "\"device\":\"cuda:0\"")) << cuda;
  EXPECT_TRUE(has(cuda, "\"torch_device_peak_mb\":1200")) << cuda;
  // Without CUDA_LAUNCH_BLOCKING=1 the host clocks only see launches: no GEMM time, no op table.
  ours.ops_timed = false;
  const std::string async = gpt2_bench_report("tiny", ours, iso, torch, false);
  EXPECT_TRUE(has(async, "its time and the per-op table need CUDA_LAUNCH_BLOCKING=1")) << async;
  EXPECT_FALSE(has(async, "% of the step")) << async;
}

// Note [Alternated rounds]: the step ratio is the median of the rounds' ratios (a slow minute
// moves one round, not the verdict), the other lines pool the rounds' steps.
TEST(Gpt2Bench, RoundsGiveTheMedianOfTheirRatiosAndPoolTheirSteps) {
  std::vector<Gpt2StepTiming> ours(3);
  std::vector<TorchPeer> peers(3);
  const double ours_ms[] = {100, 300, 110}, peer_ms[] = {200, 310, 120};
  for (int i = 0; i < 3; ++i) {
    ours[i].median_ms = ours_ms[i];
    ours[i].step_ms = {ours_ms[i], ours_ms[i]};
    ours[i].measured_steps = 2;
    ours[i].gemm_ms_per_step = 50;
    ours[i].gemm_flops_per_step = 1'000'000'000;
    ours[i].peak_rss_bytes = int64_t{100 + i} << 20;
    ours[i].ops = {{"linear", 4, 10.0 * (i + 1), 5}};
    peers[i].ok = true;
    peers[i].median_ms = peer_ms[i];
    peers[i].peak_rss_mb = 300 - i;
  }
  const Gpt2StepTiming all = pooled(ours);
  EXPECT_EQ(all.measured_steps, 6);
  EXPECT_EQ(all.step_ms.size(), 6u);
  EXPECT_EQ(all.median_ms, 110);
  EXPECT_EQ(all.peak_rss_bytes, int64_t{102} << 20) << "the process's highest";
  ASSERT_EQ(all.ops.size(), 1u);
  EXPECT_EQ(all.ops[0].calls, 12);
  EXPECT_EQ(all.ops[0].ms, 60);
  EXPECT_DOUBLE_EQ(all.gemm_gflops, 20) << "1 GFLOP in 50 ms";
  const TorchPeer torch = pooled(peers, ours);
  ASSERT_TRUE(torch.ok);
  EXPECT_EQ(torch.median_ms, 200);
  EXPECT_EQ(torch.peak_rss_mb, 300);
  ASSERT_EQ(torch.round_ratios.size(), 3u);
  // 0.5, 0.968, 0.917: the median 0.917, where the pooled medians' 110 / 200 would say 0.55
  const std::string report = gpt2_bench_report("tiny", all, {40, 60}, torch, true);
  EXPECT_TRUE(has(report, "0.92 (the rounds' median)")) << report;
  EXPECT_TRUE(has(report, "odd rounds memwall first): 0.50 0.97 0.92 -> median 0.92")) << report;
  EXPECT_TRUE(has(report, "\"round_step_ratios\":[0.5,")) << report;
  peers[1].ok = false;
  peers[1].note = "the PyTorch peer failed";
  EXPECT_FALSE(pooled(peers, ours).ok) << "a round without its peer has no ratio";
}

TEST(Gpt2Bench, TinyStepsAreTimedAndLogged) {
  Collect log;
  const Gpt2StepTiming t =
      time_gpt2_steps(gpt2::Config::preset("tiny"), 2, 8, 3, Device::cpu(), DType::F32, log.sink());
  EXPECT_EQ(t.losses.size(), 3u);
  EXPECT_EQ(t.forward_ms.size(), 2u) << "the first step is a warmup";
  EXPECT_TRUE(has(log.text, "  ours [2] loss ")) << log.text;
  // Note [Op profile]: the measured steps' ops, forward and backward, and the report's table.
  EXPECT_EQ(t.measured_steps, 2);
  std::vector<std::string> names;
  for (const profile::OpTime& op : t.ops) names.push_back(op.name);
  for (const char* name : {"lm_head", "LmHeadBackward", "layernorm", "AccumulateGrad"})
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  EXPECT_FALSE(profile::enabled()) << "left on after the steps";
  const std::string report = gpt2_bench_report("tiny", t, {}, {}, false);
  EXPECT_TRUE(has(report, "per-op profile (mean of 2 steps")) << report;
  EXPECT_TRUE(has(report, "(outside any op)")) << report;
}

// gpt2_bench --device cuda: the same steps on a GPU (skipped without one). Both devices start from
// the same weights and tokens; the losses agree to fp32 rounding of different summation orders
// (cuBLAS against OpenBLAS, the GPU's reductions). CudaGpt2.ThreeTrainingStepsMatchTheCpu holds
// 1e-5 relative; 1e-4 here, as HybridAdam's fused CUDA and AVX kernels also round each update
// differently (1 ulp of an lr-sized step).
TEST(Gpt2BenchCuda, TinyStepsMatchTheCpuAndReportTheDevicePeak) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  Collect log;
  // Dropout off, as gpt2_bench runs: the masks come from one global generator, so with dropout the
  // second run would draw other masks than the first (seen on an H100: 1e-3 apart at step 0).
  gpt2::Config tiny = gpt2::Config::preset("tiny");
  tiny.set_dropout(0.0);
  const Gpt2StepTiming cpu = time_gpt2_steps(tiny, 2, 8, 3, Device::cpu(), DType::F32, log.sink());
  const Gpt2StepTiming gpu =
      time_gpt2_steps(tiny, 2, 8, 3, Device::cuda(0), DType::F32, log.sink());
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  for (size_t i = 0; i < cpu.losses.size(); ++i)
    EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-4 * std::abs(cpu.losses[i])) << "step " << i;
  EXPECT_GT(gpu.device_peak_bytes, 0);
  EXPECT_EQ(cpu.device_peak_bytes, 0);
  const IsolatedGemm iso = time_isolated_gemms(tiny, 2, 8, Device::cuda(0), DType::F32);
  EXPECT_GT(iso.gflops, 0);
}

TEST(StepCompare, NvmeAndInMemoryStatesGiveBitwiseEqualLosses) {
  data::testing::TempDir tmp;
  optim::NvmeOffloadOptions nvme;
  nvme.fraction = 1.0;
  nvme.dir = tmp.path();
  Collect log;
  // Without fio (NvmeStepBench.TrainsBothModelsSideBySideWithEqualLosses runs it): 8 s less.
  const bool same =
      compare_nvme_steps({"tiny", gpt2::Config::preset("tiny"), 2, 16, 3, false}, nvme, log.sink());
  EXPECT_TRUE(same) << log.text;
  EXPECT_TRUE(has(log.text, "nvme_step_bench: GPT-2 tiny, B2 T16, 3 steps each")) << log.text;
  EXPECT_TRUE(has(log.text, "over 2 pairs | losses bitwise equal")) << log.text;
  EXPECT_TRUE(has(log.text, "nvme: read ")) << log.text;
  EXPECT_TRUE(has(log.text, "machine CPU time per step (/proc/stat")) << log.text;
  EXPECT_FALSE(has(log.text, "disk floor per step")) << log.text;
  EXPECT_TRUE(has(log.text, "no disk floor (Note [Disk floor]): --no-fio")) << log.text;
}

// A path reaches fio and the PyTorch peer's shell as one word, whatever it holds.
TEST(BenchFormat, ShellQuoteKeepsAPathOneWord) {
  EXPECT_EQ(shell_quote("/tmp/a b"), "'/tmp/a b'");
  EXPECT_EQ(shell_quote("it's $HOME"), "'it'\\''s $HOME'");
  FILE* echo = ::popen(("printf '%s|' " + shell_quote("a 'b' $c;d")).c_str(), "r");
  ASSERT_NE(echo, nullptr);
  char buf[64] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, echo);
  ::pclose(echo);
  EXPECT_EQ(std::string(buf, n), "a 'b' $c;d|");
}

// Note [Stolen time]: the machine's CPU time from /proc/stat moves with the work done: a busy loop
// of 200 ms adds at least ~150 ms of busy (or stolen) time (the tick is 10 ms; others may run too)
// and the kinds add up to no more than the wall time over every CPU.
TEST(CpuTimes, CountTheBusyTimeOfThisProcess) {
  const CpuTimes before = machine_cpu_times();
  ASSERT_TRUE(before.known) << "/proc/stat unreadable";
  const auto t0 = std::chrono::steady_clock::now();
  volatile double x = 0;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(200)) x = x + 1;
  const CpuTimes d = machine_cpu_times() - before;
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(d.known);
  EXPECT_GE(d.busy_ms + d.steal_ms, 150);  // a stolen vCPU was not busy for the guest
  const double cpus = static_cast<double>(std::thread::hardware_concurrency());
  EXPECT_LE(d.busy_ms + d.idle_ms + d.steal_ms, cpus * (wall_ms + 20));
  EXPECT_GE(d.idle_ms, 0);
  EXPECT_GE(d.steal_ms, 0);
}

TEST(StepCompare, GeminiAutoAndStaticCpuMatchThePlainRunBitwise) {
  Collect log;
  const bool same = compare_gemini_steps({"tiny", gpt2::Config::preset("tiny"), 2, 16, 4},
                                         int64_t{64} << 20, log.sink());
  EXPECT_TRUE(same) << log.text;
  EXPECT_TRUE(has(log.text, "gemini_step_bench: GPT-2 tiny, B2 T16, 4 steps each, rotating"))
      << log.text;
  EXPECT_TRUE(has(log.text, "over 2 rounds | losses bitwise equal")) << log.text;
  EXPECT_TRUE(has(log.text, "(capacity 64 MiB)")) << log.text;
}

}  // namespace
}  // namespace mw::bench
