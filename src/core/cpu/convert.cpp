// Run-time ISA choice and the scalar path of the f32 <-> bf16/f16 conversions
// (Note [Low-precision conversions], convert.h).
#include "core/convert.h"

#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/cpu_features.h"
#include "core/error.h"

namespace mw {

const char* convert_isa_name(ConvertIsa isa) {
  switch (isa) {
    case ConvertIsa::Scalar: return "scalar";
    case ConvertIsa::AVX2: return "avx2";
    case ConvertIsa::AVX512: return "avx512";
  }
  return "?";
}

bool convert_isa_supported(ConvertIsa isa) {
  switch (isa) {
    case ConvertIsa::Scalar: return true;
    case ConvertIsa::AVX2: return __builtin_cpu_supports("avx2") && cpu_has_f16c();
    case ConvertIsa::AVX512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }
  return false;
}

namespace {
ConvertIsa choose_convert_isa() {
  if (const char* env = std::getenv("MW_CONVERT_ISA"); env != nullptr && env[0] != '\0') {
    const std::string_view name(env);
    ConvertIsa isa;
    if (name == "scalar") {
      isa = ConvertIsa::Scalar;
    } else if (name == "avx2") {
      isa = ConvertIsa::AVX2;
    } else if (name == "avx512") {
      isa = ConvertIsa::AVX512;
    } else {
      throw InvalidArgument(str("MW_CONVERT_ISA='", env,
                                "' is not a conversion ISA; set it to scalar, avx2 or avx512, or "
                                "unset it"));
    }
    MW_CHECK_T(InvalidArgument, convert_isa_supported(isa), "MW_CONVERT_ISA=", env,
               " but this CPU lacks that instruction set; unset MW_CONVERT_ISA");
    return isa;
  }
  if (convert_isa_supported(ConvertIsa::AVX512)) return ConvertIsa::AVX512;
  if (convert_isa_supported(ConvertIsa::AVX2)) return ConvertIsa::AVX2;
  return ConvertIsa::Scalar;
}

void convert_scalar(DType from, const void* src, DType to, void* dst, int64_t begin, int64_t end) {
  if (from == DType::F32 && to == DType::BF16) {
    for (int64_t i = begin; i < end; ++i)
      static_cast<uint16_t*>(dst)[i] = float_to_bf16(static_cast<const float*>(src)[i]);
  } else if (from == DType::F32 && to == DType::F16) {
    for (int64_t i = begin; i < end; ++i)
      static_cast<uint16_t*>(dst)[i] = float_to_half(static_cast<const float*>(src)[i]);
  } else if (from == DType::BF16) {
    for (int64_t i = begin; i < end; ++i)
      static_cast<float*>(dst)[i] = bf16_to_float(static_cast<const uint16_t*>(src)[i]);
  } else {
    for (int64_t i = begin; i < end; ++i)
      static_cast<float*>(dst)[i] = half_to_float(static_cast<const uint16_t*>(src)[i]);
  }
}
}  // namespace

ConvertIsa best_convert_isa() {
  static const ConvertIsa isa = choose_convert_isa();
  return isa;
}

void convert_floats(ConvertIsa isa, DType from, const void* src, DType to, void* dst,
                    int64_t numel) {
  if (numel <= 0) return;
  if (from == to && from == DType::F32) {
    std::memcpy(dst, src, static_cast<size_t>(numel) * 4);
    return;
  }
  MW_CHECK_T(
      InvalidArgument,
      (from == DType::F32 && is_low_precision(to)) || (is_low_precision(from) && to == DType::F32),
      "convert_floats: converts f32 to bf16/f16 and back, not ", dtype_name(from), " to ",
      dtype_name(to));
  MW_CHECK_T(InvalidArgument, convert_isa_supported(isa), "convert_floats: this CPU cannot run ",
             convert_isa_name(isa));
  int64_t done = 0;
  if (isa == ConvertIsa::AVX512) {
    done = detail::convert_avx512(from, src, to, dst, numel);
  } else if (isa == ConvertIsa::AVX2) {
    done = detail::convert_avx2(from, src, to, dst, numel);
  }
  convert_scalar(from, src, to, dst, done, numel);
}

}  // namespace mw
