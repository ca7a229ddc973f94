// DynamicLossScaler (Note [Dynamic loss scaling], loss_scaler.h).
#include "optim/loss_scaler.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "autograd/autograd.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "optim/grad_norm.h"
#include "optim/hybrid_adam.h"

namespace mw::optim {

namespace {
// Gradients are checked and unscaled by slices of at most kSlice elements, so that the
// temporaries (the host copy the check reads, the scaled values) stay small whatever the largest
// gradient. Whole, GPT-2 small's wte gradient made 147 MiB of each, on the host and on the device:
// `--precision fp16 --device sim` peaked at 1097 MiB on both against 949.6 MiB planned.
constexpr int64_t kSlice = int64_t{1} << 22;  // 16 MiB of f32

// The gradient as slices of at most kSlice elements (a non-contiguous one whole).
std::vector<Tensor> slices(const Tensor& g) {
  if (!g.is_contiguous() || g.numel() <= kSlice) return {g};
  const Tensor flat = g.view({-1});
  std::vector<Tensor> out;
  for (int64_t at = 0; at < flat.numel(); at += kSlice)
    out.push_back(flat.narrow(0, at, std::min(kSlice, flat.numel() - at)));
  return out;
}

bool all_finite(const Tensor& g) {
  if (g.device().is_cuda() && g.dtype() == DType::F32 && g.is_contiguous()) {
    // On the device: a float's square is finite in double, so the block sums of squares are
    // finite exactly when every element is (only the partials cross to the host).
    std::vector<double> parts;
    append_block_squares(g, parts);
    return std::all_of(parts.begin(), parts.end(), [](double s) { return std::isfinite(s); });
  }
  // Read in place where the host can (cpu, sim): a copy made a gradient-sized host transient the
  // memory plan does not count (a model with a 5000-token vocabulary under --precision fp16 on
  // sim, the host 13 MiB against 10.6 planned).
  Tensor h = g.device().is_host_addressable() ? g : g.to(Device::cpu());
  if (h.dtype() != DType::F32) h = h.to(DType::F32);
  h = h.contiguous();
  const float* p = h.data<float>();
  std::atomic<bool> finite{true};
  parallel_for(h.numel(), 1 << 16, [&](int64_t b, int64_t e) {
    bool ok = true;
    for (int64_t i = b; i < e; ++i) ok &= std::isfinite(p[i]);
    if (!ok) finite.store(false, std::memory_order_relaxed);
  });
  return finite.load();
}
}  // namespace

bool is_power_of_two(double x) {
  int exponent = 0;
  return std::isfinite(x) && x > 0 && std::frexp(x, &exponent) == 0.5;
}

DynamicLossScaler::DynamicLossScaler(LossScalerOptions options, int64_t ranks) : options_(options) {
  MW_CHECK_T(InvalidArgument, ranks >= 1, "loss scaler: ranks must be >= 1; got ", ranks);
  while (rank_divisor_ < static_cast<double>(ranks)) rank_divisor_ *= 2;
  MW_CHECK_T(InvalidArgument,
             options.initial_scale > 0 && options.growth >= 1 && options.backoff > 0 &&
                 options.backoff < 1 && options.growth_interval > 0 && options.hysteresis > 0,
             "loss scaler: expected initial_scale > 0, growth >= 1, 0 < backoff < 1, "
             "growth_interval > 0 and hysteresis > 0");
  MW_CHECK_T(InvalidArgument,
             is_power_of_two(options.initial_scale) && is_power_of_two(options.growth) &&
                 is_power_of_two(options.backoff),
             "loss scaler: the initial scale (", options.initial_scale, "), growth (",
             options.growth, ") and backoff (", options.backoff,
             ") must be powers of two (Note [Dynamic loss scaling])");
  state_.scale = options.initial_scale;
  state_.hysteresis_left = options.hysteresis;
}

Tensor DynamicLossScaler::backward_seed(const Tensor& loss) const {
  return Tensor::full(loss.shape(), gradient_scale(), loss.dtype(), loss.device());
}

bool DynamicLossScaler::unscale_and_check(const std::vector<Tensor>& params) {
  for (const Tensor& p : params) {
    Tensor g = grad(p);
    if (!g.defined()) continue;
    for (const Tensor& s : slices(g))
      if (!all_finite(s)) return false;
  }
  const double inverse = 1.0 / gradient_scale();
  for (const Tensor& p : params) {
    Tensor g = grad(p);
    if (!g.defined()) continue;
    for (Tensor s : slices(g)) s.copy_(ops::affine_scalar(s, inverse, 0.0));
  }
  return true;
}

void DynamicLossScaler::update(bool found_inf) {
  if (found_inf) {
    ++state_.skipped_steps;
    state_.growth_tracker = 0;
    if (--state_.hysteresis_left <= 0)
      state_.scale = std::max(state_.scale * options_.backoff, options_.min_scale);
    return;
  }
  if (++state_.growth_tracker == options_.growth_interval) {
    state_.growth_tracker = 0;
    state_.hysteresis_left = options_.hysteresis;
    // Never lowered by a growth: a start above max_scale (--initial-loss-scale 2^30) was cut to
    // 2^24 by its first growth (ColossalAI's min(scale x 2, max) does the same).
    state_.scale =
        std::max(state_.scale, std::min(state_.scale * options_.growth, options_.max_scale));
  }
}

bool DynamicLossScaler::step(Optimizer& opt) {
  if (const auto* hybrid = dynamic_cast<const HybridAdam*>(&opt))
    MW_CHECK_T(
        InvalidArgument, !hybrid->updates_in_backward(),
        "fp16 loss scaling skips steps whose gradients overflow, but this HybridAdam updates "
        "parameters inside backward, before every gradient is known; turn "
        "update_in_backward and nvme.overlap_backward off (gpt2_train does for --precision "
        "fp16)");
  const bool finite = unscale_and_check(opt.params());
  if (finite)
    opt.step();
  else
    opt.zero_grad();
  update(!finite);
  return finite;
}

void DynamicLossScaler::load_state(const LossScalerState& state) {
  MW_CHECK_T(InvalidArgument,
             std::isfinite(state.scale) && state.scale > 0 && state.growth_tracker >= 0 &&
                 state.skipped_steps >= 0,
             "loss scaler state: expected a finite scale > 0 and counters >= 0, got scale ",
             state.scale, ", growth_tracker ", state.growth_tracker, ", skipped_steps ",
             state.skipped_steps);
  state_ = state;
}

}  // namespace mw::optim
