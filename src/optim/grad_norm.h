// The global gradient norm's arithmetic, shared by the Trainer (every parameter's .grad) and
// Gemini (gradients inside chunk buffers, possibly on disk), so both sum in one order.
//
// Note [Norm order]: the squared L2 norm is summed in double over fixed blocks of kNormBlock
// elements of each parameter (a block never spans two parameters), the blocks reduced in parallel
// and their partials added in block order, then the parameters in parameter order. The result
// depends only on the gradients and the parameter order, never on the thread count or on where
// a gradient lives, so a run whose gradients sit in chunks gives the plain run's norm bit for bit.
#pragma once

#include <cstdint>
#include <vector>

namespace mw::optim {

constexpr int64_t kNormBlock = int64_t{1} << 16;

// Appends the sum of squares (in double) of each kNormBlock block of x[0, n) to `partials`.
void append_block_squares(const float* x, int64_t n, std::vector<double>& partials);

// Adds partials to sum in order (Note [Norm order]).
double add_in_order(double sum, const std::vector<double>& partials);

}  // namespace mw::optim
