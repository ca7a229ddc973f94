// Auto's and const's plan from the warmup iteration (Note [OPT eviction], placement.h).
#include <algorithm>
#include <cstdio>

#include "core/allocator.h"
#include "offload/gemini/gemini.h"

namespace mw::gemini {

namespace {
double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }
}  // namespace

// Per op, the device bytes chunks may take (the capacity less the margin, the op's measured
// non-model reserve and what is homed there for good), and the lower bound of any schedule.
void Gemini::build_plan() {
  next_ = std::make_unique<NextUse>(trace_, static_cast<int>(chunks_.size()));
  const int64_t n = static_cast<int64_t>(trace_.size());
  const int64_t capacity = allocator_for(options_.device).stats().capacity_bytes;
  avail_.assign(static_cast<size_t>(n), INT64_MAX);
  lower_bound_bytes_ = 0;
  for (int64_t t = 0; t < n; ++t) {
    int64_t own = 0;
    for (int c : trace_[static_cast<size_t>(t)].chunks)
      own += planned_copy_bytes(*chunks_[static_cast<size_t>(c)]);
    if (options_.policy == Policy::kConst) {
      avail_[static_cast<size_t>(t)] = options_.const_budget_bytes;
    } else {
      const int64_t reserve = nonmodel_.at(static_cast<size_t>(t));
      const int64_t resident = device_home_bytes_ + device_state_bytes_;
      lower_bound_bytes_ = std::max(lower_bound_bytes_, reserve + own + resident);
      if (capacity > 0)
        avail_[static_cast<size_t>(t)] =
            static_cast<int64_t>(static_cast<double>(capacity) * (1.0 - margin_)) - reserve -
            resident;
    }
  }
  if (options_.verbose && options_.policy == Policy::kAuto) {
    std::vector<int64_t> bytes;
    for (auto& c : chunks_) bytes.push_back(planned_copy_bytes(*c));
    const PlanResult plan = plan_opt(trace_, bytes, avail_);
    std::printf(
        "gemini auto: %lld ops recorded; lower bound %.1f MiB (largest op's non-model memory + "
        "its chunks) of %.1f MiB capacity, margin %.0f%%; plan: %.1f MiB host->device per "
        "iteration, %lld evictions%s\n",
        static_cast<long long>(n), mib(lower_bound_bytes_), mib(capacity), 100 * margin_,
        mib(plan.load_bytes), static_cast<long long>(plan.evictions),
        plan.fits ? "" : " (some ops exceed the reserve: minimal residency there)");
  }
}

}  // namespace mw::gemini
