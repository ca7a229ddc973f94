// Strict parsing of numbers typed by a user (command-line options, byte sizes), and the two
// formatters the apps print numbers with.
//
// Invariants: the whole text must be the number (no leading or trailing spaces, no trailing
// garbage, no empty text); a value outside [min, max], or one that does not fit int64 / a finite
// double, is refused, never wrapped or clamped. Every refusal is an InvalidArgument whose message
// names `what` (e.g. "--batch"), quotes the text and says what was expected. Nothing here lets a
// standard-library exception (std::invalid_argument, std::out_of_range) escape.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mw {

// A base-10 integer, optionally signed, in [min, max].
int64_t parse_integer(const std::string& text, const std::string& what, int64_t min, int64_t max);
// A finite decimal number (no nan/inf, no hex) in [min, max].
double parse_real(const std::string& text, const std::string& what, double min, double max);
// A non-negative byte count with an optional unit: B, KiB/K, MiB/M, GiB/G, TiB/T, PiB/P (powers of
// 1024) or KB, MB, GB, TB, PB (powers of 1000); "1.5GiB" allowed. Refused past 2^62 bytes (4 EiB),
// far beyond any memory or disk yet well inside int64 for the sums callers make.
int64_t parse_bytes(const std::string& text);
inline constexpr int64_t kMaxParsedBytes = int64_t{1} << 62;

// "%.{decimals}f": format_fixed(0.1157, 3) == "0.116".
std::string format_fixed(double value, int decimals);
// Digits grouped by commas: format_thousands(124439808) == "124,439,808".
std::string format_thousands(int64_t value);
// The median of a sample (0 for an empty one): benchmarks report medians, machines here are noisy.
double median(std::vector<double> values);

}  // namespace mw
