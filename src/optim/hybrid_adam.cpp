// HybridAdam without offload (hybrid_adam.h).
#include "optim/hybrid_adam.h"

#include "autograd/autograd.h"
#include "optim/adam_cuda.h"

namespace mw::optim {

HybridAdam::HybridAdam(std::vector<Tensor> params, HybridAdamOptions options)
    : Optimizer(std::move(params)), options_(options), isa_(best_isa()) {
  for (auto& p : params_)
    MW_CHECK_T(InvalidArgument, p.dtype() == DType::F32 && p.is_contiguous(),
               "HybridAdam: parameters must be contiguous f32 (fp32 master weights), got ", p.desc());
  exp_avg_.resize(params_.size());
  exp_avg_sq_.resize(params_.size());
}

void HybridAdam::step() {
  ++step_;
  const AdamStepScalars s = make_adam_step_scalars(options_.hyper, step_, options_.div_scale);
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = grad(p);
    if (!g.defined()) continue;
    if (!exp_avg_[i].defined()) {
      exp_avg_[i] = Tensor::zeros(p.shape(), DType::F32, p.device());
      exp_avg_sq_[i] = Tensor::zeros(p.shape(), DType::F32, p.device());
    }
    Tensor gc = g.contiguous();
    p.bump_version();
    if (p.device().is_cuda())
      adam_update_cuda(s, p.data<float>(), gc.raw_data(), gc.dtype(), exp_avg_[i].data<float>(),
                       exp_avg_sq_[i].data<float>(), p.numel(), nullptr);
    else
      adam_update_parallel(isa_, s, p.data<float>(), gc.raw_data(), gc.dtype(),
                           exp_avg_[i].data<float>(), exp_avg_sq_[i].data<float>(), p.numel());
  }
}

int64_t HybridAdam::state_bytes_in_memory() const {
  int64_t n = 0;
  for (size_t i = 0; i < exp_avg_.size(); ++i)
    if (exp_avg_[i].defined()) n += exp_avg_[i].nbytes() + exp_avg_sq_[i].nbytes();
  return n;
}

}  // namespace mw::optim
