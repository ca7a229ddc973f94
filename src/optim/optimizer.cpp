// Optimizer base and the reference AdamW (optimizer.h).
#include "optim/optimizer.h"

#include "autograd/autograd.h"
#include "optim/adam_cpu.h"

namespace mw::optim {

void Optimizer::zero_grad() {
  for (auto& p : params_) mw::zero_grad(p);
}

AdamW::AdamW(std::vector<Tensor> params, AdamHyper hyper)
    : Optimizer(std::move(params)), hyper_(hyper) {
  for (auto& p : params_) {
    MW_CHECK_T(InvalidArgument, p.dtype() == DType::F32 && p.is_contiguous(),
               "AdamW: parameters must be contiguous f32, got ", p.desc());
    MW_CHECK_T(InvalidArgument, p.device().is_host_addressable(), "AdamW runs on the host; ",
               p.desc(), " needs HybridAdam's CUDA kernel");
  }
  exp_avg_.resize(params_.size());
  exp_avg_sq_.resize(params_.size());
}

void AdamW::step() {
  ++step_;
  const AdamStepScalars s = make_adam_step_scalars(hyper_, step_, div_scale_);
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = grad(p);
    if (!g.defined())
      continue;  // a parameter that got no gradient is not stepped (torch semantics)
    if (!exp_avg_[i].defined()) {
      exp_avg_[i] = Tensor::zeros(p.shape(), DType::F32, p.device());
      exp_avg_sq_[i] = Tensor::zeros(p.shape(), DType::F32, p.device());
    }
    Tensor gc = g.contiguous();
    p.bump_version();
    adam_update_parallel(Isa::Scalar, s, p.data<float>(), gc.raw_data(), gc.dtype(),
                         exp_avg_[i].data<float>(), exp_avg_sq_[i].data<float>(), p.numel());
  }
}

int64_t AdamW::state_bytes_in_memory() const {
  int64_t n = 0;
  for (size_t i = 0; i < exp_avg_.size(); ++i)
    if (exp_avg_[i].defined()) n += exp_avg_[i].nbytes() + exp_avg_sq_[i].nbytes();
  return n;
}

}  // namespace mw::optim
