// Chrome trace JSON writer (trace.h).
#include "offload/gemini/trace.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "core/error.h"

namespace mw::gemini {

int64_t Trace::now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Trace::now_us() const { return static_cast<double>(now_ns() - t0_ns_) / 1e3; }

void Trace::slice(const std::string& name, const char* category, double ts_us, double dur_us,
                  int thread) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back({name, category, 'X', ts_us, dur_us, thread, 0});
}

void Trace::counter(const std::string& name, double ts_us, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back({name, "memory", 'C', ts_us, 0, 0, bytes});
}

void Trace::write(const std::string& path) const {
  // Missing directories are created, as gpt2_train's check before the run promised
  // (data::check_output_path); a failure to create them is reported by the open.
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    const int err = errno;
    throw IoError(str("--trace '", path, "' cannot be written: ", errno_text(err),
                      "; pass a path in a writable directory"),
                  path, 0, 0, err);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  std::fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
  for (size_t i = 0; i < events_.size(); ++i) {
    const Event& e = events_[i];
    std::string name;  // names are module paths and fixed words: escape quotes and backslashes
    for (char c : e.name)
      name += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    if (e.phase == 'C')
      std::fprintf(f,
                   "{\"name\": \"%s\", \"ph\": \"C\", \"ts\": %.3f, \"pid\": 1, \"args\": "
                   "{\"bytes\": %lld}}",
                   name.c_str(), e.ts_us, static_cast<long long>(e.value));
    else
      std::fprintf(f,
                   "{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": "
                   "%.3f, \"pid\": 1, \"tid\": %d}",
                   name.c_str(), e.category, e.ts_us, e.dur_us, e.thread);
    std::fprintf(f, "%s\n", i + 1 < events_.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  const bool ok = std::ferror(f) == 0;
  if (std::fclose(f) != 0 || !ok)
    throw IoError(str("--trace '", path, "': writing failed: ", errno_text(errno)), path, 0, 0,
                  errno);
}

}  // namespace mw::gemini
