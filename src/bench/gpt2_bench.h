// gpt2_bench's measurements and report (apps/gpt2_bench.cpp): GPT-2 training steps timed by phase
// with their GEMM share, the same GEMM shapes timed alone (the ceiling), and the PyTorch peer
// (tools/torch_gpt2_bench.sh) run as a subprocess so its RSS is its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/format.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/op_profile.h"
#include "models/gpt2/config.h"

namespace mw::bench {

struct Gpt2StepTiming {
  double median_ms = 0, gemm_ms_per_step = 0, gemm_gflops = 0;
  int64_t peak_rss_bytes = 0, gemm_flops_per_step = 0;
  Device device;                 // where the model trained
  DType precision = DType::F32;  // autocast's dtype (F32: off)
  // False on CUDA unless CUDA_LAUNCH_BLOCKING=1: kernels and cuBLAS calls return before the GPU
  // runs them, so the GEMM and per-op times are launch times and the report leaves them out.
  bool ops_timed = true;
  int64_t device_peak_bytes = 0;  // a CUDA device's allocator peak over the steps (0 on the cpu)
  // per-phase times of the measured steps; *_other is the phase minus its gemm() time
  std::vector<double> forward_ms, backward_ms, optimizer_ms, forward_other_ms, backward_other_ms;
  std::vector<double> losses;
  // Note [Op profile]: per op, summed over the measured steps (forward functions by name, backward
  // nodes by theirs; AccumulateGrad holds the updates in backward)
  std::vector<profile::OpTime> ops;
  int64_t measured_steps = 0;
  std::vector<double> step_ms;  // the measured steps' times (median_ms is their median)
};

// `steps` training steps (HybridAdam, updates in backward, random tokens) on `device` (cpu or
// cuda:N), the forward and loss under autocast to `precision` (F32: off; BF16); the first is a
// warmup, reported to `log` but not in the medians. On CUDA each phase ends with a device
// synchronisation, so the phase times are the GPU's; the per-op table is host time (launches are
// asynchronous) unless the process runs with CUDA_LAUNCH_BLOCKING=1.
Gpt2StepTiming time_gpt2_steps(const gpt2::Config& config, int64_t B, int64_t T, int64_t steps,
                               Device device, DType precision, const LineSink& log);

// Note [Alternated rounds]: gpt2_bench runs `--rounds` rounds of our steps and the peer's,
// alternating which goes first, since a shared machine's speed drifts over minutes: the step ratio
// is the median of the rounds' ratios, each taken from two runs minutes apart at most. pooled()
// puts the rounds' measured steps together for the report's other lines: their phases, per-op
// times and GEMM rates, the median of all their steps, the highest peak RSS.
Gpt2StepTiming pooled(const std::vector<Gpt2StepTiming>& rounds);

// The ceiling: each GEMM shape of one training step timed alone (median of 5), weighted by how
// many times a step runs it; operands and results in `precision` (autocast's linears multiply
// bf16 operands).
struct IsolatedGemm {
  double ms_per_step = 0, gflops = 0;
};
IsolatedGemm time_isolated_gemms(const gpt2::Config& config, int64_t B, int64_t T, Device device,
                                 DType precision);

struct TorchPeer {
  bool ok = false;
  double median_ms = 0;
  double peak_rss_mb = 0;     // MiB, as the script prints it (getrusage's ru_maxrss KiB / 1024)
  double device_peak_mb = 0;  // torch.cuda.max_memory_allocated, on CUDA
  std::string note;           // why there is no comparison
  // Note [Alternated rounds]: each round's ours / peer step ratio (empty: one run, no rounds)
  std::vector<double> round_ratios;
};
// Note [Alternated rounds]: the rounds' peers as one (the median of their medians, the highest
// peak), with each round's ratio `ours[i].median_ms / peers[i].median_ms`; not ok if any failed.
TorchPeer pooled(const std::vector<TorchPeer>& peers, const std::vector<Gpt2StepTiming>& ours);

// On the cpu runs `source_dir`/tools/torch_gpt2_bench.sh tuned (Debian's python3-torch); on CUDA
// tools/torch_gpt2_bench.py --device cuda:N with the python3 on PATH (the GPU machine's own torch).
// Its lines go to `log`. BF16 `precision` runs it with --precision bf16 (torch.autocast).
TorchPeer run_torch_peer(const std::string& source_dir, const std::string& model, int64_t B,
                         int64_t T, int64_t steps, int threads, Device device, DType precision,
                         const LineSink& log);

// The lines after the run: the comparison table, GEMM share, phases, ceiling, and with `json`
// the JSON summary line.
std::string gpt2_bench_report(const std::string& model, const Gpt2StepTiming& ours,
                              const IsolatedGemm& isolated, const TorchPeer& torch, bool json);

}  // namespace mw::bench
