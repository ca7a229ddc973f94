// A Chrome/Perfetto trace (the JSON "traceEvents" format): counter tracks of bytes per tier and
// slices for ops, chunk moves, evictions and prefetch waits, so one step can be opened in Perfetto
// (ui.perfetto.dev) or chrome://tracing. tools/gemini_trace_svg.py turns it into an SVG plot.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace mw::gemini {

class Trace {
 public:
  // Microseconds since the trace began.
  double now_us() const;
  // A complete slice [ts, ts + dur) on track `thread` (0 = the compute thread).
  void slice(const std::string& name, const char* category, double ts_us, double dur_us,
             int thread = 0);
  // A counter sample: the value of series `name` from ts on.
  void counter(const std::string& name, double ts_us, int64_t bytes);
  // Writes {"traceEvents": [...]}; IoError when the file cannot be written.
  void write(const std::string& path) const;
  size_t size() const { return events_.size(); }

 private:
  struct Event {
    std::string name;
    const char* category;
    char phase;  // 'X' slice, 'C' counter
    double ts_us, dur_us;
    int thread;
    int64_t value;
  };
  mutable std::mutex mutex_;
  std::vector<Event> events_;
  int64_t t0_ns_ = now_ns();
  static int64_t now_ns();
};

}  // namespace mw::gemini
