// Strict number parsing (numbers.h): a character scan decides whether the text is a number of the
// expected form, then strtoll/strtod convert it with their range errors checked.
#include "core/numbers.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace mw {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// A bound as the refusal prints it: 9 significant digits, so a bound just below 1 (beta's
// nextafter(1.0f, 0)) reads 0.99999994, not a "1" that the refused 1 seems to satisfy.
std::string bound(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", x);
  return text;
}

// Length of the longest prefix of `text` from `pos` that is
// [+-]?digits(.digits?)?([eE][+-]?digits)? (or .digits); 0 when there is none.
// `allow_sign`/`allow_exponent` narrow the form.
size_t decimal_prefix(const std::string& text, bool allow_sign, bool allow_exponent) {
  size_t i = 0, digits = 0;
  if (allow_sign && i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
  while (i < text.size() && is_digit(text[i])) ++i, ++digits;
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && is_digit(text[i])) ++i, ++digits;
  }
  if (digits == 0) return 0;
  if (allow_exponent && i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    size_t j = i + 1, exp_digits = 0;
    if (j < text.size() && (text[j] == '+' || text[j] == '-')) ++j;
    while (j < text.size() && is_digit(text[j])) ++j, ++exp_digits;
    if (exp_digits > 0) i = j;
  }
  return i;
}

}  // namespace

int64_t parse_integer(const std::string& text, const std::string& what, int64_t min, int64_t max) {
  auto refuse = [&](const char* why) {
    return InvalidArgument(
        str(what, " '", text, "': ", why, "; expected an integer in [", min, ", ", max, "]"));
  };
  size_t i = (!text.empty() && (text[0] == '+' || text[0] == '-')) ? 1 : 0;
  if (i == text.size()) throw refuse(text.empty() ? "empty value" : "no digits");
  for (size_t k = i; k < text.size(); ++k)
    if (!is_digit(text[k])) throw refuse("not an integer");
  errno = 0;
  const long long x = std::strtoll(text.c_str(), nullptr, 10);
  if (errno == ERANGE) throw refuse("too large for a 64-bit integer");
  if (x < min || x > max) throw refuse("out of range");
  return x;
}

double parse_real(const std::string& text, const std::string& what, double min, double max) {
  auto refuse = [&](const char* why) {
    return InvalidArgument(str(what, " '", text, "': ", why, "; expected a number in [", bound(min),
                               ", ", bound(max), "]"));
  };
  if (text.empty()) throw refuse("empty value");
  if (decimal_prefix(text, true, true) != text.size()) throw refuse("not a decimal number");
  const double x = std::strtod(text.c_str(), nullptr);
  if (!std::isfinite(x)) throw refuse("too large");
  if (!(x >= min && x <= max)) throw refuse("out of range");
  return x;
}

int64_t parse_bytes(const std::string& text) {
  const char* kForm =
      "expected a non-negative number with an optional unit such as 4GiB, 512MiB, "
      "1.5GB or 4096";
  const size_t n = decimal_prefix(text, false, false);
  MW_CHECK_T(InvalidArgument, n > 0, "byte count '", text, "': ", kForm);
  const double value = std::strtod(text.substr(0, n).c_str(), nullptr);
  const std::string unit = text.substr(n);
  struct Unit {
    const char* name;
    double scale;
  };
  static const Unit kUnits[] = {{"", 1},         {"B", 1},      {"KiB", 0x1p10}, {"K", 0x1p10},
                                {"MiB", 0x1p20}, {"M", 0x1p20}, {"GiB", 0x1p30}, {"G", 0x1p30},
                                {"TiB", 0x1p40}, {"T", 0x1p40}, {"PiB", 0x1p50}, {"P", 0x1p50},
                                {"KB", 1e3},     {"MB", 1e6},   {"GB", 1e9},     {"TB", 1e12},
                                {"PB", 1e15}};
  double scale = 0;
  for (const Unit& u : kUnits)
    if (unit == u.name) scale = u.scale;
  MW_CHECK_T(InvalidArgument, scale > 0, "byte count '", text, "': unknown unit '", unit,
             "'; use B, KiB, MiB, GiB, TiB, PiB, KB, MB, GB, TB or PB");
  const double bytes = value * scale;
  MW_CHECK_T(InvalidArgument, std::isfinite(bytes) && bytes <= static_cast<double>(kMaxParsedBytes),
             "byte count '", text, "' is too large: the limit is 4EiB (2^62 bytes)");
  return static_cast<int64_t>(std::llround(bytes));
}

std::string format_fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

std::string format_thousands(int64_t value) {
  const std::string digits =
      std::to_string(value < 0 ? -static_cast<uint64_t>(value) : static_cast<uint64_t>(value));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return value < 0 ? "-" + out : out;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace mw
