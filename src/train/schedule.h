// Learning-rate schedules, as HuggingFace transformers defines them (optimization.py), with a
// floor.
//
// Note [LR schedule]: `step` is the 0-based index of the optimizer update about to be made (HF's
// LambdaLR calls lr_lambda(0) for the first update). With W = warmup_steps, N = total_steps,
// base = --lr and min = --min-lr:
//   warmup (step < W):  lr = base * step / W                 (linear from 0, all kinds)
//   constant:           lr = base
//   linear:             lr = min + (base - min) * max(0, (N - step) / max(1, N - W))
//   cosine:             lr = min + (base - min) * 0.5 * (1 + cos(pi * p)),
//                       p = min(1, (step - W) / max(1, N - W))
// With min = 0, linear is get_linear_schedule_with_warmup and cosine
// get_cosine_schedule_with_warmup (num_cycles 0.5); with min > 0, cosine is
// get_cosine_with_min_lr_schedule_with_warmup. The arithmetic is in double; the optimizer receives
// the float nearest to it.
#pragma once

#include <cstdint>
#include <string>

namespace mw::train {

enum class LrScheduleKind { kConstant, kCosine, kLinear };
// "constant" | "cosine" | "linear"; InvalidArgument otherwise.
LrScheduleKind parse_lr_schedule(const std::string& text);
const char* lr_schedule_name(LrScheduleKind kind);

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  double base_lr = 1e-3;
  double min_lr = 0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  // The learning rate of update `step` (Note [LR schedule]).
  double lr_at(int64_t step) const;
};

}  // namespace mw::train
