// CPU Adam: the kernels of Note [Adam math] (optim/adam_math.h) for fp32 parameters and states
// with f32, f16 or bf16 gradients, the run-time choice of instruction set, and a oneTBB front-end.
//
// Note [Adam ISA dispatch]: the instruction set is chosen at run time, never at build time. The
// AVX2 and AVX-512 kernels are compiled per function with target attributes (no -march flag), so
// one binary carries all three and runs on any x86-64 CPU. best_isa() asks CPUID (through
// __builtin_cpu_supports, which also checks that the OS saves the YMM/ZMM state) and honours the
// override MW_ADAM_ISA=scalar|avx2|avx512. ColossalAI's AVX-512 path was never compiled because it
// tested a macro GCC never defines; DeepSpeed's most common user bug is an ISA fixed at build time.
//
// Invariant: for the same inputs every ISA, and the parallel front-end with any thread count,
// produce bitwise identical results (tests/optim).
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "optim/adam_math.h"
#include "optim/decay_ranges.h"

namespace mw::optim {

enum class Isa : uint8_t { Scalar, AVX2, AVX512 };

// "scalar", "avx2", "avx512".
const char* isa_name(Isa isa);
// Parses isa_name() spellings; throws InvalidArgument naming the accepted values.
Isa parse_isa(std::string_view name);
// Whether this CPU (and OS) can run the kernel: AVX2 needs avx2+fma+f16c, AVX512 needs
// avx512f+avx512bw+avx512vl.
bool isa_supported(Isa isa);
// Every ISA this CPU supports, from slowest to fastest (Scalar first).
std::vector<Isa> supported_isas();
// The fastest supported ISA, or the one named by MW_ADAM_ISA. Throws InvalidArgument when
// MW_ADAM_ISA names an unknown ISA or one this CPU lacks.
Isa best_isa();

// Elements per task of the parallel front-end: 64 Ki fp32 elements (1.75 MiB of p, g, m, v
// traffic), a multiple of 64 so that every task but the last starts on a cache line boundary when
// the arrays do.
inline constexpr int64_t kAdamGrainNumel = int64_t{1} << 16;

// One Adam step over numel elements on the calling thread:
//   param[numel], exp_avg[numel], exp_avg_sq[numel]: fp32, updated in place;
//   grad[numel]: grad_dtype (F32, F16 or BF16), read only.
// Arrays need no alignment. Throws InvalidArgument for an unsupported ISA or grad dtype, a negative
// numel, or null pointers with numel > 0.
void adam_update(Isa isa, const AdamStepScalars& scalars, float* param, const void* grad,
                 DType grad_dtype, float* exp_avg, float* exp_avg_sq, int64_t numel);
// Convenience: derives the scalars of `step` (1-based) from the hyperparameters first.
void adam_update(Isa isa, const AdamHyper& hyper, int64_t step, float div_scale, float* param,
                 const void* grad, DType grad_dtype, float* exp_avg, float* exp_avg_sq,
                 int64_t numel);

// The same step split across oneTBB worker threads in tasks of kAdamGrainNumel elements. Results
// are bitwise equal to adam_update(). Thread count: the caller's tbb::global_control / arena.
// `non_finite` (optional) is set when an updated parameter element is NaN or Inf: each task checks
// its elements right after writing them, while they are in cache (Note [Non-finite values] in
// train/trainer.cpp: a non-finite gradient stepped during backward shows there).
void adam_update_parallel(Isa isa, const AdamStepScalars& scalars, float* param, const void* grad,
                          DType grad_dtype, float* exp_avg, float* exp_avg_sq, int64_t numel,
                          std::atomic<bool>* non_finite = nullptr);
// adam_update_parallel over a whole tensor whose elements in `no_decay` are stepped without the
// weight decay (Note [Weight decay by ranges], decay_ranges.h): one call per segment.
void adam_update_ranged(Isa isa, const AdamStepScalars& scalars, const NoDecayRanges& no_decay,
                        float* param, const void* grad, DType grad_dtype, float* exp_avg,
                        float* exp_avg_sq, int64_t numel, std::atomic<bool>* non_finite = nullptr);
// True when none of x[0, n) is NaN or Inf.
bool all_finite(const float* x, int64_t n);
void adam_update_parallel(Isa isa, const AdamHyper& hyper, int64_t step, float div_scale,
                          float* param, const void* grad, DType grad_dtype, float* exp_avg,
                          float* exp_avg_sq, int64_t numel);

}  // namespace mw::optim
