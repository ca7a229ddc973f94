// Element types. f64 exists for the finite-difference gradient tests (every op runs in double);
// f16/bf16 are storage types for gradients and mixed precision; u16 is the token-file type.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace mw {

enum class DType : uint8_t { F32, F64, F16, BF16, I32, I64, U16 };

inline int64_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
    case DType::I32: return 4;
    case DType::F64:
    case DType::I64: return 8;
    case DType::F16:
    case DType::BF16:
    case DType::U16: return 2;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U16: return "u16";
  }
  return "?";
}

inline bool is_floating(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16;
}

template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::F64;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::I32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::I64;
};
template <>
struct dtype_of<uint16_t> {
  static constexpr DType value = DType::U16;
};

// bf16 and fp16 conversions (round-to-nearest-even), scalar; SIMD paths live with their kernels.
inline float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

}  // namespace mw
