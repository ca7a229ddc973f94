// Inputs and the bar shared by the memory plan's tests (memory_plan_test.cpp: the plan against
// measured peaks; memory_plan_cuda_test.cpp: against an H100's; memory_check_test.cpp: the
// refusals and the arithmetic's edges).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "models/gpt2/config.h"
#include "train/memory_plan.h"

namespace mw::train::test {

constexpr int kSim = 5;  // a sim device of its own (capacity and peak are per index)

// GPT-2 small's widths (C 768, V 50257) with two blocks.
inline gpt2::Config wide() {
  gpt2::Config c = gpt2::Config::preset("small");
  c.n_layer = 2;
  return c;
}

inline gpt2::Config small_ish() {  // big enough that the 4096-byte granule does not dominate
  gpt2::Config c = gpt2::Config::preset("tiny");
  c.n_layer = 4;
  c.n_embd = 256;
  c.n_head = 4;
  c.vocab_size = 2048;
  c.n_positions = 256;
  return c;
}

inline gpt2::Config tiny() {
  gpt2::Config c = gpt2::Config::preset("tiny");
  c.n_layer = 2;
  c.n_embd = 64;
  c.n_head = 2;
  c.vocab_size = 257;
  return c;
}

inline PlanInputs inputs(const gpt2::Config& c, int64_t batch, int64_t seq) {
  PlanInputs in;
  in.config = c;
  in.config.set_dropout(0.1);
  in.batch = batch;
  in.seq = seq;
  in.nvme_slice_numel = 1024;  // small slices and slots: a small model streams too
  return in;
}

inline PlanInputs on_sim(PlanInputs in) {
  in.device = Device::sim(kSim);
  return in;
}

// The bar. The sim allocator splits every block to the granule, so its peak is the bytes
// the ops asked for, which the plan counts; short-lived outputs (dropout, the residual adds,
// gradients inside a block's backward) overlap the peak by a tensor or two that it does not.
constexpr double kTolerance = 0.10;

// `timing_bytes`: bytes the plan counts whose presence at the peak depends on timing; a run where
// they never overlap measures up to that much less, which is no error of the plan.
inline void expect_within(int64_t predicted, int64_t measured, const char* what,
                          int64_t timing_bytes = 0) {
  if (measured < (1 << 20)) {  // a tier that holds next to nothing: a ratio would mean nothing
    EXPECT_LT(predicted, 1 << 20) << what;
    return;
  }
  const int64_t over = predicted - measured;
  const int64_t beyond_timing = over > 0 ? std::max<int64_t>(0, over - timing_bytes) : over;
  const double error = static_cast<double>(beyond_timing) / static_cast<double>(measured);
  const double mib = 1 << 20, m = static_cast<double>(measured);
  std::printf("%s: plan %.2f MiB, measured %.2f MiB, error %+.1f%% (%+.1f%% beyond %.2f MiB)\n",
              what, static_cast<double>(predicted) / mib, m / mib,
              100 * static_cast<double>(over) / m, 100 * error,
              static_cast<double>(timing_bytes) / mib);
  EXPECT_LE(std::abs(error), kTolerance) << what;
}

}  // namespace mw::train::test
