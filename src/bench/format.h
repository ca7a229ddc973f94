// The benchmarks' report lines: printf-style formatting into a string, and the sink a benchmark
// writes its lines to as they happen (the apps print them; tests collect them).
#pragma once

#include <functional>
#include <string>

namespace mw::bench {

// printf's formatting, into a string.
std::string strprintf(const char* format, ...) __attribute__((format(printf, 1, 2)));

// Receives each report line (or part of one) as soon as it is known.
using LineSink = std::function<void(const std::string&)>;

}  // namespace mw::bench
