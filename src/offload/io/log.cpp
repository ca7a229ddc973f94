// Logger of log.h: a mutex-protected sink, stderr by default.
#include "offload/io/log.h"

#include <cstdio>
#include <mutex>

namespace mw::io {

namespace {
std::mutex& sink_mutex() {
  static std::mutex mutex;
  return mutex;
}
LogSink& sink() {
  static LogSink s;
  return s;
}
}  // namespace

void log(LogLevel level, const std::string& message) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  if (sink()) {
    sink()(level, message);
    return;
  }
  std::fprintf(stderr, "[memwall io] %s%s\n", level == LogLevel::kWarning ? "warning: " : "",
               message.c_str());
}

LogSink set_log_sink(LogSink new_sink) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  LogSink old = std::move(sink());
  sink() = std::move(new_sink);
  return old;
}

}  // namespace mw::io
