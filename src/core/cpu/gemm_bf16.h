// Products of bf16 matrices with AVX512-BF16's VDPBF16PS (Note [bf16 products on AVX512-BF16],
// gemm_bf16.cpp). Internal to core: ops::gemm (cpu/gemm.cpp) calls it for bf16 operands in host
// memory when bf16_gemm_kernel() says so, and otherwise mixed::gemm widens them to f32.
#pragma once

#include <cstdint>

#include "core/cpu_features.h"  // cpu_has_avx512_bf16

namespace mw::ops {

// How bf16 x bf16 products run on the CPU: widened to f32 for sgemm, or by VDPBF16PS. Chosen on
// first use: AVX512-BF16 where the CPU has it; MW_BF16_GEMM=widen|avx512bf16 picks one, and
// set_bf16_gemm_kernel changes it (tests and benchmarks: tests/precision/gemm_bf16_test.cpp runs
// ops::gemm, linear and their backward with each on a CPU that has both). Asking for avx512bf16
// without it is an InvalidArgument.
enum class Bf16GemmKernel { kWiden, kAvx512Bf16 };
Bf16GemmKernel bf16_gemm_kernel();
void set_bf16_gemm_kernel(Bf16GemmKernel kernel);

// C[M, N] (f32, row-major, leading dimension ldc) = (accumulate ? C : 0) + op(A) op(B), with
// op(A) [M, K] and op(B) [K, N] bf16 (raw bits), row-major with leading dimensions lda, ldb and
// transposed when ta / tb (as BLAS). Accumulated in f32 over k in order, in pairs.
void gemm_bf16_avx512(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* A,
                      int64_t lda, const uint16_t* B, int64_t ldb, float* C, int64_t ldc,
                      bool accumulate);

}  // namespace mw::ops
