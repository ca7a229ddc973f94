// HybridAdam (hybrid_adam.h): placement-driven kernels, the NVMe-offloaded parameters, checkpoints.

#include "optim/hybrid_adam.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <utility>

#include "autograd/autograd.h"
#include "data/file_io.h"
#include "optim/adam_cuda.h"
#include "optim/adam_state_file.h"
#include "optim/grad_norm.h"

namespace mw::optim {

HybridAdam::HybridAdam(std::vector<Tensor> params, HybridAdamOptions options)
    : Optimizer(std::move(params)), options_(std::move(options)), isa_(best_isa()) {
  MW_CHECK_T(InvalidArgument,
             options_.no_decay.empty() || options_.no_decay.size() == params_.size(),
             "HybridAdam: ", options_.no_decay.size(), " no-decay range lists for ", params_.size(),
             " parameters");
  for (auto& p : params_)
    MW_CHECK_T(InvalidArgument, p.dtype() == DType::F32 && p.is_contiguous(),
               "HybridAdam: parameters must be contiguous f32 (fp32 master weights), got ",
               p.desc());
  exp_avg_.resize(params_.size());
  exp_avg_sq_.resize(params_.size());
  nvme_index_.assign(params_.size(), -1);
  updated_in_backward_.assign(params_.size(), 0);
  if (options_.nvme.fraction <= 0.0)
    select_nvme_offloaded({}, options_.nvme.fraction);  // validates
  if (options_.update_in_backward) {
    // Hooks of in-memory parameters (offloaded ones get theirs below). A hook is dropped with
    // nothing else than its parameter's metadata; `alive_` guards an optimizer that died first.
    std::weak_ptr<char> alive = alive_;
    for (size_t i = 0; i < params_.size(); ++i) {
      add_grad_ready_hook(params_[i], [this, alive, i](const Tensor&) {
        if (alive.expired() || nvme_index_[i] >= 0 || !final_backward_) return;
        if (nvme_ && nvme_->failed()) return;  // step() throws it (Note [NVMe failure guarantee])
        take_norm_parts(i);
        update_in_memory(i, make_adam_step_scalars(options_.hyper, step_ + 1, options_.div_scale));
        updated_in_backward_[i] = 1;
        set_grad(params_[i], Tensor());  // spent: free it now (Note [Update in backward])
      });
    }
  }
  if (options_.nvme.fraction <= 0.0) return;
  // Only host parameters can be offloaded (ColossalAI: CPU parameters only). Where the caller
  // placed the states (Gemini: per chunk), only those placed on the host: a chunk whose states
  // its policy keeps on the sim device kept them there only until a host budget (three tiers)
  // sent them to disk with the rest (static --offload-optim-frac 0: sim peak 65 MiB against 91
  // without --host-capacity).
  std::vector<int64_t> numels;
  for (size_t i = 0; i < params_.size(); ++i) {
    const bool host = params_[i].device().is_host_addressable() &&
                      (options_.state_devices.empty() || state_device(i).is_cpu());
    numels.push_back(host ? params_[i].numel() : 0);
  }
  std::vector<bool> chosen = select_nvme_offloaded(numels, options_.nvme.fraction);
  std::vector<int64_t> offloaded_numels;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!chosen[i] || numels[i] == 0) continue;
    nvme_index_[i] = static_cast<int>(nvme_params_.size());
    nvme_params_.push_back(i);
    offloaded_numels.push_back(numels[i]);
  }
  if (nvme_params_.empty()) return;
  nvme_ = std::make_shared<NvmeAdamStates>(offloaded_numels, options_.nvme, isa_);
  for (size_t k = 0; k < nvme_params_.size(); ++k)
    nvme_->set_no_decay(static_cast<int>(k), no_decay(nvme_params_[k]));
  if (options_.nvme.overlap_backward) {
    std::weak_ptr<NvmeAdamStates> weak = nvme_;
    for (size_t i : nvme_params_) {
      add_grad_ready_hook(params_[i], [this, weak, i](const Tensor&) {
        if (!final_backward_) return;  // Note [Updates in the last backward]
        if (auto alive = weak.lock()) {
          take_norm_parts(i);
          update_offloaded(i, true);
        }
      });
      // Note [Row-split update]: an embedding table (GPT-2's tied wte) is stepped, all but the
      // rows this batch looks up, as soon as the LM head's backward made the rest final.
      if (params_[i].dim() == 2)
        add_grad_rows_ready_hook(params_[i], [this, weak, i](const Tensor&, const Tensor& partial,
                                                             const std::vector<int64_t>& rows) {
          // Under accumulation the first backward's rows are not final (the last backward's
          // accumulate, so the engine does not call this then: its grad-ready hook steps all).
          if (weak.expired() || !final_backward_) return std::function<void()>();
          return update_offloaded_except_rows(i, partial, rows);
        });
    }
  }
}

std::function<void()> HybridAdam::update_offloaded_except_rows(size_t i, const Tensor& partial,
                                                               const std::vector<int64_t>& rows) {
  std::weak_ptr<NvmeAdamStates> weak = nvme_;
  if (!nvme_ || !partial.is_contiguous() || partial.offset() != 0 ||
      !partial.device().is_host_addressable() || partial.dtype() == DType::F64)
    return {};  // the whole parameter is then stepped by its grad-ready hook
  Tensor& p = params_[i];
  p.bump_version();
  const uint64_t ticket = nvme_->update_except_rows(
      nvme_index_[i], make_adam_step_scalars(options_.hyper, step_ + 1, options_.div_scale),
      p.data<float>(), partial.raw_data(), partial.dtype(), p.size(1), rows);
  return [weak, ticket] {
    if (auto alive = weak.lock()) alive->wait(ticket);
  };
}

HybridAdam::~HybridAdam() {
  alive_.reset();  // in-memory hooks see the optimizer gone and do nothing
  nvme_.reset();   // hooks see the states gone and do nothing
}

uint64_t HybridAdam::update_offloaded(size_t i, bool in_backward) {
  Tensor& p = params_[i];
  Tensor g = grad(p);
  if (!g.defined()) return 0;
  Tensor gc = g.contiguous();
  const AdamStepScalars s = make_adam_step_scalars(options_.hyper, step_ + 1, options_.div_scale);
  p.bump_version();
  // Note [Borrowed gradient slots]: inside backward the gradient is spent once submitted: release
  // it here, so that the job holds the only reference and can lend the buffer when done.
  if (in_backward) set_grad(p, Tensor());
  g = Tensor();
  return nvme_->update(nvme_index_[i], s, p.data<float>(), std::move(gc));
}

void HybridAdam::update_in_memory(size_t i, const AdamStepScalars& s) {
  Tensor& p = params_[i];
  Tensor g = grad(p);
  if (!g.defined()) return;
  if (!exp_avg_[i].defined()) {
    exp_avg_[i] = Tensor::zeros(p.shape(), DType::F32, state_device(i));
    exp_avg_sq_[i] = Tensor::zeros(p.shape(), DType::F32, state_device(i));
  }
  Tensor gc = g.contiguous();
  p.bump_version();
  const bool on_gpu = p.device().is_cuda();
  if (on_gpu && exp_avg_[i].device().is_cuda()) {
    const int64_t esize = dtype_size(gc.dtype());
    for_each_decay_segment(no_decay(i), 0, p.numel(), s,
                           [&](int64_t lo, int64_t hi, const AdamStepScalars& ss) {
                             adam_update_cuda(ss, p.data<float>() + lo,
                                              static_cast<const char*>(gc.raw_data()) + lo * esize,
                                              gc.dtype(), exp_avg_[i].data<float>() + lo,
                                              exp_avg_sq_[i].data<float>() + lo, hi - lo, nullptr);
                           });
    return;
  }
  // Note [GPU parameters with host states]: ZeRO-Offload's update. A parameter on the GPU whose m
  // and v are on the host (Gemini's device-homed chunks under --offload-optim-frac) comes to the
  // host, is stepped there by the CPU kernel with its gradient, and goes back: one copy of the
  // parameter each way instead of m and v. (The CUDA kernel on host states faulted: an H200 run of
  // `--gemini static --offload-optim-frac 1` stopped with an illegal memory access.)
  Tensor hp = on_gpu ? p.to(Device::cpu()) : p;
  if (gc.device().is_cuda()) gc = gc.to(Device::cpu());
  std::atomic<bool> non_finite{false};
  adam_update_ranged(isa_, s, no_decay(i), hp.data<float>(), gc.raw_data(), gc.dtype(),
                     exp_avg_[i].data<float>(), exp_avg_sq_[i].data<float>(), p.numel(),
                     &non_finite);
  if (non_finite && non_finite_param_ < 0) non_finite_param_ = static_cast<int64_t>(i);
  if (on_gpu) p.copy_(hp);
}

Device HybridAdam::state_device(size_t i) const {
  if (!options_.state_devices.empty()) return options_.state_devices.at(i);
  const Device d = params_[i].device();
  return options_.states_on_host && d.is_sim() ? Device::cpu() : d;
}

void HybridAdam::move_states(size_t i, Device device) {
  MW_CHECK_T(InvalidArgument, i < params_.size() && nvme_index_[i] < 0,
             "HybridAdam::move_states: parameter ", i, " has no in-memory states to move");
  if (exp_avg_[i].defined()) {
    exp_avg_[i] = exp_avg_[i].to(device);
    exp_avg_sq_[i] = exp_avg_sq_[i].to(device);
  }
  if (options_.state_devices.empty()) {  // pin every parameter's placement, then change this one
    std::vector<Device> where;
    for (size_t k = 0; k < params_.size(); ++k) where.push_back(state_device(k));
    options_.state_devices = std::move(where);
  }
  options_.state_devices[i] = device;
}

int64_t HybridAdam::take_non_finite() {
  int64_t i = std::exchange(non_finite_param_, -1);
  const int offloaded = nvme_ ? nvme_->take_non_finite() : -1;
  if (i < 0 && offloaded >= 0)
    i = static_cast<int64_t>(nvme_params_[static_cast<size_t>(offloaded)]);
  return i;
}

void HybridAdam::take_norm_parts(size_t i) {
  if (!record_norm_) return;
  norm_parts_.resize(params_.size());
  norm_parts_[i].clear();
  append_grad_block_squares(params_[i], norm_parts_[i]);
}

// A parameter's parts are taken when not empty (a gradient gives one block at least); the others'
// gradients are still held.
double HybridAdam::step_grad_norm() const {
  double sum_sq = 0;
  std::vector<double> parts;
  for (size_t i = 0; i < params_.size(); ++i) {
    const bool taken = i < norm_parts_.size() && !norm_parts_[i].empty();
    parts.clear();
    if (!taken) append_grad_block_squares(params_[i], parts);
    sum_sq = add_in_order(sum_sq, taken ? norm_parts_[i] : parts);
  }
  return std::sqrt(sum_sq);
}

uint64_t HybridAdam::step_param(size_t i) {
  MW_CHECK_T(InvalidArgument, i < params_.size(), "HybridAdam::step_param: no parameter ", i);
  updated_in_backward_[i] = 1;
  if (nvme_index_[i] >= 0) return update_offloaded(i, true);  // the job holds the gradient
  update_in_memory(i, make_adam_step_scalars(options_.hyper, step_ + 1, options_.div_scale));
  set_grad(params_[i], Tensor());
  return 0;
}

bool HybridAdam::any_updated_this_step() const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (updated_in_backward_[i] ||
        (nvme_index_[i] >= 0 && nvme_->updated_this_step(nvme_index_[i])))
      return true;
  return false;
}

void HybridAdam::step() {
  MW_CHECK_T(Error, !(nvme_ && nvme_->failed() && nvme_failure_reported_),
             "HybridAdam cannot step after the NVMe I/O error reported by an earlier step(); "
             "save_state() to a healthy disk, fix the offload directory, and resume from it (a "
             "step the failure cut short cannot be resumed: then resume from a checkpoint written "
             "before it)");
  // A failure before this step's updates began (the last step's final write-backs, which
  // complete during this forward): this step updates nothing and is not counted, so the states
  // stay whole at the last step (they updated the in-memory parameters and counted the step).
  if (nvme_ && nvme_->failed() && !any_updated_this_step()) {
    nvme_failure_reported_ = true;
    nvme_->finish_step();  // throws the failure
  }
  const AdamStepScalars s = make_adam_step_scalars(options_.hyper, step_ + 1, options_.div_scale);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (nvme_index_[i] >= 0) {
      if (nvme_->awaits_update(nvme_index_[i])) update_offloaded(i, false);
      continue;
    }
    if (updated_in_backward_[i]) continue;
    update_in_memory(i, s);
  }
  std::fill(updated_in_backward_.begin(), updated_in_backward_.end(), 0);
  for (std::vector<double>& parts : norm_parts_) parts.clear();
  ++step_;  // counted even when a failure below makes the step partial (per-slice steps tell)
  if (nvme_) {
    try {
      nvme_->finish_step();
    } catch (...) {
      nvme_failure_reported_ = true;
      throw;
    }
  }
}

int64_t HybridAdam::state_bytes_in_memory() const {
  int64_t n = 0;
  for (size_t i = 0; i < exp_avg_.size(); ++i)
    if (exp_avg_[i].defined()) n += exp_avg_[i].nbytes() + exp_avg_sq_[i].nbytes();
  if (nvme_) n += nvme_->stats().staging_bytes;
  return n;
}

int64_t HybridAdam::offloaded_numel() const {
  int64_t n = 0;
  for (size_t i : nvme_params_) n += params_[i].numel();
  return n;
}

std::pair<Tensor, Tensor> HybridAdam::state_copy(size_t i) {
  const Tensor& p = params_[i];
  if (nvme_index_[i] < 0) {
    if (!exp_avg_[i].defined())
      return {Tensor::zeros(p.shape(), DType::F32, p.device()),
              Tensor::zeros(p.shape(), DType::F32, p.device())};
    return {exp_avg_[i].clone(), exp_avg_sq_[i].clone()};
  }
  Tensor m = Tensor::zeros(p.shape(), DType::F32, Device::cpu());
  Tensor v = Tensor::zeros(p.shape(), DType::F32, Device::cpu());
  const int k = nvme_index_[i];
  const PrefetchPaused paused(nvme_.get());
  for (int64_t j = 0; j < nvme_->slice_count(k); ++j) {
    const int64_t off = j * nvme_->slice_numel();
    nvme_->read_slice(k, j, m.data<float>() + off, v.data<float>() + off);
  }
  return {m, v};
}

// ---- checkpoints (Note [Optimizer checkpoint format]) -----------------------------------------

void HybridAdam::flush() {
  if (nvme_) nvme_->flush();
}

void HybridAdam::save_state(const std::string& path) {
  std::vector<SavedRange> whole;
  for (size_t i = 0; i < params_.size(); ++i) whole.push_back({i, 0, params_[i].numel()});
  save_state(path, whole);
}

namespace {

// Elements [lo, hi) of an offloaded parameter, all in its slice `slice`.
struct SliceCut {
  int64_t slice, lo, hi;
};

// The range's elements cut at slice boundaries: a segment of the file per cut.
std::vector<SliceCut> slice_cuts(int64_t offset, int64_t numel, int64_t slice_numel) {
  std::vector<SliceCut> cuts;
  for (int64_t lo = offset; lo < offset + numel;) {
    const int64_t j = lo / slice_numel, hi = std::min((j + 1) * slice_numel, offset + numel);
    cuts.push_back({j, lo, hi});
    lo = hi;
  }
  return cuts;
}

}  // namespace

void HybridAdam::save_state(const std::string& path, const std::vector<SavedRange>& as) {
  AdamStateWriter w(path);
  w.put(kAdamStateMagic, 8);
  w.put_i64(step_);
  w.put_i64(static_cast<int64_t>(as.size()));
  const int64_t sn = nvme_ ? nvme_->slice_numel() : 1;
  for (const SavedRange& r : as) {  // the header: per tensor its segments (slices cut to range)
    w.put_i64(r.numel);
    const int k = nvme_index_[r.param];
    if (k >= 0 && r.numel > 0) {
      const std::vector<SliceCut> cuts = slice_cuts(r.offset, r.numel, sn);
      w.put_i64(static_cast<int64_t>(cuts.size()));
      for (const SliceCut& c : cuts) {
        w.put_i64(c.lo - r.offset);
        w.put_i64(c.hi - c.lo);
        w.put_i64(nvme_->slice_step(k, c.slice));
      }
    } else if (k < 0 && exp_avg_[r.param].defined()) {
      w.put_i64(1);
      w.put_i64(0);
      w.put_i64(r.numel);
      w.put_i64(step_);
    } else {
      w.put_i64(0);
    }
  }
  std::vector<float> m(static_cast<size_t>(nvme_ ? sn : 0)), v(m.size());
  const PrefetchPaused paused(nvme_.get());
  std::pair<int, int64_t> slice_in_m{-1, -1};  // the (parameter, slice) read into m and v
  size_t host_of = SIZE_MAX;                   // the parameter whose states are in mc and vc
  Tensor mc, vc;
  for (const SavedRange& r : as) {
    const int k = nvme_index_[r.param];
    if (k >= 0 && r.numel > 0) {  // streamed from disk one slice at a time
      for (const SliceCut& c : slice_cuts(r.offset, r.numel, sn)) {
        // Ranges of one chunk share its slices: each is read once (ranges come in chunk order).
        if (slice_in_m != std::pair<int, int64_t>{k, c.slice}) {
          nvme_->read_slice(k, c.slice, m.data(), v.data());
          slice_in_m = {k, c.slice};
        }
        w.put(m.data() + (c.lo - c.slice * sn), 4 * (c.hi - c.lo));
        w.put(v.data() + (c.lo - c.slice * sn), 4 * (c.hi - c.lo));
      }
    } else if (k < 0 && exp_avg_[r.param].defined()) {
      if (host_of != r.param) {  // once per parameter, however many ranges it gives
        mc = exp_avg_[r.param].to(Device::cpu());
        vc = exp_avg_sq_[r.param].to(Device::cpu());
        host_of = r.param;
      }
      w.put(static_cast<const float*>(mc.raw_data()) + r.offset, 4 * r.numel);
      w.put(static_cast<const float*>(vc.raw_data()) + r.offset, 4 * r.numel);
    }
  }
  w.close();
}

// A file is read whole before anything changes, so that a damaged one leaves the optimizer as it
// was (as AdamW; the states of the parameters before the damage were replaced). Every stepped
// range must be at the file's step: the updates use one step count for all, so a range a failed
// step left behind (Note [NVMe failure guarantee]) would get another step's bias correction.
// Offloaded states are read twice, checked and then written to their slices: holding them in RAM
// in between is what offloading them avoids.
void HybridAdam::load_state(const std::string& path, const StateFileMap* map) {
  StateFileRanges file(path, params_, map);
  const int64_t step = file.step();
  auto read_range = [&](size_t i, int64_t off, int64_t n, float* m, float* v) {
    const int64_t st = file.read(i, off, n, m, v);
    MW_CHECK_T(FormatError, st == step || !file.has_state(i), "optimizer checkpoint '", path,
               "': parameter ", i, " is at step ", st, " and the optimizer at step ", step,
               " (a step an I/O failure cut short); HybridAdam loads only whole steps: resume "
               "from a checkpoint written before the failure");
    return st;
  };
  std::vector<Tensor> mem_m(params_.size()), mem_v(params_.size());
  std::vector<float> m, v;
  const PrefetchPaused paused(nvme_.get());
  for (const bool commit : {false, true})
    for (size_t i = 0; i < params_.size(); ++i) {
      const int k = nvme_index_[i];
      if (k >= 0) {
        m.resize(static_cast<size_t>(nvme_->slice_numel()));
        v.resize(m.size());
        for (int64_t j = 0; j < nvme_->slice_count(k); ++j) {
          const int64_t off = j * nvme_->slice_numel();
          const int64_t n = std::min(nvme_->slice_numel(), params_[i].numel() - off);
          const int64_t st = read_range(i, off, n, m.data(), v.data());
          if (commit) nvme_->write_slice(k, j, m.data(), v.data(), st);
        }
      } else if (!commit && file.has_state(i)) {
        const Tensor& p = params_[i];
        mem_m[i] = Tensor::zeros(p.shape(), DType::F32, Device::cpu());
        mem_v[i] = Tensor::zeros(p.shape(), DType::F32, Device::cpu());
        read_range(i, 0, p.numel(), mem_m[i].data<float>(), mem_v[i].data<float>());
      } else if (commit) {
        // Where the run keeps them (state_device), not where the parameter is: Gemini's chunks
        // homed on a GPU with host states stepped a host gradient with the CUDA kernel on resume.
        exp_avg_[i] = mem_m[i].defined() ? mem_m[i].to(state_device(i)) : Tensor();
        exp_avg_sq_[i] = mem_v[i].defined() ? mem_v[i].to(state_device(i)) : Tensor();
      }
    }
  step_ = step;
}

}  // namespace mw::optim
