// Strict number parsing (core/numbers.h): every malformed, out-of-range or overflowing text is an
// InvalidArgument naming the option and quoting the text; nothing wraps or escapes as a std error.
#include "core/numbers.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"

namespace mw {
namespace {

template <typename F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Numbers, IntegersAreTheWholeTextInRange) {
  EXPECT_EQ(parse_integer("42", "--n", 0, 100), 42);
  EXPECT_EQ(parse_integer("-7", "--n", -10, 10), -7);
  EXPECT_EQ(parse_integer("+7", "--n", -10, 10), 7);
  EXPECT_EQ(parse_integer("9223372036854775807", "--n", 0, INT64_MAX), INT64_MAX);
  for (const char* bad : {"", " 4", "4 ", "4x", "0x10", "1e3", "4.0", "-", "+", "--4", "abc",
                          "99999999999999999999", "-99999999999999999999", "101", "-1"}) {
    SCOPED_TRACE(bad);
    const std::string why = refusal([&] { parse_integer(bad, "--n", 0, 100); });
    EXPECT_NE(why.find("--n '"), std::string::npos) << why;
    EXPECT_NE(why.find("[0, 100]"), std::string::npos) << why;
  }
  EXPECT_NE(
      refusal([] { parse_integer("99999999999999999999", "--n", 0, INT64_MAX); }).find("too large"),
      std::string::npos);
}

TEST(Numbers, RealsAreFiniteDecimals) {
  EXPECT_EQ(parse_real("1e-3", "--lr", 0, 10), 1e-3);
  EXPECT_EQ(parse_real(".5", "--lr", 0, 10), 0.5);
  EXPECT_EQ(parse_real("2.", "--lr", 0, 10), 2.0);
  for (const char* bad : {"", "nan", "NaN", "inf", "-inf", "1e999", "0x1p3", " 1", "1 ", "1e",
                          "1.2.3", "e5", ".", "-0.1", "11", "1,5"}) {
    SCOPED_TRACE(bad);
    EXPECT_NE(refusal([&] { parse_real(bad, "--lr", 0, 10); }).find("--lr '"), std::string::npos);
  }
  // The bounds print exactly enough to be read: --beta1 1 was refused with "expected a number in
  // [0, 1]" when the bound was the float below 1.
  const double below_one = std::nextafter(1.0f, 0.0f);
  const std::string why = refusal([&] { parse_real("1", "--beta1", 0, below_one); });
  EXPECT_NE(why.find("[0, 0.99999994]"), std::string::npos) << why;
  EXPECT_NE(refusal([] { parse_real("1", "--eps", 1e-30, 0.5); }).find("[1e-30, 0.5]"),
            std::string::npos);
}

TEST(Numbers, ByteSizesRefuseGarbageAndOverflowInsteadOfWrapping) {
  EXPECT_EQ(parse_bytes("4096"), 4096);
  EXPECT_EQ(parse_bytes("1.5KiB"), 1536);
  EXPECT_EQ(parse_bytes("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(parse_bytes("1GB"), 1000000000);
  EXPECT_EQ(parse_bytes("4PiB"), int64_t{4} << 50);
  EXPECT_EQ(parse_bytes("0"), 0);
  // The two aborts and the wrap of issue #17: "." threw std::invalid_argument out of std::stod,
  // "99999999999PiB" became a negative capacity.
  for (const char* bad : {".", "", "-1", "-1GiB", "1.2.3G", "1e3", "GiB", "4 GiB", "4gib", "4XB",
                          "99999999999PiB", "99999999999999999999999", "8EiB", "1e400"}) {
    SCOPED_TRACE(bad);
    const std::string why = refusal([&] { parse_bytes(bad); });
    EXPECT_NE(why.find("byte count '"), std::string::npos) << why;
  }
  EXPECT_NE(refusal([] { parse_bytes("99999999999PiB"); }).find("too large"), std::string::npos);
}

}  // namespace
}  // namespace mw
