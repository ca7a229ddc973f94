// Note [Op profile] (op_profile.h).
#include "core/op_profile.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>

#include "core/ops.h"

namespace mw::profile {

namespace {

std::atomic<bool> g_on{false};
std::mutex g_mutex;
std::map<std::string, OpTime>& table() {  // guarded by g_mutex
  static std::map<std::string, OpTime> t;
  return t;
}
thread_local Scope* t_innermost = nullptr;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void enable(bool on) {
  std::lock_guard<std::mutex> lock(g_mutex);
  table().clear();
  g_on.store(on, std::memory_order_relaxed);
}

bool enabled() { return g_on.load(std::memory_order_relaxed); }

std::vector<OpTime> take() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<OpTime> out;
  for (auto& [name, t] : table()) out.push_back(t);
  table().clear();
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
  return out;
}

Scope::Scope(const char* name) {
  if (!enabled()) return;
  active_ = true;
  name_ = name;
  const int64_t now = now_ns(), gemm = ops::gemm_stats().nanoseconds;
  outer_ = t_innermost;
  if (outer_) outer_->pause(now, gemm);
  resume(now, gemm);
  t_innermost = this;
}

Scope::~Scope() {
  if (!active_) return;
  const int64_t now = now_ns(), gemm = ops::gemm_stats().nanoseconds;
  pause(now, gemm);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    OpTime& t = table()[name_];
    t.name = name_;
    ++t.calls;
    t.ms += static_cast<double>(ns_) / 1e6;
    t.gemm_ms += static_cast<double>(gemm_ns_) / 1e6;
  }
  t_innermost = outer_;
  if (outer_) outer_->resume(now, gemm);
}

void Scope::pause(int64_t now_ns, int64_t gemm_ns) {
  ns_ += now_ns - start_ns_;
  gemm_ns_ += gemm_ns - gemm_start_ns_;
}

void Scope::resume(int64_t now_ns, int64_t gemm_ns) {
  start_ns_ = now_ns;
  gemm_start_ns_ = gemm_ns;
}

}  // namespace mw::profile
