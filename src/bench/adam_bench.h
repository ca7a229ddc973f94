// adam_bench's measurements and report (apps/adam_bench.cpp): the CPU Adam step
// (optim/adam_cpu.h) on N fp32 parameters with f32 gradients, next to three memory ceilings
// measured in the same run:
//   copy:  a[i] = b[i] over two arrays of N floats (STREAM convention: 8 B/elem);
//   triad: a[i] = b[i] + s * c[i] over three arrays of N floats (STREAM convention: 12 B/elem);
//   rmw28: Adam's own access pattern (read p, g, m, v; write p, m, v; 28 B/elem) with trivial
//          arithmetic, i.e. the best any Adam kernel could do on these very arrays.
// Adam's effective GB/s counts 28 bytes per parameter. Every timed number is the median of several
// runs after a warmup run; arrays are initialised in parallel (first touch) so that their pages
// are faulted in, and spread over the threads, before anything is timed.
#pragma once

#include <cstdint>
#include <vector>

#include "bench/format.h"
#include "optim/adam_cpu.h"

namespace mw::bench {

struct AdamBenchOptions {
  int64_t numel = 124439808;  // GPT-2 small
  int steps = 10;             // timed steps after one warmup step
  int threads = 0;            // reported only: the caller limits oneTBB
  std::vector<optim::Isa> isas;
  bool json = false;  // one JSON object per kernel instead of text
};

// Runs the ceilings and then each kernel; every line goes to `log` as it is known.
void run_adam_bench(const AdamBenchOptions& o, const LineSink& log);

}  // namespace mw::bench
