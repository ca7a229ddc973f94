// Optimizers over a list of parameters (leaf tensors whose .grad autograd fills).
//
// AdamW is the plain reference: torch.optim.AdamW semantics, computed by the scalar kernel of Note
// [Adam math]. HybridAdam (hybrid_adam.h) computes the same function with the fastest kernel for
// where each parameter lives, and can keep its states on NVMe; tests compare it against AdamW.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "optim/adam_math.h"
#include "optim/decay_ranges.h"

namespace mw::optim {

struct StateFileMap;  // adam_state_file.h

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params) : params_(std::move(params)) {}
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  virtual std::string name() const = 0;
  // Bytes of optimizer state held in host or device memory (not on disk).
  virtual int64_t state_bytes_in_memory() const = 0;
  void zero_grad();  // drops every parameter's gradient (set to none)
  const std::vector<Tensor>& params() const { return params_; }
  int64_t step_count() const { return step_; }

 protected:
  std::vector<Tensor> params_;
  int64_t step_ = 0;
};

// The reference Adam/AdamW: one m and v tensor per parameter, updated by the scalar kernel.
// f32 parameters only (what every optimizer in memwall trains).
class AdamW : public Optimizer {
 public:
  // no_decay: per parameter, the elements the weight decay leaves alone (Note [Weight decay by
  // ranges]); empty: all of them are decayed.
  AdamW(std::vector<Tensor> params, AdamHyper hyper = {}, std::vector<NoDecayRanges> no_decay = {});
  void step() override;
  std::string name() const override { return hyper_.adamw_mode ? "adamw" : "adam"; }
  int64_t state_bytes_in_memory() const override;
  const Tensor& exp_avg(size_t i) const { return exp_avg_[i]; }
  const Tensor& exp_avg_sq(size_t i) const { return exp_avg_sq_[i]; }
  // As HybridAdam's: the LR of the next step, and a gradient divisor (<= 0: none).
  void set_lr(float lr) { hyper_.lr = lr; }
  void set_div_scale(float div_scale) { div_scale_ = div_scale; }
  // The step count and every m and v, in HybridAdam's file (Note [Optimizer checkpoint format],
  // adam_state_file.h), so that either optimizer loads the other's; written atomically.
  void save_state(const std::string& path) const;
  // With a map, this optimizer's parameters are pieces of the file's (Note [Sharded state files]).
  void load_state(const std::string& path, const StateFileMap* map = nullptr);

 private:
  AdamHyper hyper_;
  std::vector<NoDecayRanges> no_decay_;
  float div_scale_ = -1.f;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
};

}  // namespace mw::optim
