// Which version of the f32 loops runs (Note [Wider versions of f32 loops], fast_math.h).
#include <atomic>
#include <cstdlib>
#include <string_view>

#include "core/cpu/fast_math.h"
#include "core/error.h"

namespace mw::ops {

namespace {
F32Isa choose_f32_isa() {
  const char* env = std::getenv("MW_F32_ISA");
  if (env == nullptr || env[0] == '\0') {
    if (f32_isa_supported(F32Isa::AVX512)) return F32Isa::AVX512;
    return f32_isa_supported(F32Isa::AVX2) ? F32Isa::AVX2 : F32Isa::Baseline;
  }
  for (F32Isa isa : {F32Isa::Baseline, F32Isa::AVX2, F32Isa::AVX512}) {
    if (std::string_view(env) != f32_isa_name(isa)) continue;
    MW_CHECK_T(InvalidArgument, f32_isa_supported(isa), "MW_F32_ISA=", env,
               " but this CPU lacks that instruction set; unset MW_F32_ISA");
    return isa;
  }
  throw InvalidArgument(str("MW_F32_ISA='", env,
                            "' is not an f32 loop version; set it to baseline, avx2 or avx512, "
                            "or unset it"));
}

// -1 until the first f32_isa(); then the F32Isa's value.
std::atomic<int> g_isa{-1};
}  // namespace

const char* f32_isa_name(F32Isa isa) {
  switch (isa) {
    case F32Isa::Baseline: return "baseline";
    case F32Isa::AVX2: return "avx2";
    case F32Isa::AVX512: return "avx512";
  }
  return "?";
}

bool f32_isa_supported(F32Isa isa) {
  switch (isa) {
    case F32Isa::Baseline: return true;
    case F32Isa::AVX2: return __builtin_cpu_supports("avx2");
    case F32Isa::AVX512: return __builtin_cpu_supports("avx512f");
  }
  return false;
}

F32Isa f32_isa() {
  int isa = g_isa.load(std::memory_order_relaxed);
  if (isa < 0) {
    isa = static_cast<int>(choose_f32_isa());
    g_isa.store(isa, std::memory_order_relaxed);
  }
  return static_cast<F32Isa>(isa);
}

void set_f32_isa(F32Isa isa) {
  MW_CHECK_T(InvalidArgument, f32_isa_supported(isa), "set_f32_isa(", f32_isa_name(isa),
             "): this CPU lacks that instruction set");
  g_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
}

}  // namespace mw::ops
