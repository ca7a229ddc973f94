// CPU features the run-time kernel choice needs beyond __builtin_cpu_supports.
#pragma once

#include <cpuid.h>

namespace mw {

// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports (14 and 16) does not know
// "f16c", so the bf16/f16 conversions and the Adam kernel read it themselves. The OS saves YMM
// state whenever "avx2" is reported, so the bit alone suffices after that test.
inline bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

// AVX512-BF16 (CPUID leaf 7, subleaf 1, EAX bit 5) with AVX512F, BW and VL: the bf16 products'
// VDPBF16PS (core/cpu/gemm_bf16.cpp). Read once: in a VM each CPUID traps to the hypervisor.
inline bool cpu_has_avx512_bf16() {
  static const bool has = [] {
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl"))
      return false;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && (eax & (1u << 5)) != 0;
  }();
  return has;
}

}  // namespace mw
