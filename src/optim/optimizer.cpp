// Optimizer base and the reference AdamW (optimizer.h).
#include "optim/optimizer.h"

#include "autograd/autograd.h"
#include "optim/adam_cpu.h"
#include "optim/adam_state_file.h"

namespace mw::optim {

void Optimizer::zero_grad() {
  for (auto& p : params_) mw::zero_grad(p);
}

AdamW::AdamW(std::vector<Tensor> params, AdamHyper hyper, std::vector<NoDecayRanges> no_decay)
    : Optimizer(std::move(params)), hyper_(hyper), no_decay_(std::move(no_decay)) {
  MW_CHECK_T(InvalidArgument, no_decay_.empty() || no_decay_.size() == params_.size(),
             "AdamW: ", no_decay_.size(), " no-decay range lists for ", params_.size(),
             " parameters");
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
    adam_update_ranged(Isa::Scalar, s, no_decay_of(no_decay_, i), p.data<float>(), gc.raw_data(),
                       gc.dtype(), exp_avg_[i].data<float>(), exp_avg_sq_[i].data<float>(),
                       p.numel());
  }
}

int64_t AdamW::state_bytes_in_memory() const {
  int64_t n = 0;
  for (size_t i = 0; i < exp_avg_.size(); ++i)
    if (exp_avg_[i].defined()) n += exp_avg_[i].nbytes() + exp_avg_sq_[i].nbytes();
  return n;
}

void AdamW::save_state(const std::string& path) const {
  AdamStateWriter w(path);
  w.put(kAdamStateMagic, 8);
  w.put_i64(step_);
  w.put_i64(static_cast<int64_t>(params_.size()));
  for (size_t i = 0; i < params_.size(); ++i) {  // one segment per stepped parameter
    w.put_i64(params_[i].numel());
    w.put_i64(exp_avg_[i].defined() ? 1 : 0);
    if (!exp_avg_[i].defined()) continue;
    w.put_i64(0);
    w.put_i64(params_[i].numel());
    w.put_i64(step_);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!exp_avg_[i].defined()) continue;
    w.put(exp_avg_[i].raw_data(), exp_avg_[i].nbytes());
    w.put(exp_avg_sq_[i].raw_data(), exp_avg_sq_[i].nbytes());
  }
  w.close();
}

void AdamW::load_state(const std::string& path, const StateFileMap* map) {
  StateFileRanges file(path, params_, map);
  const int64_t step = file.step();
  std::vector<Tensor> m(params_.size()), v(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!file.has_state(i)) continue;  // never stepped
    const Tensor& p = params_[i];
    m[i] = Tensor::zeros(p.shape(), DType::F32, p.device());
    v[i] = Tensor::zeros(p.shape(), DType::F32, p.device());
    const int64_t st = file.read(i, 0, p.numel(), m[i].data<float>(), v[i].data<float>());
    MW_CHECK_T(FormatError, st == step, "optimizer checkpoint '", path, "': parameter ", i,
               " is at step ", st, " and the optimizer at step ", step,
               " (a partially applied step); AdamW loads only whole steps");
  }
  exp_avg_ = std::move(m);  // nothing changes before the whole file has been read
  exp_avg_sq_ = std::move(v);
  step_ = step;
}

}  // namespace mw::optim
