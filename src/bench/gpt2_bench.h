// gpt2_bench's measurements and report (apps/gpt2_bench.cpp): GPT-2 training steps timed by phase
// with their GEMM share, the same GEMM shapes timed alone (the ceiling), and the PyTorch peer
// (tools/torch_gpt2_bench.sh) run as a subprocess so its RSS is its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/format.h"
#include "core/op_profile.h"
#include "models/gpt2/config.h"

namespace mw::bench {

struct Gpt2StepTiming {
  double median_ms = 0, gemm_ms_per_step = 0, gemm_gflops = 0;
  int64_t peak_rss_bytes = 0, gemm_flops_per_step = 0;
  // per-phase times of the measured steps; *_other is the phase minus its gemm() time
  std::vector<double> forward_ms, backward_ms, optimizer_ms, forward_other_ms, backward_other_ms;
  std::vector<double> losses;
  // Note [Op profile]: per op, summed over the measured steps (forward functions by name, backward
  // nodes by theirs; AccumulateGrad holds the updates in backward)
  std::vector<profile::OpTime> ops;
  int64_t measured_steps = 0;
};

// `steps` fp32 training steps (HybridAdam, updates in backward, random tokens); the first is a
// warmup, reported to `log` but not in the medians.
Gpt2StepTiming time_gpt2_steps(const gpt2::Config& config, int64_t B, int64_t T, int64_t steps,
                               const LineSink& log);

// The ceiling: each GEMM shape of one training step timed alone (median of 5), weighted by how
// many times a step runs it.
struct IsolatedGemm {
  double ms_per_step = 0, gflops = 0;
};
IsolatedGemm time_isolated_gemms(const gpt2::Config& config, int64_t B, int64_t T);

struct TorchPeer {
  bool ok = false;
  double median_ms = 0, peak_rss_mb = 0;
  std::string note;  // why there is no comparison
};
// Runs `source_dir`/tools/torch_gpt2_bench.sh tuned; its lines go to `log`.
TorchPeer run_torch_peer(const std::string& source_dir, const std::string& model, int64_t B,
                         int64_t T, int64_t steps, int threads, const LineSink& log);

// The lines after the run: the comparison table, GEMM share, phases, ceiling, and with `json`
// the JSON summary line.
std::string gpt2_bench_report(const std::string& model, const Gpt2StepTiming& ours,
                              const IsolatedGemm& isolated, const TorchPeer& torch, bool json);

}  // namespace mw::bench
