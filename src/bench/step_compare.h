// Side-by-side step-time comparisons (apps/nvme_step_bench.cpp, apps/gemini_step_bench.cpp):
// identical GPT-2 models train on the same tokens and dropout masks in one process, their steps
// alternating (or rotating), so all see the same machine load from one minute to the next (this
// shared machine's load moves step times by +-20% over minutes); the reported figures are medians
// of per-round ratios, and the losses must be equal bit for bit.
//
// NVMe: HybridAdam with m and v in RAM (updates inside backward, gpt2_train's default) against
// the same with them on disk. The offloaded step is timed up to the end of step(); its last
// write-backs, which in training overlap its next forward, are then completed (flush) outside both
// timings, so neither model's step is slowed by the other's I/O. The prefetch of its next step's
// first slices (the window) still runs during the in-memory model's step, as it runs during its
// own forward in training.
//
// Gemini: a plain model on an unlimited sim device against Gemini auto and Gemini static cpu
// (offload_param_frac = offload_optim_frac = 1), each on its own capped sim device.
#pragma once

#include <cstdint>
#include <string>

#include "bench/format.h"
#include "models/gpt2/config.h"
#include "optim/nvme_states.h"

namespace mw::bench {

struct StepCompareShape {
  std::string model;  // the preset's name, for the report
  gpt2::Config config;
  int64_t batch = 4, seq = 128, steps = 3;
  bool fio = true;  // compare_nvme_steps: fio measures the disk floor (Note [Disk floor]), 2 x 2 GB
  // compare_gemini_steps: autocast's dtype (F32: off); BF16/F16 give Gemini's models 16-bit
  // copies of the blocks' matrices (Note [16-bit copies], offload/gemini/low_copies.cpp).
  DType precision = DType::F32;
};

// Every line goes to `log` as it is known; true when the losses were bitwise equal.
bool compare_nvme_steps(const StepCompareShape& shape, const optim::NvmeOffloadOptions& nvme,
                        const LineSink& log);

// Gemini's models use sim devices 0, 2 and 3 with `capacity_bytes` each; the plain one sim:1.
bool compare_gemini_steps(const StepCompareShape& shape, int64_t capacity_bytes,
                          const LineSink& log);

}  // namespace mw::bench
