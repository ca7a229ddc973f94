// NvmeAdamStates: the Adam m and v of some parameters kept on disk between steps, and the pipeline
// that reads them ahead, updates them and writes them back (docs/nvme_offload.md).
//
// Note [NVMe slices]: the unit of the pipeline is a *slice*: up to slice_numel consecutive
// elements of one parameter. Its m and v are one blob on disk (m then v, 8 bytes per element,
// padded to 4096) and one staging *slot* in RAM while in flight. Adam is elementwise, so slicing
// changes nothing in the result: a slice is updated by the same kernel as the whole parameter
// (Note [Adam math]), bit for bit.
//
// Note [NVMe pipeline]: the slices' m and v move through an io::StagingWindow (Note [Staging
// window], offload/io/staging_window.h): window_bytes of slots, the only state memory, read ahead
// by its pump thread in the expected order (the order the previous step consumed them; parameters
// last-to-first before any step ran) and written back behind. This file keeps only the optimizer:
//  - HybridAdam meets the store through one narrow interface: update(k, ...) hands over
//    parameter k's step with its final gradient and returns a ticket; awaits_update(k) says
//    whether k still needs one this step. The store decides how (whole, or a row split's rows).
//  - the updater thread runs the updates in submission order: for each slice it acquires the
//    slice's slot from the window (waiting for its read), runs the Adam kernel on it in the slot,
//    and writes it back. Grad-ready hooks only *submit*, so backward never waits for the disk;
//    the gradient is held by the job until its update ran.
//  - finish_step() waits for the updater to finish this step's jobs, not for the last
//    write-backs: those complete while the next forward runs (their slots are part of the fixed
//    window, so this costs no memory), and any failure among them is thrown by the next
//    finish_step() or checkpoint call. It ends the window's round, so the next step's reads
//    start at once and overlap the forward pass.
//  - Note [Row-split update]: the tied embedding's gradient is final for every row that the
//    batch's tokens do not touch as soon as the LM head's backward is done (Note [Rows-ready
//    hooks], autograd.h); only the at most B*T touched rows wait for the embedding's backward at
//    the very end. update_except_rows() streams the parameter through the slots then,
//    stepping all but the pending rows and setting aside, for each slice, the 4096-byte pages of
//    its blob that hold pending rows' m and v (copied from the slot before its write-back).
//    update(k, ...) later steps the pending rows in those pages, with no I/O at all, and
//    keeps the pages in RAM as *held* pages: newer than the disk, they are laid over the slice
//    every time it is taken from the window (for its update, or a checkpoint), and dropped when the
//    slice is next written in full. So the largest parameter's 294.5 MiB of states stream during
//    the blocks' backward instead of after it, for at most 2 x B*T x row pages of RAM (8 MiB at B4
//    T128). Adam is elementwise, so the split changes no bit.
//  - Note [Borrowed gradient slots] (optional, off by default): with updates inside backward, a
//    parameter's gradient is dead once its update ran. The updater can then *lend* its buffer here
//    (donate()), carved into extra slots for the rest of the step, so read-ahead runs deeper while
//    the memory is there anyway (all gradients would be alive at the end of a plain backward).
//    Before the row split this is what hid the tied embedding's states; with it, borrowing buys no
//    measurable speed and holds up to the largest parameter's m+v at the peak, so it is off.
//    Borrowed slots are the window's lent slots, returned (dropped) by finish_step().
//  - A slice consumed out of the expected order while every slot holds another slice's prefetch
//    goes through the window's spare slot synchronously, so the pipeline never deadlocks.
//
// Note [NVMe failure guarantee]: per-slice atomicity. A slice's p, m and v change together or not
// at all in memory: a failed read skips the slice (p, m, v keep their old values); a failed
// write-back keeps the new m and v in RAM (the window's dirty copy, Note [Staging failures])
// alongside the new p, so nothing is half-updated or lost. Each slice records the last step applied
// to all of its elements (slice_step), so a failed step is "partially applied, per-slice counters
// say where". With a row split, a slice is two parts, each all-old or all-new: if the step fails
// between them, the rows the batch did not touch are one step ahead of the slice's counter (their
// p, m and v together). After any I/O failure, finish_step() throws it (mw::IoError with file,
// offset, errno), further updates are refused, and the states can still be saved (read_slice
// serves dirty slices from RAM).
//
// Note [NVMe files]: the swap file is unlinked right after it is created, and a private temporary
// directory is removed right after that, so no file outlives the process on any exit path
// (SIGKILL included): the space is freed when the descriptor closes. A directory that the user
// gives is never removed; only our own (already unlinked) file was in it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "offload/io/io_engine.h"
#include "offload/io/staging_window.h"
#include "offload/io/swap_space.h"
#include "optim/adam_cpu.h"
#include "optim/decay_ranges.h"

namespace mw::optim {

struct NvmeOffloadOptions {
  double fraction = 0.0;  // of all parameter elements, greedy in parameter order
  std::string dir;        // "" = a private temporary directory (io::make_private_dir)
  int64_t slice_numel = int64_t{1} << 19;    // 512 Ki elements: 2 MiB of m + 2 MiB of v per slot
  int64_t window_bytes = int64_t{32} << 20;  // staging RAM: window_bytes / (8 * slice_numel) slots
  bool overlap_backward = true;  // HybridAdam: update offloaded parameters in grad-ready hooks
  bool record_timeline = false;  // keep per-slice timestamps of the last step
  // Lend spent gradient buffers to the pipeline as extra read-ahead slots (Note [Borrowed gradient
  // slots]), up to the largest parameter's m+v (296 MiB on GPT-2 small). Off by default since the
  // row split (Note [Row-split update]) streams the tied embedding during backward anyway: on
  // GPT-2 small borrowing then costs ~250 MiB of peak RSS for no measurable speed.
  bool borrow_gradient_slots = false;
  io::IoOptions io;  // backend and queue depth of the engine
};

// A staging slot holds the m and v of one slice: 8 x slice_numel bytes, or of the largest parameter
// when every parameter is smaller (a small model's chunks), padded to 4096 for O_DIRECT.
int64_t staging_slot_bytes(int64_t slice_numel, int64_t largest_numel);
// The staging RAM a window of window_bytes really takes: whole slots, two of them at least
// (io::StagingOptions), so a window below two slots costs two (8 MiB with the default slices),
// and no more slots than `max_slices` (the window makes none a slice could not use). The memory
// plan and the three tiers' budget count this, not the flag's value.
int64_t staging_window_bytes(int64_t window_bytes, int64_t slice_numel, int64_t largest_numel,
                             int64_t max_slices = std::numeric_limits<int64_t>::max());

// ColossalAI's choice: walk the parameters in order and offload one while the offloaded total plus
// its numel stays <= floor(total_numel * fraction). Throws InvalidArgument for a fraction outside
// [0, 1].
std::vector<bool> select_nvme_offloaded(const std::vector<int64_t>& numels, double fraction);

// Timestamps (ms since the store was made) of one slice in one step; -1 when it did not happen.
struct SliceTiming {
  int param = 0;  // index into the store's parameters
  int64_t offset = 0, numel = 0;
  double read_issue_ms = -1, read_done_ms = -1;  // -1 too when zero-filled (never written)
  double compute_start_ms = -1, compute_end_ms = -1;
  double write_issue_ms = -1, write_done_ms = -1;
  bool spare = false;  // went through the spare slot
};

struct NvmeStats {
  int64_t bytes_read = 0, bytes_written = 0;  // what the engine moved
  double consumer_wait_ms = 0;  // time the updater waited for reads (hidden while backward runs)
  double flush_wait_ms = 0;     // time finish_step() waited for the updater: exposed to the step
  double join_wait_ms = 0;      // time backward waited for a row split to end: exposed too
  int64_t split_rows = 0;       // rows deferred by row splits in the last step
  int64_t held_bytes = 0;       // held pages now (Note [Row-split update])
  int64_t held_bytes_max = 0;
  int64_t queued_grad_bytes = 0;  // gradients held by submitted updates that have not run yet
  int64_t queued_grad_bytes_max = 0;
  int64_t spare_slices = 0;        // slices that took the spare slot (out of the expected order)
  int64_t staging_bytes = 0;       // RAM of the slots (and the spare, once made)
  int64_t borrowed_bytes_max = 0;  // most dead-gradient memory lent as slots in one step
  int64_t file_bytes = 0;          // disk space in use
  bool direct = true;              // O_DIRECT everywhere
  bool registered_slots = false;   // slots registered with io_uring (Note [Registered buffers])
  int64_t fixed_transfers = 0;     // transfers that used them
};

class NvmeAdamStates {
 public:
  // numels: the offloaded parameters, in the order update() refers to them. Creates the swap file
  // (IoError if the directory is unusable) and starts the pump.
  NvmeAdamStates(std::vector<int64_t> numels, NvmeOffloadOptions options, Isa isa);
  ~NvmeAdamStates();
  NvmeAdamStates(const NvmeAdamStates&) = delete;
  NvmeAdamStates& operator=(const NvmeAdamStates&) = delete;

  // The narrow interface (Note [NVMe pipeline]). Hands over parameter k's Adam step with the
  // given scalars and its final gradient, to run on the updater thread after the jobs submitted
  // before it; returns at once. If a row split of k waits for its rows (Note [Row-split update]),
  // this steps those rows; otherwise the whole parameter. param[numel] f32 is updated in place: it
  // must stay alive and unused by others until the ticket is done. `grad` (contiguous,
  // f32/f16/bf16) is held until the update ran, then released, or lent as slots when nobody else
  // holds it (Note [Borrowed gradient slots]). Never throws: a failure or misuse is recorded and
  // thrown by finish_step(). Returns its ticket (0 when refused).
  uint64_t update(int k, const AdamStepScalars& scalars, float* param, Tensor grad);
  // The elements of parameter k that the weight decay leaves alone (Note [Weight decay by
  // ranges]); set before its first update.
  void set_no_decay(int k, NoDecayRanges ranges) { no_decay_.at(k) = std::move(ranges); }
  // True while parameter k still needs update() this step: none was submitted, or a row split
  // waits for its rows.
  bool awaits_update(int k) const;
  // Note [Row-split update]: steps parameter k ([numel / row_numel] rows) except the sorted,
  // distinct `pending_rows`; update(k, ...) steps those later. `grad` must stay alive and
  // unchanged outside those rows until wait(ticket) returned.
  uint64_t update_except_rows(int k, const AdamStepScalars& scalars, float* param, const void* grad,
                              DType grad_dtype, int64_t row_numel,
                              std::vector<int64_t> pending_rows);
  void wait(uint64_t ticket);
  // True once the job of `ticket` (and every earlier one) has run. Never blocks.
  bool done(uint64_t ticket) const;
  // An update of k was submitted this step (a row split counts).
  bool updated_this_step(int k) const;
  // Lends a dead gradient's buffer as extra slots until finish_step() when borrowing is on and it
  // is f32, on the host, 4096-aligned, at least a slot, and held by nobody else (Note [Borrowed
  // gradient slots]); otherwise drops it.
  void donate(Tensor buffer);
  // Ends a step: waits for this step's updates (not for the last write-backs, which overlap the
  // next forward), restarts read-ahead for the next step in the order just observed, and throws
  // the first failure seen so far (Note [NVMe failure guarantee]).
  void finish_step();
  // Waits for every update and write-back, and throws the first failure seen so far. Call it after
  // the last step to learn about a failure of its final write-backs.
  void flush();
  // True after an I/O failure: update() does nothing and finish_step() throws.
  bool failed() const;
  int64_t slot_bytes() const;  // staging_slot_bytes of these parameters
  // The first store parameter (its index among the offloaded ones) whose update left a NaN or Inf
  // since the last call, or -1; resets (Note [Non-finite values] in train/trainer.cpp).
  int take_non_finite() { return non_finite_param_.exchange(-1); }

  // Checkpointing. Both stop read-ahead, wait for all I/O and release the slots first.
  // Copies slice (k, i)'s current m and v (its numel floats each) out and returns the slice's
  // step; never-written slices give zeros, slices whose write failed come from RAM.
  int64_t read_slice(int k, int64_t i, float* m_out, float* v_out);
  // Replaces slice (k, i)'s m and v (written through to disk before returning) and its step.
  void write_slice(int k, int64_t i, const float* m, const float* v, int64_t step);
  // Re-enables read-ahead after read_slice/write_slice (call between steps; PrefetchPaused does
  // it on every exit).
  void resume_prefetch();
  int64_t slice_count(int k) const;
  int64_t slice_numel() const { return options_.slice_numel; }
  int64_t slice_step(int k, int64_t i) const;

  int param_count() const { return static_cast<int>(numels_.size()); }
  int64_t numel(int k) const { return numels_[k]; }
  NvmeStats stats() const;
  double now_ms() const;
  // Per-slice timings of the last finished step (record_timeline).
  std::vector<SliceTiming> last_timeline() const;
  // The engine, for tests (fault injection).
  io::IoEngine& engine() { return *engine_; }
  const std::string& dir() const { return dir_; }

 private:
  struct Slice {
    int param = 0;
    int64_t offset = 0, numel = 0;
    int64_t step = 0;     // last step applied to all elements (Note [NVMe failure guarantee])
    int64_t timing = -1;  // index into timeline_ this step
  };
  // Bytes [offset, offset + bytes.size()) of a slice's blob, whole 4096-byte pages.
  struct Pages {
    int64_t offset = 0;
    AlignedBuffer bytes;
  };
  struct RowSplit {  // Note [Row-split update], per parameter, during one step
    bool active = false;
    bool rows_submitted = false;                      // update() handed over the pending rows
    std::vector<std::pair<int64_t, int64_t>> ranges;  // pending elements [lo, hi), sorted
    std::vector<std::pair<int64_t, std::vector<Pages>>> set_aside;  // slice -> its pending pages
  };
  struct Job {
    enum class Kind { kWhole, kExceptRows, kRows };
    Kind kind = Kind::kWhole;
    int k = 0;
    AdamStepScalars scalars;
    float* param = nullptr;
    const char* grad = nullptr;
    DType grad_dtype = DType::F32;
    Tensor keep;  // holds the gradient until the job ran (undefined for kExceptRows)
    uint64_t ticket = 0;
    static Job of(Kind kind, int k, const AdamStepScalars& scalars, float* param, const void* grad,
                  DType grad_dtype) {
      Job job;
      job.kind = kind;
      job.k = k;
      job.scalars = scalars;
      job.param = param;
      job.grad = static_cast<const char*>(grad);
      job.grad_dtype = grad_dtype;
      return job;
    }
    // A job that holds its gradient (kWhole, kRows).
    static Job holding(Kind kind, int k, const AdamStepScalars& scalars, float* param,
                       Tensor grad) {
      Job job = of(kind, k, scalars, param, grad.raw_data(), grad.dtype());
      job.keep = std::move(grad);
      return job;
    }
  };

  struct SplitWork {  // a row split's pass over its slices, one at a time between other jobs
    Job job;
    int64_t next = 0;  // next slice id
  };
  uint64_t submit_locked(Job job);
  void mark_done_locked(uint64_t ticket);
  void updater();
  void run_job(const Job& job);
  void finish_rows(const Job& job);
  void drain_locked(std::unique_lock<std::mutex>& lock);
  // Records a misuse as the step's failure (thrown by finish_step) rather than throwing into a
  // hook, as an I/O failure is. Returns ok.
  bool admit(bool ok, const std::string& why);
  // Adam on one slice whose m, v sit at m (v at m + numel); with a row split, all but the pending
  // rows, whose pages are returned.
  std::vector<Pages> step_slice(int64_t id, const Job& job, float* m);
  // The first step's order is a guess (parameters last to first); a row split proves it wrong
  // (the tied embedding comes first). Until a parameter has been written once, a submission moves
  // its slices up to just after those submitted before it.
  void promote_locked(int k);
  // After a slice's Adam step, before its write-back: its step counter, or its pages set aside.
  void stepped_locked(int64_t id, const Job& job, std::vector<Pages> pages);
  void overlay_held_locked(int64_t id, float* m);
  void drop_held_locked(int64_t id);
  void update_slice(int64_t id, const Job& job);
  SliceTiming& timing_locked(int64_t slice);

  NvmeOffloadOptions options_;
  Isa isa_;
  // Note [Serial updates beside busy cores]: the updater steps a slice on its own thread alone
  // when the compute threads already take every core (set at construction).
  bool serial_updates_ = false;
  std::atomic<int> non_finite_param_{-1};  // take_non_finite()
  // Records `param` as non-finite unless an earlier one is.
  void note_non_finite(int param) {
    int none = -1;
    non_finite_param_.compare_exchange_strong(none, param);
  }
  std::vector<int64_t> numels_;
  std::vector<int64_t> first_slice_;  // per parameter, index of its first slice
  std::vector<Slice> slices_;
  std::string dir_;
  std::unique_ptr<io::IoEngine> engine_;
  std::unique_ptr<io::SwapSpace> swap_;
  std::unique_ptr<io::StagingWindow> window_;  // Note [NVMe pipeline]

  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  std::vector<Tensor> donors_;  // gradients lent as slots this step
  bool stop_ = false;
  NvmeStats stats_;
  std::vector<SliceTiming> timeline_, last_timeline_;
  std::vector<int64_t> last_timeline_ids_;  // slice of each last_timeline_ entry
  // The updater (Note [NVMe pipeline]) and the row splits (Note [Row-split update]).
  std::deque<Job> jobs_;
  std::deque<SplitWork> split_work_;
  uint64_t next_ticket_ = 1, done_ticket_ = 0;  // every ticket <= done_ticket_ has finished
  std::set<uint64_t> completed_;                // finished tickets above done_ticket_
  std::vector<char> submitted_;                 // per parameter, this step
  std::vector<int> promoted_;                   // promote_locked, this step
  std::vector<char> split_param_;        // per parameter: row-split in some step (read stream 1)
  std::vector<RowSplit> splits_;         // per parameter
  std::vector<NoDecayRanges> no_decay_;  // per parameter
  std::unordered_map<int64_t, std::vector<Pages>> held_;  // slice -> pages newer than the disk
  std::thread updater_thread_;
};

// Restarts read-ahead when it leaves scope, a throw included: read_slice and write_slice pause it,
// and a checkpoint that failed between them (a full disk under save_state, a write under
// load_state's commit) left it paused, so the next step's updater waited forever for a slot that
// no read would fill. Null: nothing to restart.
class PrefetchPaused {
 public:
  explicit PrefetchPaused(NvmeAdamStates* states) : states_(states) {}
  ~PrefetchPaused() {
    if (states_) states_->resume_prefetch();
  }
  PrefetchPaused(const PrefetchPaused&) = delete;
  PrefetchPaused& operator=(const PrefetchPaused&) = delete;

 private:
  NvmeAdamStates* states_;
};

}  // namespace mw::optim
