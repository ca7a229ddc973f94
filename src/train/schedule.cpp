// Learning-rate schedules: the formulas of Note [LR schedule] (schedule.h).
#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace mw::train {

LrScheduleKind parse_lr_schedule(const std::string& text) {
  if (text == "constant") return LrScheduleKind::kConstant;
  if (text == "cosine") return LrScheduleKind::kCosine;
  if (text == "linear") return LrScheduleKind::kLinear;
  throw InvalidArgument(
      str("learning-rate schedule '", text, "': expected constant|cosine|linear"));
}

const char* lr_schedule_name(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kConstant: return "constant";
    case LrScheduleKind::kCosine: return "cosine";
    case LrScheduleKind::kLinear: return "linear";
  }
  return "?";
}

double LrSchedule::lr_at(int64_t step) const {
  if (step < warmup_steps)
    return base_lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
  const double decay_steps = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  const double since_warmup = static_cast<double>(step - warmup_steps);
  switch (kind) {
    case LrScheduleKind::kConstant: return base_lr;
    case LrScheduleKind::kLinear: {
      const double factor = std::max(0.0, (decay_steps - since_warmup) / decay_steps);
      return min_lr + (base_lr - min_lr) * factor;
    }
    case LrScheduleKind::kCosine: {
      const double progress = std::min(1.0, since_warmup / decay_steps);
      return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
    }
  }
  return base_lr;
}

}  // namespace mw::train
