// HybridAdam: ColossalAI's optimizer. Each parameter is stepped by the kernel for where it lives:
// host-addressable parameters (cpu, sim) by CPUAdam with the best ISA found at run time by CPUID,
// CUDA parameters by the fused CUDA kernel. The result equals the reference AdamW bit for bit
// (Note [Adam math]).
//
// With nvme.fraction > 0, the m and v of a deterministic choice of host parameters
// (select_nvme_offloaded) live on disk between steps (NvmeAdamStates, Note [NVMe pipeline]). With
// nvme.overlap_backward (the default) those parameters are handed to the pipeline's updater
// thread from grad-ready hooks as soon as their gradient is final, and updated while backward goes
// on; an embedding table is stepped in two parts, all but the batch's rows right after the LM
// head's backward (Note [Row-split update]). step() then updates the rest and waits for the
// updater. Any fraction gives the same bits.
//
// Note [Overlapped step contract]: with overlap_backward, each backward must be followed by step()
// before the next backward (under gradient accumulation, each backward after which
// set_final_backward(true) was in force), and the gradients must not be changed
// between backward and step() (clip by passing div_scale, as ColossalAI does). A second hook for
// the same parameter in one step is reported as an error by step(). As in PyTorch's
// optimizer-in-backward, the gradient of a parameter updated inside backward is released right
// when its update is submitted (grad() is undefined from then on); the update job holds it until
// done, then frees it or, with borrowing on, lends it to the pipeline (Note [Borrowed gradient
// slots]).
//
// Checkpoints (save_state/load_state) stream the states through a slot-sized buffer, from disk for
// offloaded parameters (Note [Optimizer checkpoint format] in adam_state_file.h).
#pragma once

#include <functional>
#include <memory>
#include <utility>

#include "optim/adam_cpu.h"
#include "optim/decay_ranges.h"
#include "optim/nvme_states.h"
#include "optim/optimizer.h"

namespace mw::optim {

struct HybridAdamOptions {
  HybridAdamOptions() = default;
  HybridAdamOptions(AdamHyper hyper_, float div_scale_ = -1.f, NvmeOffloadOptions nvme_ = {})
      : hyper(hyper_), div_scale(div_scale_), nvme(std::move(nvme_)) {}
  AdamHyper hyper;
  float div_scale = -1.f;   // > 0: gradients are divided by it (loss scale, clipping)
  NvmeOffloadOptions nvme;  // fraction 0: no offload
  // Note [Update in backward]: step each in-memory parameter from its grad-ready hook, as soon as
  // its gradient is final, and free that gradient at once. Gradients then never all exist together
  // (GPT-2 small: 475 MiB less at the peak) and the update runs while the gradient is still warm in
  // cache. The contract is NVMe offload's: one backward per step() and no changes to gradients in
  // between (clip through div_scale). Under gradient accumulation only the last micro-batch's
  // backward updates (set_final_backward, Note [Updates in the last backward]).
  bool update_in_backward = false;
  // Where m and v live for a parameter on the simulated accelerator: in host RAM (true), as
  // ColossalAI's HybridAdam keeps optimizer states of CPU-placed chunks and ZeRO-Offload keeps them
  // beside the CPU optimizer, or on the device itself (false). The CPU kernel updates a sim
  // parameter in place either way (sim memory is host-addressable). CUDA parameters keep theirs on
  // the GPU (the fused CUDA kernel needs them there).
  bool states_on_host = true;
  // Per parameter, where its m and v live (overrides states_on_host when not empty): Gemini places
  // each chunk's optimizer states by its offload_optim_frac (offload/gemini).
  std::vector<Device> state_devices;
  // Per parameter, the elements the weight decay leaves alone (Note [Weight decay by ranges],
  // decay_ranges.h); empty: every element of every parameter is decayed (torch.optim.AdamW's).
  std::vector<NoDecayRanges> no_decay;
};

class HybridAdam : public Optimizer {
 public:
  HybridAdam(std::vector<Tensor> params, HybridAdamOptions options = {});
  ~HybridAdam() override;
  void step() override;
  // Steps parameter i now, with its current gradient, and releases that gradient: in memory by the
  // kernel for where it lives, or submitted to the NVMe pipeline. step() then skips it. The
  // contract is Note [Overlapped step contract]; Gemini calls it when a chunk's gradients are all
  // final (offload/gemini).
  // Returns 0 when the update is done, else a ticket for update_done (NVMe-offloaded states: the
  // updater thread steps it while the caller goes on; `p` must stay where it is until then).
  uint64_t step_param(size_t i);
  bool update_done(uint64_t ticket) const { return ticket == 0 || !nvme_ || nvme_->done(ticket); }
  // Blocks until that update ran.
  void wait_update(uint64_t ticket) {
    if (ticket != 0 && nvme_) nvme_->wait(ticket);
  }
  std::string name() const override { return "hybridadam"; }
  // Whether some parameter is updated inside backward (update_in_backward, or NVMe offload with
  // overlap_backward): then a step cannot be skipped after backward (Note [Dynamic loss scaling]).
  bool updates_in_backward() const {
    return options_.update_in_backward || (nvme_ && options_.nvme.overlap_backward);
  }
  // Per-step settings of a training loop (train/trainer.h): the LR of the coming updates (a
  // schedule), and the gradient divisor (1/K of accumulation times the clip factor; <= 0: none).
  // Updates made in backward use the values set before that backward.
  void set_lr(float lr) { options_.hyper.lr = lr; }
  // Note [Updates in the last backward]: under gradient accumulation only the step's last
  // backward updates in its hooks (the gradients are the sums then; set div_scale to 1/K before
  // it); earlier backwards only accumulate. Default true.
  void set_final_backward(bool final) { final_backward_ = final; }
  // With `on`, a parameter updated in backward leaves its gradient's block sums of squares first
  // (Note [Norm order]), and step_grad_norm() gives the global norm of the step's gradients,
  // those updated in backward and those still held, summed as global_grad_norm sums them. Call
  // it before step().
  void set_record_grad_norm(bool on) { record_norm_ = on; }
  double step_grad_norm() const;
  void set_div_scale(float div_scale) { options_.div_scale = div_scale; }
  int64_t state_bytes_in_memory() const override;
  Isa isa() const { return isa_; }
  // In-memory states (undefined for offloaded parameters and before the first step).
  const Tensor& exp_avg(size_t i) const { return exp_avg_[i]; }
  const Tensor& exp_avg_sq(size_t i) const { return exp_avg_sq_[i]; }
  // Moves parameter i's m and v (in memory, not NVMe-offloaded) to `device`, bit for bit, and
  // creates them there from now on; the parameter itself is the caller's to move (Gemini's chunks
  // moved to the device, offload/gemini/margin.cpp).
  void move_states(size_t i, Device device);
  // Copies of parameter i's m and v wherever they live (zeros before the first step).
  std::pair<Tensor, Tensor> state_copy(size_t i);
  bool offloaded(size_t i) const { return nvme_index_[i] >= 0; }
  int64_t offloaded_numel() const;
  // Null without offload.
  NvmeAdamStates* nvme() { return nvme_.get(); }
  // The first parameter whose update left a NaN or Inf in it since the last call (in memory or on
  // NVMe, in backward or in step(); CPU kernels only), or -1; resets. Note [Non-finite values] in
  // train/trainer.cpp.
  int64_t take_non_finite();

  // Waits for the offloaded states' last write-backs (they overlap the next forward) and throws a
  // failure among them; call after the last step. No-op without offload.
  void flush();
  // Writes step count and every state to `path` (IoError on failure). Works while offloaded and
  // after an I/O failure (Note [NVMe failure guarantee]). Atomic: written to a temporary sibling,
  // fsynced and renamed (data/file_io.h), so a failure, a stop signal or kill -9 keeps an earlier
  // checkpoint at `path` whole.
  void save_state(const std::string& path);
  // Note [Saving in the model's layout]: the same file, but its tensors are ranges of this
  // optimizer's parameters: file tensor t is elements [as[t].offset, + as[t].numel) of parameter
  // as[t].param. Gemini steps chunks; saving each model parameter's range of its chunk writes the
  // file a run without Gemini writes (byte for byte when nothing is on disk), so --save-optimizer
  // files load into any layout. Under ZeRO the ranks' pieces of the chunks are written the same way
  // (save_zero_state with file tensors, train/zero_state_file.h).
  struct SavedRange {
    size_t param = 0;
    int64_t offset = 0, numel = 0;
  };
  void save_state(const std::string& path, const std::vector<SavedRange>& as);
  // Restores what save_state wrote, for the same parameter shapes (FormatError otherwise); the
  // offload placement may differ from the one that saved. With a map, this optimizer's parameters
  // are pieces of the file's (Note [Sharded state files], adam_state_file.h).
  void load_state(const std::string& path, const StateFileMap* map = nullptr);

 protected:
  uint64_t update_offloaded(size_t i, bool in_backward);  // its ticket, 0 if none
  std::function<void()> update_offloaded_except_rows(size_t i, const Tensor& partial,
                                                     const std::vector<int64_t>& rows);
  void update_in_memory(size_t i, const AdamStepScalars& s);
  const NoDecayRanges& no_decay(size_t i) const { return no_decay_of(options_.no_decay, i); }
  Device state_device(size_t i) const;     // where parameter i's m and v are created
  bool any_updated_this_step() const;      // in backward: a parameter, or an offloaded slice
  std::vector<char> updated_in_backward_;  // per parameter, this step
  std::shared_ptr<char> alive_ = std::make_shared<char>(0);  // expires with the optimizer
  HybridAdamOptions options_;
  Isa isa_;
  int64_t non_finite_param_ = -1;  // take_non_finite(), in-memory updates
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  bool final_backward_ = true, record_norm_ = false;
  std::vector<std::vector<double>> norm_parts_;  // this step's, per parameter updated in backward
  void take_norm_parts(size_t i);
  std::vector<int> nvme_index_;  // parameter -> index in nvme_, or -1
  std::vector<size_t> nvme_params_;
  std::shared_ptr<NvmeAdamStates> nvme_;
  bool nvme_failure_reported_ = false;
};

}  // namespace mw::optim
