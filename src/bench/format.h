// The benchmarks' report lines: printf-style formatting into a string, and the sink a benchmark
// writes its lines to as they happen (the apps print them; tests collect them); and the quoting of
// the paths they put into the shell commands of their peers (fio, the PyTorch script).
#pragma once

#include <functional>
#include <string>

namespace mw::bench {

// printf's formatting, into a string.
std::string strprintf(const char* format, ...) __attribute__((format(printf, 1, 2)));

// `text` as one shell word: in single quotes, each ' written as '\''. A directory with a space or a
// `$` in its name reaches fio or python as that name, not as two words or an expansion.
std::string shell_quote(const std::string& text);

// Receives each report line (or part of one) as soon as it is known.
using LineSink = std::function<void(const std::string&)>;

}  // namespace mw::bench
