// Byte arithmetic shared by the memory plan (memory_plan.cpp) and its check against the machine
// (memory_check.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

namespace mw::train::plan_bytes {

inline double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// "1234.5 MiB", fixed-point whatever the size.
inline std::string mib_text(int64_t bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%.1f MiB", mib(bytes));
  return text;
}

// Byte counts past 2^60 (1 EiB) are clamped there: they fit nowhere, and sums of a few stay in
// range.
inline int64_t clamp_bytes(double bytes) {
  return static_cast<int64_t>(std::min(bytes, 1152921504606846976.0));
}

}  // namespace mw::train::plan_bytes
