// Block sums of squares for the global gradient norm (grad_norm.h, Note [Norm order]).
#include "optim/grad_norm.h"

#include "core/parallel.h"

namespace mw::optim {

void append_block_squares(const float* x, int64_t n, std::vector<double>& partials) {
  for (double part : parallel_reduce_blocks<double>(n, kNormBlock, [&](int64_t b, int64_t e) {
         double s = 0;
         for (int64_t i = b; i < e; ++i) s += static_cast<double>(x[i]) * x[i];
         return s;
       }))
    partials.push_back(part);
}

double add_in_order(double sum, const std::vector<double>& partials) {
  for (double part : partials) sum += part;
  return sum;
}

}  // namespace mw::optim
