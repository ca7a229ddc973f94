// The f32 <-> bf16/f16 conversions (Note [Low-precision conversions], core/convert.h) against
// independent references: every one of the 2^16 patterns in the to-f32 direction, and dense f32
// samples around every 16-bit value (the value, the exact ties half-way to each neighbour and one
// f32 ulp either side of them) plus a million random f32 bit patterns in the other, on every ISA
// this CPU runs. Also Tensor::copy_/to(dtype), which use them.
#include "core/convert.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/tensor.h"

namespace mw {
namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float float_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// The value of an f16 pattern from its definition (not from the code under test).
double half_value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  if (exp == 31) v = mant == 0 ? INFINITY : NAN;
  return sign ? -v : v;
}
double low_value(DType t, uint16_t h) {
  return t == DType::BF16 ? static_cast<double>(float_of(static_cast<uint32_t>(h) << 16))
                          : half_value(h);
}

// Round-to-nearest-even of a finite or infinite x to `t`, by search over the non-negative finite
// values (sorted by pattern); the first pattern past the largest finite value stands for infinity.
uint16_t reference_round(DType t, float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  const uint16_t inf = t == DType::BF16 ? 0x7f80 : 0x7c00;
  if (std::isinf(a)) return sign | inf;
  // Non-negative patterns 0..inf increase in value; find the last one <= a.
  uint16_t lo = 0, hi = inf;  // low_value(lo) <= a < low_value(hi) or hi == inf
  while (hi - lo > 1) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
    (low_value(t, mid) <= a ? lo : hi) = mid;
  }
  // The value of `hi` when it is inf: the next power of two, as if the exponent went on.
  const double vlo = low_value(t, lo);
  const double vhi =
      hi == inf ? 2 * low_value(t, inf - 1) - low_value(t, inf - 2) : low_value(t, hi);
  if (a - vlo < vhi - a) return sign | lo;
  if (a - vlo > vhi - a) return sign | hi;
  return sign | ((lo & 1) == 0 ? lo : hi);  // tie: the even mantissa
}

std::vector<ConvertIsa> isas() {
  std::vector<ConvertIsa> out;
  for (ConvertIsa i : {ConvertIsa::Scalar, ConvertIsa::AVX2, ConvertIsa::AVX512})
    if (convert_isa_supported(i)) out.push_back(i);
  return out;
}

TEST(Convert, AvxChoiceFollowsTheCpu) {
  const ConvertIsa best = best_convert_isa();
  EXPECT_TRUE(convert_isa_supported(best));
  if (std::getenv("MW_CONVERT_ISA") == nullptr) {
    const ConvertIsa expected = convert_isa_supported(ConvertIsa::AVX512) ? ConvertIsa::AVX512
                                : convert_isa_supported(ConvertIsa::AVX2) ? ConvertIsa::AVX2
                                                                          : ConvertIsa::Scalar;
    EXPECT_EQ(best, expected) << convert_isa_name(best);
  }
  // Asking for an ISA the CPU lacks is an error, never a crash.
  if (!convert_isa_supported(ConvertIsa::AVX512)) {
    float f = 1;
    uint16_t h;
    EXPECT_THROW(convert_floats(ConvertIsa::AVX512, DType::F32, &f, DType::BF16, &h, 1),
                 InvalidArgument);
  }
}

TEST(Convert, EveryLowPatternToF32IsExact) {
  std::vector<uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (DType t : {DType::BF16, DType::F16}) {
    for (ConvertIsa isa : isas()) {
      std::vector<float> out(65536);
      convert_floats(isa, t, all.data(), DType::F32, out.data(), 65536);
      int64_t bad = 0;
      for (int i = 0; i < 65536; ++i) {
        const double want = low_value(t, static_cast<uint16_t>(i));
        const float got = out[i];
        bool ok;
        if (std::isnan(want)) {  // quiet NaN, same sign, payload kept in the top bits
          const uint32_t shift = t == DType::BF16 ? 16 : 13;
          const uint32_t payload = t == DType::BF16 ? (i & 0x7f) : (i & 0x3ff);
          ok = std::isnan(got) && std::signbit(got) == ((i & 0x8000) != 0) &&
               ((bits_of(got) >> shift) & (t == DType::BF16 ? 0x7f : 0x3ff) &
                ~(t == DType::BF16 ? 0u : 0x200u)) == (payload & ~(t == DType::BF16 ? 0u : 0x200u));
          if (t == DType::F16) ok = ok && (bits_of(got) & 0x400000u);  // made quiet
        } else {
          ok = static_cast<double>(got) == want && std::signbit(got) == std::signbit(want);
        }
        if (!ok && bad++ < 5)
          ADD_FAILURE() << dtype_name(t) << " " << convert_isa_name(isa) << ": pattern 0x"
                        << std::hex << i << " -> " << got << " (bits 0x" << bits_of(got)
                        << "), expected " << want;
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

// f32 samples around every 16-bit value v: v, the ties half-way to the next value up, one f32 ulp
// either side of v and of each tie, and the same negated; plus f32 subnormals, huge values and
// NaNs.
std::vector<float> dense_samples(DType t) {
  std::vector<float> xs;
  for (int h = 0; h < 0x8000; ++h) {
    const double v = low_value(t, static_cast<uint16_t>(h));
    if (!std::isfinite(v)) continue;
    const double next = h + 1 < (t == DType::BF16 ? 0x7f80 : 0x7c00)
                            ? low_value(t, static_cast<uint16_t>(h + 1))
                            : 2 * v - low_value(t, static_cast<uint16_t>(h - 1));
    for (double c : {v, (v + next) / 2}) {  // the tie is exact in f32 (one more mantissa bit)
      const float f = static_cast<float>(c);
      for (float s : {f, std::nextafter(f, 0.f), std::nextafter(f, INFINITY)}) {
        xs.push_back(s);
        xs.push_back(-s);
      }
    }
  }
  for (uint32_t b : {0x00000001u, 0x007fffffu, 0x00400000u, 0x7f7fffffu, 0x7f800000u, 0x7f800001u,
                     0x7fc00000u, 0x7fbfffffu, 0xffc12345u, 0x477ff000u, 0x477fefffu, 0x477ff001u})
    xs.push_back(float_of(b));
  std::mt19937 gen(7);
  for (int i = 0; i < 1'000'000; ++i) xs.push_back(float_of(static_cast<uint32_t>(gen())));
  return xs;
}

TEST(Convert, F32ToLowRoundsToNearestEvenOnDenseSamples) {
  for (DType t : {DType::BF16, DType::F16}) {
    const std::vector<float> xs = dense_samples(t);
    for (ConvertIsa isa : isas()) {
      std::vector<uint16_t> out(xs.size());
      convert_floats(isa, DType::F32, xs.data(), t, out.data(), static_cast<int64_t>(xs.size()));
      int64_t bad = 0;
      for (size_t i = 0; i < xs.size(); ++i) {
        uint16_t want;
        if (std::isnan(xs[i])) {  // quiet, sign and top payload bits kept
          const uint32_t b = bits_of(xs[i]);
          want =
              t == DType::BF16
                  ? static_cast<uint16_t>((b >> 16) | 0x40)
                  : static_cast<uint16_t>(((b >> 16) & 0x8000) | 0x7e00 | ((b & 0x7fffff) >> 13));
        } else {
          want = reference_round(t, xs[i]);
        }
        if (out[i] != want && bad++ < 5)
          ADD_FAILURE() << dtype_name(t) << " " << convert_isa_name(isa) << ": " << xs[i]
                        << " (bits 0x" << std::hex << bits_of(xs[i]) << ") -> 0x" << out[i]
                        << ", expected 0x" << want;
      }
      EXPECT_EQ(bad, 0) << dtype_name(t) << " " << convert_isa_name(isa) << " over " << xs.size();
    }
  }
}

TEST(Convert, TensorCastsUseTheKernelsForEveryLengthAndLayout) {
  // Lengths around the vector widths (8, 16) exercise the scalar tails.
  for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 33, 100003}) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<float>(i)) * 1000.f;
    Tensor x = Tensor::from_vector(v, {n});
    for (DType t : {DType::BF16, DType::F16}) {
      Tensor low = x.to(t);
      Tensor back = low.to(DType::F32);
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t want = t == DType::BF16 ? float_to_bf16(v[i]) : float_to_half(v[i]);
        ASSERT_EQ(static_cast<const uint16_t*>(low.raw_data())[i], want) << i;
        const float wb = t == DType::BF16 ? bf16_to_float(want) : half_to_float(want);
        ASSERT_EQ(back.data<float>()[i], wb) << i;
      }
    }
  }
  // A block of columns (rows of unit stride, not contiguous) converts row by row, both ways.
  std::vector<float> wide(6 * 40);
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = std::cos(static_cast<float>(i)) * 3.f;
  Tensor block = Tensor::from_vector(wide, {6, 40}).narrow(1, 3, 33);
  ASSERT_FALSE(block.is_contiguous());
  for (DType t : {DType::BF16, DType::F16}) {
    Tensor low = Tensor::empty({6, 40}, t).narrow(1, 5, 33);
    low.copy_(block);
    Tensor back = Tensor::zeros({6, 40}).narrow(1, 2, 33);
    back.copy_(low);
    for (int64_t r = 0; r < 6; ++r)
      for (int64_t c = 0; c < 33; ++c) {
        const float v = wide[r * 40 + 3 + c];
        const uint16_t h = static_cast<const uint16_t*>(low.raw_data())[r * 40 + c];
        ASSERT_EQ(h, t == DType::BF16 ? float_to_bf16(v) : float_to_half(v)) << r << "," << c;
        ASSERT_EQ(back.data<float>()[r * 40 + c],
                  t == DType::BF16 ? bf16_to_float(h) : half_to_float(h));
      }
  }
  // A transposed (strided) view takes the element-wise path and agrees.
  Tensor m = Tensor::from_vector(std::vector<float>{1.1f, 2.2f, 3.3f, 4.4f, 5.5f, 6.6f}, {2, 3});
  Tensor mt = m.transpose(0, 1).to(DType::BF16).to(DType::F32);
  EXPECT_EQ(mt.to_vector<float>()[1], bf16_to_float(float_to_bf16(4.4f)));
}

}  // namespace
}  // namespace mw
