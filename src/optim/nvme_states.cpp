// NvmeAdamStates (nvme_states.h): slices, slots, the pump thread, failure handling.
#include "optim/nvme_states.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "offload/io/scratch_dir.h"

namespace mw::optim {

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
    : options_(std::move(options)),
      isa_(isa),
      numels_(std::move(numels)),
      t0_(std::chrono::steady_clock::now()) {
  MW_CHECK_T(InvalidArgument, options_.slice_numel > 0 && options_.slice_numel % 1024 == 0,
             "NVMe slice_numel must be a positive multiple of 1024 (so slots stay 4096-aligned); "
             "got ",
             options_.slice_numel);
  for (size_t k = 0; k < numels_.size(); ++k) {
    first_slice_.push_back(static_cast<int64_t>(slices_.size()));
    for (int64_t off = 0; off < numels_[k]; off += options_.slice_numel) {
      Slice s;
      s.param = static_cast<int>(k);
      s.offset = off;
      s.numel = std::min(options_.slice_numel, numels_[k] - off);
      s.key = str("adam.", k, ".", off / options_.slice_numel);
      slices_.push_back(std::move(s));
    }
  }
  first_slice_.push_back(static_cast<int64_t>(slices_.size()));
  // Expected order before any step: parameters last to first (the backward pass's order), each
  // parameter's slices front to back.
  for (int64_t k = static_cast<int64_t>(numels_.size()) - 1; k >= 0; --k)
    for (int64_t id = first_slice_[k]; id < first_slice_[k + 1]; ++id) order_.push_back(id);

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

  const int64_t slot_bytes = 8 * options_.slice_numel;
  const int64_t nslots = std::max<int64_t>(2, options_.window_bytes / slot_bytes);
  slots_.resize(static_cast<size_t>(nslots));
  owned_slots_ = slots_.size();
  for (Slot& s : slots_) s.buf = AlignedBuffer(slot_bytes);
  stats_.staging_bytes = nslots * slot_bytes;
  // Every transfer of a step goes through these slots: pin them once (Note [Registered buffers]).
  std::vector<std::pair<void*, int64_t>> pinned;
  for (Slot& s : slots_) pinned.emplace_back(s.buf.data(), s.buf.size());
  stats_.registered_slots = engine_->register_buffers(pinned);
  stats_.direct = swap_->direct();
  submitted_.assign(numels_.size(), 0);
  splits_.resize(numels_.size());
  split_param_.assign(numels_.size(), 0);
  pump_thread_ = std::thread([this] { pump(); });
  updater_thread_ = std::thread([this] { updater(); });
}

NvmeAdamStates::~NvmeAdamStates() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    drain_locked(lock);  // jobs point at parameters and gradients that their owners free next
    stop_ = true;
  }
  cv_.notify_all();
  pump_thread_.join();
  updater_thread_.join();
  for (Slot& s : slots_) s.handle.join();
  swap_.reset();  // joins its handles, closes the (already unlinked) file
  engine_.reset();
}

double NvmeAdamStates::now_ms() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
}

SliceTiming& NvmeAdamStates::timing_locked(int64_t id) {
  Slice& s = slices_[id];
  if (s.timing < 0) {
    s.timing = static_cast<int64_t>(timeline_.size());
    timeline_.push_back({s.param, s.offset, s.numel});
  }
  return timeline_[s.timing];
}

int NvmeAdamStates::free_slot_locked() const {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].state == SlotState::kFree) return static_cast<int>(i);
  return -1;
}

void NvmeAdamStates::record_error_locked(std::exception_ptr e) {
  if (!error_) error_ = e;
  failed_ = true;
}

void NvmeAdamStates::start_read_locked(int64_t id, int slot_index) {
  Slice& s = slices_[id];
  Slot& slot = slots_[slot_index];
  slot.slice = id;
  slot.read_error = nullptr;
  s.slot = slot_index;
  if (!s.on_disk) {  // never written: Adam's initial state is zeros
    std::memset(slot.data(), 0, static_cast<size_t>(8 * s.numel));
    slot.state = SlotState::kReady;
    return;
  }
  if (options_.record_timeline) timing_locked(id).read_issue_ms = now_ms();
  slot.state = SlotState::kReading;
  try {
    slot.handle = swap_->read(s.key, slot.data());
    io_fifo_.push_back(slot_index);
  } catch (...) {
    slot.read_error = std::current_exception();
    slot.state = SlotState::kReady;
  }
}

void NvmeAdamStates::finish_write_locked(int slot_index, std::exception_ptr error) {
  Slot& slot = slots_[slot_index];
  Slice& s = slices_[slot.slice];
  if (options_.record_timeline) {
    if (s.timing >= 0) {
      timeline_[s.timing].write_done_ms = now_ms();
    } else {  // a write-back that finished after its step ended (Note [NVMe pipeline])
      for (SliceTiming& t : last_timeline_)
        if (t.param == s.param && t.offset == s.offset && t.write_done_ms < 0)
          t.write_done_ms = now_ms();
    }
  }
  if (error) {
    // Note [NVMe failure guarantee]: the new m, v stay in RAM; the slot gets a fresh buffer.
    record_error_locked(error);
    AlignedBuffer copy(8 * options_.slice_numel);
    std::memcpy(copy.data(), slot.data(), static_cast<size_t>(8 * s.numel));
    dirty_.emplace_back(slot.slice, std::move(copy));
  }
  s.slot = -1;
  slot.slice = -1;
  slot.state = SlotState::kFree;
}

void NvmeAdamStates::pump() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (stop_) return;
    // Read ahead into every free slot, in the expected order: two streams, the row-split
    // parameters' slices and the others', each holding at most half of the slots while the other
    // has slices left (Note [Row-split update]: the updater interleaves the two by timing).
    bool issued = false;
    while (prefetch_enabled_ && !failed_) {
      const int f = free_slot_locked();
      if (f < 0) break;
      int held[2] = {0, 0};
      for (const Slot& slot : slots_)
        if (slot.slice >= 0 &&
            (slot.state == SlotState::kReading || slot.state == SlotState::kReady))
          ++held[split_param_[slices_[slot.slice].param] ? 1 : 0];
      const int64_t next[2] = {next_in_stream_locked(cursor_, false),
                               next_in_stream_locked(split_cursor_, true)};
      const int64_t half = static_cast<int64_t>(slots_.size() + 1) / 2;
      int stream = -1;
      for (int st : {0, 1}) {
        if (next[st] < 0) continue;  // exhausted, or waiting for a write-back
        if (held[st] < half || next[1 - st] < 0) {
          stream = st;
          break;
        }
      }
      if (stream < 0) break;
      start_read_locked(next[stream], f);
      ++(stream == 0 ? cursor_ : split_cursor_);
      issued = true;
    }
    if (issued) cv_.notify_all();
    if (io_fifo_.empty()) {
      cv_.wait(lock);
      continue;
    }
    // Reap the oldest transfer.
    const int slot_index = io_fifo_.front();
    io_fifo_.pop_front();
    io::IoHandle handle = slots_[slot_index].handle;
    reaping_slot_ = slot_index;
    lock.unlock();
    std::exception_ptr error;
    try {
      handle.wait();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    reaping_slot_ = -1;
    Slot& slot = slots_[slot_index];
    if (slot.state == SlotState::kReading) {
      if (options_.record_timeline) timing_locked(slot.slice).read_done_ms = now_ms();
      if (!error) overlay_held_locked(slot.slice, slot.data());
      slot.read_error = error;
      slot.state = SlotState::kReady;
    } else {
      finish_write_locked(slot_index, error);
    }
    cv_.notify_all();
  }
}

// ---- submitting (any thread) and the updater thread (Note [NVMe pipeline]) ----------------------

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

void NvmeAdamStates::drain_locked(std::unique_lock<std::mutex>& lock) {
  cv_.wait(lock, [&] { return done_ticket_ + 1 == next_ticket_; });
}

void NvmeAdamStates::wait(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mutex_);
  const double t = now_ms();
  cv_.wait(lock, [&] { return done_ticket_ >= ticket; });
  stats_.join_wait_ms += now_ms() - t;
}

namespace {
// Records the first misuse as the step's error (thrown by finish_step) rather than throwing into
// a hook, as an I/O failure is.
bool admit(bool ok, std::exception_ptr& error, bool& failed, const std::string& why) {
  if (ok) return true;
  if (!error) error = std::make_exception_ptr(InvalidArgument(why));
  failed = true;
  return false;
}
}  // namespace

int64_t NvmeAdamStates::next_in_stream_locked(size_t& cursor, bool split) {
  for (; cursor < order_.size(); ++cursor) {
    const Slice& s = slices_[order_[cursor]];
    if (static_cast<bool>(split_param_[s.param]) != split) continue;
    if (s.consumed || (s.slot >= 0 && slots_[s.slot].state != SlotState::kWriting))
      continue;                  // taken by the spare path, or still held from an earlier prefetch
    if (s.slot >= 0) return -1;  // its last write is in flight: wait for it
    return order_[cursor];
  }
  return -1;
}

bool NvmeAdamStates::done(uint64_t ticket) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_ticket_ >= ticket;
}

uint64_t NvmeAdamStates::update_async(int k, const AdamStepScalars& scalars, float* param,
                                      Tensor grad) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failed_ ||
      !admit(k >= 0 && k < param_count() && !submitted_[k] && grad.is_contiguous(), error_, failed_,
             str("NVMe-offloaded parameter ", k,
                 " was updated twice in one step (or is out of range, or its gradient "
                 "is not contiguous). overlap_backward assumes one backward per "
                 "optimizer step; turn it off for gradient accumulation")))
    return 0;
  submitted_[k] = 1;
  promote_locked(k);
  return submit_locked(Job::holding(Job::Kind::kWhole, k, scalars, param, std::move(grad)));
}

uint64_t NvmeAdamStates::update_except_rows_async(int k, const AdamStepScalars& scalars,
                                                  float* param, const void* grad, DType grad_dtype,
                                                  int64_t row_numel,
                                                  std::vector<int64_t> pending_rows) {
  std::lock_guard<std::mutex> lock(mutex_);
  const bool shape_ok = k >= 0 && k < param_count() && row_numel > 0 && numels_[k] % row_numel == 0;
  if (failed_ || !admit(shape_ok && !submitted_[k], error_, failed_,
                        str("row split of NVMe-offloaded parameter ", k, " (rows of ", row_numel,
                            " elements): out of range, not whole rows, or updated twice")))
    return 0;
  const int64_t nrows = numels_[k] / row_numel;
  RowSplit& rs = splits_[k];
  rs = RowSplit();
  for (size_t i = 0; i < pending_rows.size(); ++i) {
    const int64_t r = pending_rows[i];
    if (!admit(
            r >= 0 && r < nrows && (i == 0 || r > pending_rows[i - 1]), error_, failed_,
            str("row split of NVMe-offloaded parameter ", k, ": pending row ids must be sorted, ",
                "distinct and in [0, ", nrows, "); got ", r, " at position ", i)))
      return 0;
    if (!rs.ranges.empty() && rs.ranges.back().second == r * row_numel)
      rs.ranges.back().second += row_numel;  // consecutive rows: one range
    else
      rs.ranges.emplace_back(r * row_numel, (r + 1) * row_numel);
  }
  rs.active = true;
  if (!split_param_[k]) {  // from now on its slices are a read stream of their own
    split_param_[k] = 1;
    cursor_ = split_cursor_ = 0;
  }
  stats_.split_rows = static_cast<int64_t>(pending_rows.size());
  submitted_[k] = 1;
  promote_locked(k);
  Job job = Job::of(Job::Kind::kExceptRows, k, scalars, param, grad, grad_dtype);
  job.ticket = next_ticket_++;
  const uint64_t ticket = job.ticket;
  split_work_.push_back({std::move(job), first_slice_[k]});
  cv_.notify_all();
  return ticket;
}

void NvmeAdamStates::update_rows_async(int k, const AdamStepScalars& scalars, float* param,
                                       Tensor grad) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failed_ || !admit(k >= 0 && k < param_count() && splits_[k].active && grad.is_contiguous(),
                        error_, failed_,
                        str("update_rows_async: parameter ", k,
                            " has no row split waiting for its rows this step")))
    return;
  submit_locked(Job::holding(Job::Kind::kRows, k, scalars, param, std::move(grad)));
}

bool NvmeAdamStates::rows_pending(int k) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return splits_[k].active;
}

void NvmeAdamStates::mark_done_locked(uint64_t ticket) {
  completed_.insert(ticket);
  while (!completed_.empty() && *completed_.begin() == done_ticket_ + 1) {
    completed_.erase(completed_.begin());
    ++done_ticket_;
  }
  cv_.notify_all();
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
        if (job.kind == Job::Kind::kRows) {
          finish_rows(job);
        } else {
          for (int64_t id = first_slice_[job.k]; id < first_slice_[job.k + 1]; ++id) {
            {
              std::lock_guard<std::mutex> relock(mutex_);
              if (failed_) break;
            }
            update_slice(id, job);
          }
        }
      } catch (...) {
        std::lock_guard<std::mutex> relock(mutex_);
        record_error_locked(std::current_exception());
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
      const bool skip = failed_;
      lock.unlock();
      try {
        if (!skip) update_slice(id, w.job);
      } catch (...) {
        std::lock_guard<std::mutex> relock(mutex_);
        record_error_locked(std::current_exception());
      }
      lock.lock();
      if (last || failed_) {
        mark_done_locked(w.job.ticket);
        split_work_.pop_front();
      }
    } else {
      return;  // stop_
    }
  }
}

// ---- Note [Row-split update] ------------------------------------------------------------------

namespace {
// Calls f(lo, hi) for each pending element range of a row split, clipped to [offset, end).
template <typename F>
void for_each_pending(const std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t offset,
                      int64_t end, F f) {
  auto it = std::partition_point(ranges.begin(), ranges.end(),
                                 [&](const auto& r) { return r.second <= offset; });
  for (; it != ranges.end() && it->first < end; ++it)
    f(std::max(it->first, offset), std::min(it->second, end));
}
}  // namespace

std::vector<NvmeAdamStates::Pages> NvmeAdamStates::step_slice(int64_t id, const Job& job,
                                                              float* m) {
  const Slice& s = slices_[id];  // offset and numel never change
  const int64_t esize = dtype_size(job.grad_dtype);
  float* v = m + s.numel;
  auto step_range = [&](int64_t lo, int64_t hi) {  // element indices of the parameter
    adam_update_parallel(isa_, job.scalars, job.param + lo, job.grad + lo * esize, job.grad_dtype,
                         m + (lo - s.offset), v + (lo - s.offset), hi - lo);
  };
  const int64_t end = s.offset + s.numel;
  if (job.kind != Job::Kind::kExceptRows) {
    step_range(s.offset, end);
    return {};
  }
  // The ranges were fixed before the job was queued and change only after it ran.
  std::vector<std::pair<int64_t, int64_t>> spans;  // bytes of the blob holding pending m and v
  int64_t pos = s.offset;
  for_each_pending(splits_[job.k].ranges, s.offset, end, [&](int64_t lo, int64_t hi) {
    if (pos < lo) step_range(pos, lo);
    spans.emplace_back(4 * (lo - s.offset) / 4096 * 4096, round_up(4 * (hi - s.offset), 4096));
    spans.emplace_back(4 * (s.numel + lo - s.offset) / 4096 * 4096,
                       round_up(4 * (s.numel + hi - s.offset), 4096));
    pos = hi;
  });
  if (pos < end) step_range(pos, end);
  std::sort(spans.begin(), spans.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (auto [a, b] : spans) {
    if (!merged.empty() && a <= merged.back().second)
      merged.back().second = std::max(merged.back().second, b);
    else
      merged.emplace_back(a, b);
  }
  // Copied after the other rows were stepped: the pages then equal what the write-back puts on
  // disk, except in the pending rows.
  std::vector<Pages> pages;
  for (auto [a, b] : merged) {
    Pages pg;
    pg.offset = a;
    pg.bytes = AlignedBuffer(b - a);
    std::memcpy(pg.bytes.data(), reinterpret_cast<const char*>(m) + a, static_cast<size_t>(b - a));
    pages.push_back(std::move(pg));
  }
  return pages;
}

void NvmeAdamStates::finish_rows(const Job& job) {
  RowSplit& rs = splits_[job.k];  // only the updater touches it while the split is active
  std::vector<std::pair<int64_t, std::vector<Pages>>> set_aside;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) return;  // the pending rows stay one step behind (Note [NVMe failure guarantee])
    set_aside = std::move(rs.set_aside);
  }
  const int64_t esize = dtype_size(job.grad_dtype);
  for (auto& [id, pages] : set_aside) {
    const Slice& s = slices_[id];
    auto at = [&](int64_t byte) {
      for (Pages& pg : pages)
        if (byte >= pg.offset && byte < pg.offset + pg.bytes.size())
          return reinterpret_cast<float*>(static_cast<char*>(pg.bytes.data()) + byte - pg.offset);
      throw Error(str("NVMe row split: byte ", byte, " of slice ", s.key, " was not set aside"));
    };
    for_each_pending(rs.ranges, s.offset, s.offset + s.numel, [&](int64_t lo, int64_t hi) {
      adam_update_parallel(isa_, job.scalars, job.param + lo, job.grad + lo * esize, job.grad_dtype,
                           at(4 * (lo - s.offset)), at(4 * (s.numel + lo - s.offset)), hi - lo);
    });
    std::lock_guard<std::mutex> lock(mutex_);
    slices_[id].step = job.scalars.step;
    for (const Pages& pg : pages) stats_.held_bytes += pg.bytes.size();
    stats_.held_bytes_max = std::max(stats_.held_bytes_max, stats_.held_bytes);
    held_[id] = std::move(pages);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  rs = RowSplit();
}

void NvmeAdamStates::overlay_held_locked(int64_t id, float* m) {
  auto it = held_.find(id);
  if (it == held_.end()) return;
  for (const Pages& pg : it->second)
    std::memcpy(reinterpret_cast<char*>(m) + pg.offset, pg.bytes.data(), pg.bytes.size());
}

void NvmeAdamStates::drop_held_locked(int64_t id) {
  auto it = held_.find(id);
  if (it == held_.end()) return;
  for (const Pages& pg : it->second) stats_.held_bytes -= pg.bytes.size();
  held_.erase(it);
}

// ---- one slice, on the updater thread ---------------------------------------------------------

void NvmeAdamStates::stepped_locked(int64_t id, const Job& job, std::vector<Pages> pages) {
  Slice& s = slices_[id];
  s.on_disk = true;  // its write-back follows
  if (pages.empty())
    s.step = job.scalars.step;
  else  // its pending rows come later (finish_rows), which then counts the step
    splits_[job.k].set_aside.emplace_back(id, std::move(pages));
}

void NvmeAdamStates::update_slice(int64_t id, const Job& job) {
  std::unique_lock<std::mutex> lock(mutex_);
  Slice& s = slices_[id];
  consumed_order_.push_back(id);
  auto present = [&] {
    return s.slot >= 0 && (slots_[s.slot].state == SlotState::kReady ||
                           slots_[s.slot].state == SlotState::kReading);
  };
  auto stalled = [&] {  // every slot holds another slice's read: only the spare path can go on
    for (const Slot& slot : slots_)
      if (slot.state == SlotState::kFree || slot.state == SlotState::kWriting) return false;
    return true;
  };
  const double wait_start = now_ms();
  cv_.wait(lock, [&] { return present() || stalled() || stop_ || failed_; });
  if (failed_ && !present()) return;  // read-ahead stopped at the failure: leave the slice as is

  if (!present()) {  // the spare path: read, update and write back synchronously
    s.consumed = true;
    ++stats_.spare_slices;
    if (spare_.size() == 0) {
      spare_ = AlignedBuffer(8 * options_.slice_numel);
      stats_.staging_bytes += spare_.size();
    }
    const bool on_disk = s.on_disk;
    if (options_.record_timeline) timing_locked(id).spare = true;
    lock.unlock();
    float* m = static_cast<float*>(spare_.data());
    if (on_disk)
      swap_->read(s.key, m).wait();
    else
      std::memset(m, 0, static_cast<size_t>(8 * s.numel));
    lock.lock();
    overlay_held_locked(id, m);
    if (options_.record_timeline) timing_locked(id).compute_start_ms = now_ms();
    lock.unlock();
    std::vector<Pages> pages = step_slice(id, job, m);
    lock.lock();
    if (options_.record_timeline) {
      SliceTiming& t = timing_locked(id);
      t.compute_end_ms = t.write_issue_ms = now_ms();
    }
    drop_held_locked(id);  // the write below supersedes them
    lock.unlock();
    std::exception_ptr error;
    try {
      swap_->write(s.key, m, 8 * s.numel).wait();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (options_.record_timeline) timing_locked(id).write_done_ms = now_ms();
    stepped_locked(id, job, std::move(pages));
    if (error) {
      record_error_locked(error);
      AlignedBuffer copy(8 * options_.slice_numel);
      std::memcpy(copy.data(), m, static_cast<size_t>(8 * s.numel));
      dirty_.emplace_back(id, std::move(copy));
    }
    return;
  }

  Slot& slot = slots_[s.slot];
  cv_.wait(lock, [&] { return slot.state == SlotState::kReady || stop_; });
  stats_.consumer_wait_ms += now_ms() - wait_start;
  s.consumed = true;
  if (slot.read_error) {  // the slice keeps its old p, m, v (Note [NVMe failure guarantee])
    record_error_locked(slot.read_error);
    slot.read_error = nullptr;
    slot.state = SlotState::kFree;
    slot.slice = -1;
    s.slot = -1;
    cv_.notify_all();
    return;
  }
  slot.state = SlotState::kBusy;
  if (options_.record_timeline) timing_locked(id).compute_start_ms = now_ms();
  lock.unlock();
  float* m = slot.data();
  std::vector<Pages> pages = step_slice(id, job, m);
  lock.lock();
  stepped_locked(id, job, std::move(pages));
  if (options_.record_timeline) {
    SliceTiming& t = timing_locked(id);
    t.compute_end_ms = t.write_issue_ms = now_ms();
  }
  drop_held_locked(id);  // the write-back supersedes them
  slot.state = SlotState::kWriting;
  try {
    slot.handle = swap_->write(s.key, m, 8 * s.numel);
    io_fifo_.push_back(s.slot);
  } catch (...) {  // e.g. ENOSPC while allocating file space
    finish_write_locked(s.slot, std::current_exception());
  }
  cv_.notify_all();
}

void NvmeAdamStates::promote_locked(int k) {
  if (slices_[first_slice_[k]].on_disk) return;  // the learned order holds from the second step
  if (std::find(promoted_.begin(), promoted_.end(), k) != promoted_.end()) return;
  promoted_.push_back(k);
  std::vector<int64_t> order;
  order.reserve(order_.size());
  for (int p : promoted_)
    for (int64_t id = first_slice_[p]; id < first_slice_[p + 1]; ++id) order.push_back(id);
  auto is_promoted = [&](int p) {
    return std::find(promoted_.begin(), promoted_.end(), p) != promoted_.end();
  };
  for (int64_t id : order_)
    if (!is_promoted(slices_[id].param)) order.push_back(id);
  order_ = std::move(order);
  cursor_ = split_cursor_ = 0;
  // Zero-filled prefetches of slices not asked for yet cost nothing to redo: free their slots.
  for (Slot& slot : slots_) {
    if (slot.state != SlotState::kReady || slot.slice < 0 || slot.read_error) continue;
    Slice& sl = slices_[slot.slice];
    if (sl.on_disk || sl.consumed || is_promoted(sl.param)) continue;
    sl.slot = -1;
    slot.slice = -1;
    slot.state = SlotState::kFree;
  }
  cv_.notify_all();
}

void NvmeAdamStates::donate(Tensor buffer) {
  const int64_t slot_bytes = 8 * options_.slice_numel;
  if (!options_.borrow_gradient_slots || !buffer.defined() || buffer.nbytes() < slot_bytes ||
      buffer.dtype() != DType::F32 || !buffer.device().is_host_addressable() ||
      buffer.offset() != 0 || buffer.impl_ptr().use_count() != 1 ||
      buffer.storage().use_count() != 1)
    return;  // dropped here: freed unless someone else holds it
  auto* base = static_cast<char*>(buffer.raw_data());
  if (reinterpret_cast<uintptr_t>(base) % kHostAlignment != 0) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) return;
    // Enough to hold the largest parameter's states (the tied embedding, consumed last) is all
    // that helps; beyond that, spent gradients are better freed for reuse.
    int64_t limit = 0;
    for (int64_t n : numels_) limit = std::max(limit, round_up(8 * n, slot_bytes));
    for (int64_t off = 0;
         off + slot_bytes <= buffer.nbytes() && borrowed_bytes_ + slot_bytes <= limit;
         off += slot_bytes) {
      Slot& slot = slots_.emplace_back();
      slot.borrowed = reinterpret_cast<float*>(base + off);
      borrowed_bytes_ += slot_bytes;
    }
    stats_.borrowed_bytes_max = std::max(stats_.borrowed_bytes_max, borrowed_bytes_);
    donors_.push_back(std::move(buffer));
  }
  cv_.notify_all();
}

bool NvmeAdamStates::updated_this_step(int k) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return submitted_[k] != 0;
}

bool NvmeAdamStates::failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_;
}

void NvmeAdamStates::finish_step() {
  std::unique_lock<std::mutex> lock(mutex_);
  const double t = now_ms();
  drain_locked(lock);
  // Borrowed slots go back to their gradients' owners, so their transfers must end; the owned
  // slots' last write-backs go on during the next forward.
  cv_.wait(lock, [&] {
    if (reaping_slot_ >= static_cast<int>(owned_slots_)) return false;
    for (size_t i = owned_slots_; i < slots_.size(); ++i) {
      const SlotState st = slots_[i].state;
      if (st == SlotState::kWriting || st == SlotState::kBusy || st == SlotState::kReading)
        return false;
    }
    return true;
  });
  stats_.flush_wait_ms += now_ms() - t;
  // A row split whose rows never came (backward did not reach the embedding): its pages equal
  // what is on disk, and those rows stay at the old step (Note [NVMe failure guarantee]).
  for (RowSplit& rs : splits_) rs = RowSplit();
  // Return the borrowed slots (Note [Borrowed gradient slots]). Unconsumed prefetches in them hold
  // unchanged data: drop them.
  while (slots_.size() > owned_slots_) {
    Slot& slot = slots_.back();
    if (slot.slice >= 0) slices_[slot.slice].slot = -1;
    slots_.pop_back();
  }
  donors_.clear();
  borrowed_bytes_ = 0;
  // The next step reads in the order this one consumed, then whatever it did not touch.
  std::vector<int64_t> next = consumed_order_;
  for (int64_t id : order_)
    if (!slices_[id].consumed) next.push_back(id);
  if (next.size() == order_.size()) order_ = std::move(next);
  consumed_order_.clear();
  for (Slice& s : slices_) {
    s.consumed = false;
    s.timing = -1;
  }
  std::fill(submitted_.begin(), submitted_.end(), 0);
  promoted_.clear();
  last_timeline_ = std::move(timeline_);
  timeline_.clear();
  cursor_ = split_cursor_ = 0;
  cv_.notify_all();
  if (error_) std::rethrow_exception(error_);
}

void NvmeAdamStates::await_write_backs_locked(std::unique_lock<std::mutex>& lock) const {
  cv_.wait(lock, [&] {
    for (const Slot& s : slots_)
      if (s.state == SlotState::kWriting) return false;
    return true;
  });
}

void NvmeAdamStates::flush() {
  std::unique_lock<std::mutex> lock(mutex_);
  drain_locked(lock);  // after it no slot is Busy
  await_write_backs_locked(lock);
  if (error_) std::rethrow_exception(error_);
}

void NvmeAdamStates::quiesce_locked(std::unique_lock<std::mutex>& lock) {
  drain_locked(lock);
  prefetch_enabled_ = false;
  cv_.wait(lock, [&] {
    if (!io_fifo_.empty()) return false;
    for (const Slot& s : slots_)
      if (s.state == SlotState::kBusy) return false;
    return true;
  });
  for (Slot& slot : slots_) {  // prefetched data equals what is on disk: drop it
    if (slot.state == SlotState::kReady) {
      slices_[slot.slice].slot = -1;
      slot.slice = -1;
      slot.read_error = nullptr;
      slot.state = SlotState::kFree;
    }
  }
}

int64_t NvmeAdamStates::read_slice(int k, int64_t i, float* m_out, float* v_out) {
  std::unique_lock<std::mutex> lock(mutex_);
  quiesce_locked(lock);
  const int64_t id = first_slice_[k] + i;
  MW_CHECK_T(InvalidArgument, id < first_slice_[k + 1], "slice ", i, " of parameter ", k,
             " out of range");
  Slice& s = slices_[id];
  float* m = slots_[0].data();
  auto dirty = std::find_if(dirty_.begin(), dirty_.end(), [&](auto& d) { return d.first == id; });
  if (dirty != dirty_.end())
    std::memcpy(m, dirty->second.data(), static_cast<size_t>(8 * s.numel));
  else if (!s.on_disk)
    std::memset(m, 0, static_cast<size_t>(8 * s.numel));
  else
    swap_->read(s.key, m).wait();
  overlay_held_locked(id, m);  // Note [Row-split update]
  std::memcpy(m_out, m, static_cast<size_t>(4 * s.numel));
  std::memcpy(v_out, m + s.numel, static_cast<size_t>(4 * s.numel));
  return s.step;
}

void NvmeAdamStates::write_slice(int k, int64_t i, const float* m_in, const float* v_in,
                                 int64_t step) {
  std::unique_lock<std::mutex> lock(mutex_);
  quiesce_locked(lock);
  const int64_t id = first_slice_[k] + i;
  MW_CHECK_T(InvalidArgument, id < first_slice_[k + 1], "slice ", i, " of parameter ", k,
             " out of range");
  Slice& s = slices_[id];
  float* m = slots_[0].data();
  std::memcpy(m, m_in, static_cast<size_t>(4 * s.numel));
  std::memcpy(m + s.numel, v_in, static_cast<size_t>(4 * s.numel));
  drop_held_locked(id);
  swap_->write(s.key, m, 8 * s.numel).wait();
  s.on_disk = true;
  s.step = step;
  std::erase_if(dirty_, [&](const auto& d) { return d.first == id; });
}

void NvmeAdamStates::resume_prefetch() {
  std::lock_guard<std::mutex> lock(mutex_);
  prefetch_enabled_ = true;
  cursor_ = split_cursor_ = 0;
  cv_.notify_all();
}

int64_t NvmeAdamStates::slice_count(int k) const { return first_slice_[k + 1] - first_slice_[k]; }

int64_t NvmeAdamStates::slice_step(int k, int64_t i) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return slices_[first_slice_[k] + i].step;
}

NvmeStats NvmeAdamStates::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  NvmeStats s = stats_;
  const io::IoStats io = engine_->stats();
  s.bytes_read = io.bytes_read;
  s.bytes_written = io.bytes_written;
  s.fixed_transfers = io.fixed_transfers;
  s.file_bytes = swap_->file_bytes();
  return s;
}

std::vector<SliceTiming> NvmeAdamStates::last_timeline() const {
  std::unique_lock<std::mutex> lock(mutex_);
  await_write_backs_locked(lock);  // the step's last write-backs may still be in flight
  return last_timeline_;
}

}  // namespace mw::optim
