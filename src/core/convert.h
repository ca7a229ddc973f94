// Bulk conversions between f32 and the 16-bit float types (bf16, f16) on the host, with the
// instruction set chosen at run time.
//
// Note [Low-precision conversions]: f32 -> bf16/f16 rounds to nearest, ties to even; f16 keeps
// subnormals, overflows to inf, and keeps inf; a NaN stays a NaN (quiet, payload truncated, sign
// kept). The 16-bit -> f32 direction is exact (every bf16 and f16 value is an f32), except that an
// f16 signalling NaN comes back quiet, as F16C's vcvtph2ps returns it. Every ISA gives the same
// bits as the scalar functions of dtype.h (tests/precision, over all 2^16 patterns and dense f32
// samples with every rounding tie):
//  - scalar: dtype.h's float_to_bf16 / float_to_half, element by element;
//  - avx2: F16C's vcvtps2ph/vcvtph2ps for f16 (imm 0: nearest even, MXCSR not consulted); bf16 by
//    integer arithmetic (add 0x7fff plus the kept lsb, shift), NaN by a blend;
//  - avx512 (avx512f + avx512bw): the same on 16 lanes. We do not use AVX512-BF16's vcvtneps2bf16:
//    it treats denormal inputs as zero and flushes denormal outputs (Intel SDM), so a bf16 tensor
//    would differ between machines; the integer form costs nothing measurable (memory-bound).
// MW_CONVERT_ISA=scalar|avx2|avx512 overrides the choice (tests, debugging).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace mw {

enum class ConvertIsa : uint8_t { Scalar, AVX2, AVX512 };

const char* convert_isa_name(ConvertIsa isa);
bool convert_isa_supported(ConvertIsa isa);
// The fastest supported ISA, or MW_CONVERT_ISA's (InvalidArgument when unknown or unsupported).
// Decided once per process.
ConvertIsa best_convert_isa();

// dst[numel] = src[numel] converted; one of `from`, `to` is F32, the other BF16 or F16 (or both
// F32: a copy). Single-threaded; callers split large ranges (Tensor::copy_ does).
void convert_floats(ConvertIsa isa, DType from, const void* src, DType to, void* dst,
                    int64_t numel);
inline void convert_floats(DType from, const void* src, DType to, void* dst, int64_t numel) {
  convert_floats(best_convert_isa(), from, src, to, dst, numel);
}

// True for the 16-bit float types that mixed precision stores (bf16, f16).
inline bool is_low_precision(DType t) { return t == DType::BF16 || t == DType::F16; }

namespace detail {
// The SIMD bodies (convert_avx2.cpp, convert_avx512.cpp): whole vectors only, return how many
// elements they converted; the caller finishes the tail with the scalar functions.
int64_t convert_avx2(DType from, const void* src, DType to, void* dst, int64_t numel);
int64_t convert_avx512(DType from, const void* src, DType to, void* dst, int64_t numel);
}  // namespace detail

}  // namespace mw
