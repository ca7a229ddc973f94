// The dynamic loss scaler of fp16 training (Megatron-LM's and ColossalAI's DynamicGradScaler;
// PyTorch's GradScaler without hysteresis).
//
// Note [Dynamic loss scaling]: fp16 gradients underflow below 2^-24, so the loss is multiplied by
// scale() before backward and the gradients divided by it before the update. A scale too large
// overflows some gradient to inf/nan; that step is then skipped: no parameter changes (every
// gradient is checked before any is used, so the optimizer must not update inside backward) and
// the gradients are dropped. State and rules:
//  - scale starts at 2^16; growth_tracker counts consecutive good steps, hysteresis_left starts at
//    `hysteresis` (2);
//  - an overflowing step: growth_tracker = 0, hysteresis_left -= 1, and once it is <= 0 the scale
//    is multiplied by backoff (0.5; not below min_scale). hysteresis_left is not refilled by the
//    backoff, so further overflows back off at once until the scale grows again;
//  - a good step: growth_tracker += 1; at growth_interval (1000): scale *= growth (2; not above
//    max_scale), growth_tracker = 0, hysteresis_left = hysteresis.
// The scale, growth and backoff are powers of two, so multiplying by the scale and dividing by it
// are exact, and Gemini's one division by K x scale rounds as unscaling then dividing by K does
// (Note [Loss scaling under Gemini], train/trainer.cpp). A start of 1e6 broke that: Gemini's
// gradient norm differed from the plain run's in the 9th digit (tools/auto_sweep.py bitwise,
// session 38), so a scale that is not a power of two is refused.
//
// Note [Loss scale over ranks]: under data parallel each rank's loss is the mean over its B/N
// rows, and the reduction divides the sum of the ranks' gradients by N after backward. Seeded with
// the scale, a rank's fp16 activation gradients were N times one process's, so they overflowed at
// an N times lower scale: 2 ranks skipped a step one process kept and ended at half its scale (4
// ranks: a quarter; losses 5.4e-3 apart where fp32 runs agree to 2e-7). The seed is now
// gradient_scale() = scale() / D, D the smallest power of two >= N (kept a power of two for the
// exactness above), and unscaling divides by the same: at 2, 4, 8 ranks each rank's activation
// gradients are one process's, and the skips are its; at 3 ranks they are 3/4 of it. The schedule
// (scale(), printed and saved) is one process's.
// bf16 has f32's exponent range and needs no scaler.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "optim/optimizer.h"

namespace mw::optim {

// True when x is 2^k for an integer k (the scale and its factors must be).
bool is_power_of_two(double x);

struct LossScalerOptions {
  double initial_scale = 65536.0;
  double growth = 2.0;
  double backoff = 0.5;
  int64_t growth_interval = 1000;
  int64_t hysteresis = 2;
  double min_scale = 1.0;
  double max_scale = 16777216.0;  // 2^24
};

// Everything a checkpoint must keep to resume the same scale schedule.
struct LossScalerState {
  double scale = 65536.0;
  int64_t growth_tracker = 0;
  int64_t hysteresis_left = 2;
  int64_t skipped_steps = 0;
};

class DynamicLossScaler {
 public:
  // `ranks`: the data-parallel processes that each backward their share (Note [Loss scale over
  // ranks]).
  explicit DynamicLossScaler(LossScalerOptions options = {}, int64_t ranks = 1);
  double scale() const { return state_.scale; }
  // What the loss's gradients carry: scale() / the ranks' power of two (scale() in one process).
  double gradient_scale() const { return state_.scale / rank_divisor_; }
  // The seed gradient for backward: d(gradient_scale() * loss)/d(loss), a scalar like `loss`.
  Tensor backward_seed(const Tensor& loss) const;
  // Checks every defined gradient of `params` for inf/nan; when all are finite, divides them by
  // gradient_scale() in place (exact: a power of two) and returns true. Returns false otherwise
  // and leaves them as they were.
  bool unscale_and_check(const std::vector<Tensor>& params);
  // Advances the schedule after a step that found_inf or not.
  void update(bool found_inf);
  // The whole fp16 step: unscale_and_check, then opt.step() when finite, else opt.zero_grad()
  // (skipped); then update(). Returns whether the optimizer stepped.
  bool step(Optimizer& opt);

  LossScalerState state() const { return state_; }
  // Restores state(); InvalidArgument for a non-positive or non-finite scale or negative counters.
  void load_state(const LossScalerState& state);
  const LossScalerOptions& options() const { return options_; }

 private:
  LossScalerOptions options_;
  LossScalerState state_;
  double rank_divisor_ = 1;
};

}  // namespace mw::optim
