// Inputs shared by the memory plan's tests (memory_plan_test.cpp: the plan against measured peaks;
// memory_check_test.cpp: the refusals and the arithmetic's edges).
#pragma once

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

}  // namespace mw::train::test
