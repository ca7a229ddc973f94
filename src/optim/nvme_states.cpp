// NvmeAdamStates (nvme_states.h): slices, the updater thread, the narrow interface to HybridAdam,
// the failure guarantee and checkpoints. The slots and the read-ahead are io::StagingWindow's
// (Note [NVMe pipeline]); the row split is in nvme_row_split.cpp.
#include "optim/nvme_states.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/parallel.h"
#include "offload/io/scratch_dir.h"

namespace mw::optim {

int64_t staging_slot_bytes(int64_t slice_numel, int64_t largest_numel) {
  return round_up(8 * std::max<int64_t>(1, std::min(slice_numel, largest_numel)), 4096);
}

int64_t staging_window_bytes(int64_t window_bytes, int64_t slice_numel, int64_t largest_numel,
                             int64_t max_slices) {
  const int64_t slot = staging_slot_bytes(slice_numel, largest_numel);
  return std::min(std::max<int64_t>(2, window_bytes / slot), std::max<int64_t>(2, max_slices)) *
         slot;
}

std::vector<bool> select_nvme_offloaded(const std::vector<int64_t>& numels, double fraction) {
  MW_CHECK_T(InvalidArgument, fraction >= 0.0 && fraction <= 1.0,
             "nvme_offload_fraction must lie in [0, 1]; got ", fraction);
  int64_t total = 0;
  for (int64_t n : numels) total += n;
  const auto limit = static_cast<int64_t>(std::floor(static_cast<double>(total) * fraction));
  std::vector<bool> chosen(numels.size(), false);
  int64_t taken = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    if (taken + numels[i] <= limit) {
      chosen[i] = true;
      taken += numels[i];
    }
  }
  return chosen;
}

NvmeAdamStates::NvmeAdamStates(std::vector<int64_t> numels, NvmeOffloadOptions options, Isa isa)
    : options_(std::move(options)), isa_(isa), numels_(std::move(numels)) {
  MW_CHECK_T(InvalidArgument, options_.slice_numel > 0 && options_.slice_numel % 1024 == 0,
             "NVMe slice_numel must be a positive multiple of 1024 (so slots stay 4096-aligned); "
             "got ",
             options_.slice_numel);
  std::vector<io::StagingItem> items;
  for (size_t k = 0; k < numels_.size(); ++k) {
    first_slice_.push_back(static_cast<int64_t>(slices_.size()));
    for (int64_t off = 0; off < numels_[k]; off += options_.slice_numel) {
      Slice s;
      s.param = static_cast<int>(k);
      s.offset = off;
      s.numel = std::min(options_.slice_numel, numels_[k] - off);
      items.push_back({str("adam.", k, ".", off / options_.slice_numel), 8 * s.numel});
      slices_.push_back(s);
    }
  }
  first_slice_.push_back(static_cast<int64_t>(slices_.size()));
  // Expected order before any step: parameters last to first (the backward pass's order), each
  // parameter's slices front to back.
  std::vector<int64_t> order;
  for (int64_t k = static_cast<int64_t>(numels_.size()) - 1; k >= 0; --k)
    for (int64_t id = first_slice_[k]; id < first_slice_[k + 1]; ++id) order.push_back(id);

  const bool private_dir = options_.dir.empty();
  dir_ = private_dir ? io::make_private_dir("nvme") : options_.dir;
  try {
    engine_ = io::IoEngine::create(options_.io);
    io::SwapOptions swap_options;
    swap_options.file_stem = "memwall-adam";
    swap_ = std::make_unique<io::SwapSpace>(std::vector<std::string>{dir_}, *engine_, swap_options);
  } catch (...) {
    if (private_dir) ::rmdir(dir_.c_str());
    throw;
  }
  // Note [NVMe files]: nothing stays behind, whatever way the process ends.
  for (const std::string& path : swap_->file_paths()) ::unlink(path.c_str());
  if (private_dir) ::rmdir(dir_.c_str());

  io::StagingOptions staging;
  staging.slot_bytes = slot_bytes();  // m then v of one slice
  staging.window_bytes = options_.window_bytes;
  staging.record_times = options_.record_timeline;
  window_ = std::make_unique<io::StagingWindow>(std::move(items), std::move(order), *swap_,
                                                *engine_, staging);
  stats_.direct = swap_->direct();
  submitted_.assign(numels_.size(), 0);
  splits_.resize(numels_.size());
  no_decay_.resize(numels_.size());
  split_param_.assign(numels_.size(), 0);
  serial_updates_ = available_cores() <= num_threads();
  updater_thread_ = std::thread([this] { updater(); });
}

// Note [Serial updates beside busy cores]: the updater thread steps the slices while backward
// runs on the compute threads. Split over oneTBB's workers, each slice's Adam pulls those same
// threads off backward's products, and on a machine whose cores all compute that costs more than
// the work itself: GPT-2 small B4 T128 on 2 cores (nvme_step_bench --steps 11, four alternated
// runs each, session 23), split 1.053-1.066x the in-memory step, serial on the updater's own
// thread 1.045-1.051x, with the same bits (adam_update_parallel is bitwise adam_update). With
// cores to spare the split stays: a serial updater could fall behind a fast backward.

NvmeAdamStates::~NvmeAdamStates() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    drain_locked(lock);  // jobs point at parameters and gradients that their owners free next
    stop_ = true;
  }
  cv_.notify_all();
  updater_thread_.join();
  window_.reset();  // joins its pump and transfers
  swap_.reset();    // joins its handles, closes the (already unlinked) file
  engine_.reset();
}

double NvmeAdamStates::now_ms() const { return window_->now_ms(); }

SliceTiming& NvmeAdamStates::timing_locked(int64_t id) {
  Slice& s = slices_[id];
  if (s.timing < 0) {
    s.timing = static_cast<int64_t>(timeline_.size());
    timeline_.push_back({s.param, s.offset, s.numel});
  }
  return timeline_[s.timing];
}

// ---- the narrow interface (Note [NVMe pipeline]) -----------------------------------------------

bool NvmeAdamStates::admit(bool ok, const std::string& why) {
  if (!ok) window_->fail(std::make_exception_ptr(InvalidArgument(why)));
  return ok;
}

uint64_t NvmeAdamStates::submit_locked(Job job) {
  job.ticket = next_ticket_++;
  if (job.keep.defined()) {
    stats_.queued_grad_bytes += job.keep.nbytes();
    stats_.queued_grad_bytes_max = std::max(stats_.queued_grad_bytes_max, stats_.queued_grad_bytes);
  }
  jobs_.push_back(std::move(job));
  cv_.notify_all();
  return next_ticket_ - 1;
}

uint64_t NvmeAdamStates::update(int k, const AdamStepScalars& scalars, float* param, Tensor grad) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (window_->failed()) return 0;
  const bool in_range = k >= 0 && k < param_count();
  if (in_range && splits_[k].active) {  // the rows a row split deferred
    if (!admit(grad.is_contiguous() && !splits_[k].rows_submitted,
               str("NVMe-offloaded parameter ", k,
                   ": its deferred rows were updated twice, or their gradient is not contiguous")))
      return 0;
    splits_[k].rows_submitted = true;
    return submit_locked(Job::holding(Job::Kind::kRows, k, scalars, param, std::move(grad)));
  }
  if (!admit(in_range && !submitted_[k] && grad.is_contiguous(),
             str("NVMe-offloaded parameter ", k,
                 " was updated twice in one step (or is out of range, or its gradient "
                 "is not contiguous). overlap_backward updates in one backward per "
                 "optimizer step: under gradient accumulation set_final_backward(true) "
                 "for the last micro-batch only, or turn overlap_backward off")))
    return 0;
  submitted_[k] = 1;
  promote_locked(k);
  return submit_locked(Job::holding(Job::Kind::kWhole, k, scalars, param, std::move(grad)));
}

bool NvmeAdamStates::awaits_update(int k) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !submitted_[k] || (splits_[k].active && !splits_[k].rows_submitted);
}

bool NvmeAdamStates::updated_this_step(int k) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return submitted_[k] != 0;
}

void NvmeAdamStates::drain_locked(std::unique_lock<std::mutex>& lock) {
  cv_.wait(lock, [&] { return done_ticket_ + 1 == next_ticket_; });
}

void NvmeAdamStates::wait(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mutex_);
  const double t = now_ms();
  cv_.wait(lock, [&] { return done_ticket_ >= ticket; });
  stats_.join_wait_ms += now_ms() - t;
}

bool NvmeAdamStates::done(uint64_t ticket) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_ticket_ >= ticket;
}

void NvmeAdamStates::mark_done_locked(uint64_t ticket) {
  completed_.insert(ticket);
  while (!completed_.empty() && *completed_.begin() == done_ticket_ + 1) {
    completed_.erase(completed_.begin());
    ++done_ticket_;
  }
  cv_.notify_all();
}

void NvmeAdamStates::promote_locked(int k) {
  if (window_->written(first_slice_[k])) return;  // the learned order holds from the second step
  if (std::find(promoted_.begin(), promoted_.end(), k) != promoted_.end()) return;
  promoted_.push_back(k);
  std::vector<int64_t> order;
  for (int p : promoted_)
    for (int64_t id = first_slice_[p]; id < first_slice_[p + 1]; ++id) order.push_back(id);
  const size_t promoted_slices = order.size();
  for (int64_t id : window_->order())
    if (std::find(promoted_.begin(), promoted_.end(), slices_[id].param) == promoted_.end())
      order.push_back(id);
  window_->reorder(std::move(order), promoted_slices);
}

// ---- the updater thread (Note [NVMe pipeline]) -------------------------------------------------

void NvmeAdamStates::run_job(const Job& job) {
  if (job.kind == Job::Kind::kRows) {
    finish_rows(job);
    return;
  }
  for (int64_t id = first_slice_[job.k]; id < first_slice_[job.k + 1]; ++id) {
    if (window_->failed()) break;
    update_slice(id, job);
  }
}

// Jobs whose gradient waits in memory (whole parameters, the split's last rows) go first; a row
// split's slices fill the gaps between them, one slice at a time (Note [Row-split update]): the
// blocks' gradients are then freed as fast as their states arrive, while the embedding, whose
// gradient exists anyway until the end of backward, streams in between.
void NvmeAdamStates::updater() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !jobs_.empty() || !split_work_.empty(); });
    if (!jobs_.empty()) {
      Job job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      try {
        run_job(job);
      } catch (...) {
        window_->fail(std::current_exception());
      }
      const int64_t held = job.keep.defined() ? job.keep.nbytes() : 0;
      if (job.keep.defined()) donate(std::move(job.keep));  // spent: lend it, or free it
      lock.lock();
      stats_.queued_grad_bytes -= held;
      mark_done_locked(job.ticket);
    } else if (!split_work_.empty()) {
      SplitWork& w = split_work_.front();  // deque: stays valid while others are queued
      const int64_t id = w.next++;
      const bool last = w.next == first_slice_[w.job.k + 1];
      lock.unlock();
      try {
        if (!window_->failed()) update_slice(id, w.job);
      } catch (...) {
        window_->fail(std::current_exception());
      }
      lock.lock();
      if (last || window_->failed()) {
        mark_done_locked(w.job.ticket);
        split_work_.pop_front();
      }
    } else {
      return;  // stop_
    }
  }
}

// One slice: its m and v from the window, Adam on them in the slot, and back behind.
void NvmeAdamStates::update_slice(int64_t id, const Job& job) {
  io::StagingLease lease = window_->acquire(id);
  if (!lease) return;      // read-ahead stopped at a failure: the slice keeps its old p, m, v
  if (lease.read_error) {  // the slice keeps its old p, m, v (Note [NVMe failure guarantee])
    window_->release(lease);
    return;
  }
  auto* m = static_cast<float*>(lease.data);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    overlay_held_locked(id, m);  // Note [Row-split update]
    if (options_.record_timeline) timing_locked(id).compute_start_ms = now_ms();
  }
  std::vector<Pages> pages = step_slice(id, job, m);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stepped_locked(id, job, std::move(pages));
    if (options_.record_timeline) timing_locked(id).compute_end_ms = now_ms();
    drop_held_locked(id);  // the write-back supersedes them
  }
  window_->write_back(lease);
}

void NvmeAdamStates::donate(Tensor buffer) {
  const int64_t slot_bytes = this->slot_bytes();
  if (!options_.borrow_gradient_slots || !buffer.defined() || buffer.nbytes() < slot_bytes ||
      buffer.dtype() != DType::F32 || !buffer.device().is_host_addressable() ||
      buffer.offset() != 0 || buffer.impl_ptr().use_count() != 1 ||
      buffer.storage().use_count() != 1)
    return;  // dropped here: freed unless someone else holds it
  // Enough to hold the largest parameter's states (the tied embedding, consumed last) is all
  // that helps; beyond that, spent gradients are better freed for reuse.
  int64_t limit = 0;
  for (int64_t n : numels_) limit = std::max(limit, round_up(8 * n, slot_bytes));
  if (!window_->lend(buffer.raw_data(), buffer.nbytes(), limit)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  donors_.push_back(std::move(buffer));
}

int64_t NvmeAdamStates::slot_bytes() const {
  int64_t largest = 0;
  for (int64_t n : numels_) largest = std::max(largest, n);
  return staging_slot_bytes(options_.slice_numel, largest);
}

bool NvmeAdamStates::failed() const { return window_->failed(); }

void NvmeAdamStates::finish_step() {
  std::unique_lock<std::mutex> lock(mutex_);
  const double t = now_ms();
  drain_locked(lock);
  // The step's read times, before end_round() lets the next step's reads replace them.
  last_timeline_ids_.clear();
  for (SliceTiming& tm : timeline_) {
    const int64_t id = first_slice_[tm.param] + tm.offset / options_.slice_numel;
    const io::StagingTimes w = window_->times(id);
    tm.read_issue_ms = w.read_issue_ms;
    tm.read_done_ms = w.read_done_ms;
    tm.spare = w.spare;
    last_timeline_ids_.push_back(id);
    slices_[id].timing = -1;
  }
  last_timeline_ = std::move(timeline_);
  timeline_.clear();
  window_->end_round();  // waits for the lent slots; the next step's reads start now
  stats_.flush_wait_ms += now_ms() - t;
  donors_.clear();
  // A row split whose rows never came (backward did not reach the embedding): its pages equal
  // what is on disk, and those rows stay at the old step (Note [NVMe failure guarantee]).
  for (RowSplit& rs : splits_) rs = RowSplit();
  std::fill(submitted_.begin(), submitted_.end(), 0);
  promoted_.clear();
  if (std::exception_ptr error = window_->error()) std::rethrow_exception(error);
}

void NvmeAdamStates::flush() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    drain_locked(lock);
  }
  window_->await_write_backs();
  if (std::exception_ptr error = window_->error()) std::rethrow_exception(error);
}

// ---- checkpoints ------------------------------------------------------------------------------

int64_t NvmeAdamStates::read_slice(int k, int64_t i, float* m_out, float* v_out) {
  std::unique_lock<std::mutex> lock(mutex_);
  drain_locked(lock);
  const int64_t id = first_slice_[k] + i;
  MW_CHECK_T(InvalidArgument, id < first_slice_[k + 1], "slice ", i, " of parameter ", k,
             " out of range");
  window_->pause();
  const Slice& s = slices_[id];
  auto* m = static_cast<float*>(window_->load(id));
  overlay_held_locked(id, m);  // Note [Row-split update]
  std::memcpy(m_out, m, static_cast<size_t>(4 * s.numel));
  std::memcpy(v_out, m + s.numel, static_cast<size_t>(4 * s.numel));
  return s.step;
}

void NvmeAdamStates::write_slice(int k, int64_t i, const float* m_in, const float* v_in,
                                 int64_t step) {
  std::unique_lock<std::mutex> lock(mutex_);
  drain_locked(lock);
  const int64_t id = first_slice_[k] + i;
  MW_CHECK_T(InvalidArgument, id < first_slice_[k + 1], "slice ", i, " of parameter ", k,
             " out of range");
  window_->pause();
  Slice& s = slices_[id];
  auto* m = static_cast<float*>(window_->store_buffer());
  std::memcpy(m, m_in, static_cast<size_t>(4 * s.numel));
  std::memcpy(m + s.numel, v_in, static_cast<size_t>(4 * s.numel));
  drop_held_locked(id);
  window_->store(id);
  s.step = step;
}

void NvmeAdamStates::resume_prefetch() { window_->resume(); }

int64_t NvmeAdamStates::slice_count(int k) const { return first_slice_[k + 1] - first_slice_[k]; }

int64_t NvmeAdamStates::slice_step(int k, int64_t i) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return slices_[first_slice_[k] + i].step;
}

NvmeStats NvmeAdamStates::stats() const {
  NvmeStats s;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s = stats_;
  }
  const io::StagingStats w = window_->stats();
  s.consumer_wait_ms = w.consumer_wait_ms;
  s.spare_slices = w.spare_items;
  s.staging_bytes = w.staging_bytes;
  s.borrowed_bytes_max = w.lent_bytes_max;
  s.registered_slots = w.registered;
  const io::IoStats io = engine_->stats();
  s.bytes_read = io.bytes_read;
  s.bytes_written = io.bytes_written;
  s.fixed_transfers = io.fixed_transfers;
  s.file_bytes = swap_->file_bytes();
  return s;
}

std::vector<SliceTiming> NvmeAdamStates::last_timeline() const {
  window_->await_write_backs();  // the step's last write-backs may still be in flight
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<SliceTiming> out = last_timeline_;
  for (size_t j = 0; j < out.size(); ++j) {
    const io::StagingTimes tm = window_->times(last_timeline_ids_[j]);
    out[j].write_issue_ms = tm.write_issue_ms;
    out[j].write_done_ms = tm.write_done_ms;
  }
  return out;
}

}  // namespace mw::optim
