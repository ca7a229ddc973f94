// A tiny logger for the I/O engine: one line per message on stderr, prefixed "[memwall io]".
//
// Invariant: the I/O layer logs only decisions a user must know about (which backend was chosen and
// why; O_DIRECT refused and what that costs), never per request. Tests can capture lines with
// set_log_sink(); passing an empty function restores stderr.
#pragma once

#include <functional>
#include <string>

namespace mw::io {

enum class LogLevel { kInfo, kWarning };

void log(LogLevel level, const std::string& message);
inline void log_info(const std::string& message) { log(LogLevel::kInfo, message); }
inline void log_warning(const std::string& message) { log(LogLevel::kWarning, message); }

// Test hook: route log lines to `sink` instead of stderr (thread-safe). Returns the previous sink.
using LogSink = std::function<void(LogLevel, const std::string&)>;
LogSink set_log_sink(LogSink sink);

}  // namespace mw::io
