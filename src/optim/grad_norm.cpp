// Block sums of squares for the global gradient norm (grad_norm.h, Note [Norm order]).
#include "optim/grad_norm.h"

#include <cmath>

#include "autograd/autograd.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/tensor.h"

namespace mw::optim {

namespace {
// One block's sum of squares in the warp order of Note [Norm order].
double block_squares(const float* x, int64_t n) {
  double lane[kNormLanes] = {};
  int64_t i = 0;
  for (; i + kNormLanes <= n; i += kNormLanes)
    for (int l = 0; l < kNormLanes; ++l) lane[l] += static_cast<double>(x[i + l]) * x[i + l];
  for (int l = 0; i + l < n; ++l) lane[l] += static_cast<double>(x[i + l]) * x[i + l];
  double s = 0;
  for (double v : lane) s += v;
  return s;
}
}  // namespace

void append_block_squares(const float* x, int64_t n, std::vector<double>& partials) {
  for (double part : parallel_reduce_blocks<double>(
           n, kNormBlock, [&](int64_t b, int64_t e) { return block_squares(x + b, e - b); }))
    partials.push_back(part);
}

void append_block_squares(const Tensor& x, std::vector<double>& partials) {
  MW_CHECK_T(InvalidArgument, x.dtype() == DType::F32 && x.is_contiguous(),
             "append_block_squares: expected a contiguous f32 tensor, got ", dtype_name(x.dtype()),
             x.is_contiguous() ? "" : " (not contiguous)");
  if (!x.device().is_cuda()) {
    append_block_squares(x.data<float>(), x.numel(), partials);
    return;
  }
  const int64_t blocks = (x.numel() + kNormBlock - 1) / kNormBlock;
  if (blocks == 0) return;
  Tensor parts = Tensor::empty({blocks}, DType::F64, x.device());
  block_squares_cuda(x.data<float>(), x.numel(), parts.data<double>(), nullptr);
  parts = parts.to(Device::cpu());  // waits for the kernel on the compute stream
  const double* p = parts.data<double>();
  partials.insert(partials.end(), p, p + blocks);
}

double add_in_order(double sum, const std::vector<double>& partials) {
  for (double part : partials) sum += part;
  return sum;
}

void append_grad_block_squares(const Tensor& param, std::vector<double>& partials) {
  const Tensor g = grad(param);
  if (g.defined()) append_block_squares(g.contiguous(), partials);
}

double global_grad_norm(const std::vector<Tensor>& params) {
  double sum_sq = 0;
  std::vector<double> parts;
  for (const Tensor& p : params) {
    parts.clear();
    append_grad_block_squares(p, parts);
    sum_sq = add_in_order(sum_sq, parts);
  }
  return std::sqrt(sum_sq);
}

}  // namespace mw::optim
