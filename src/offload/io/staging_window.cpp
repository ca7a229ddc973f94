// StagingWindow (staging_window.h): the slots, the pump thread, the consumer's leases, failures.
#include "offload/io/staging_window.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "core/error.h"

namespace mw::io {

StagingWindow::StagingWindow(std::vector<StagingItem> items, std::vector<int64_t> order,
                             SwapSpace& swap, IoEngine& engine, StagingOptions options)
    : options_(options), swap_(swap), order_(std::move(order)) {
  MW_CHECK_T(InvalidArgument, options_.slot_bytes > 0 && options_.slot_bytes % 4096 == 0,
             "StagingWindow: slot_bytes must be a positive multiple of 4096 (O_DIRECT); got ",
             options_.slot_bytes);
  MW_CHECK_T(InvalidArgument, order_.size() == items.size(), "StagingWindow: the order names ",
             order_.size(), " items, there are ", items.size(), "; pass a permutation of 0..n-1");
  for (StagingItem& it : items) {
    MW_CHECK_T(InvalidArgument, it.nbytes > 0 && it.nbytes <= options_.slot_bytes,
               "StagingWindow: item '", it.key, "' has ", it.nbytes, " bytes; slots hold 1 to ",
               options_.slot_bytes);
    ItemState state;
    state.spec = std::move(it);
    items_.push_back(std::move(state));
  }
  t0_ = std::chrono::steady_clock::now();
  // An item is in one slot at a time (a read is never issued while its write is in flight), so
  // slots beyond the items could never be used: a 1 GiB window over 29 items took 256 slots of 4
  // MiB, pinned, for 9 MiB of states.
  const int64_t nslots = std::min(std::max<int64_t>(2, options_.window_bytes / options_.slot_bytes),
                                  std::max<int64_t>(2, static_cast<int64_t>(items_.size())));
  slots_.resize(static_cast<size_t>(nslots));
  owned_slots_ = slots_.size();
  std::vector<std::pair<void*, int64_t>> pinned;
  for (Slot& s : slots_) {
    s.buf = AlignedBuffer(options_.slot_bytes);
    pinned.emplace_back(s.buf.data(), s.buf.size());
  }
  stats_.staging_bytes = nslots * options_.slot_bytes;
  stats_.registered = engine.register_buffers(pinned);
  pump_thread_ = std::thread([this] { pump(); });
}

StagingWindow::~StagingWindow() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  pump_thread_.join();
  for (Slot& s : slots_) s.handle.join();
}

double StagingWindow::now_ms() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
}

// ---- the pump (Note [Staging window]) ----------------------------------------------------------

int StagingWindow::free_slot_index_locked() const {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].state == SlotState::kFree) return static_cast<int>(i);
  return -1;
}

int64_t StagingWindow::next_in_stream_locked(size_t& cursor, int stream) {
  for (; cursor < order_.size(); ++cursor) {
    const ItemState& it = items_[static_cast<size_t>(order_[cursor])];
    if (it.stream != stream) continue;
    if (it.acquired || (it.slot >= 0 && slots_[it.slot].state != SlotState::kWriting))
      continue;                   // taken by the spare path, or still held from an earlier read
    if (it.slot >= 0) return -1;  // its last write is in flight: wait for it
    return order_[cursor];
  }
  return -1;
}

void StagingWindow::start_read_locked(int64_t id, int slot_index) {
  ItemState& it = items_[static_cast<size_t>(id)];
  Slot& slot = slots_[static_cast<size_t>(slot_index)];
  slot.item = id;
  slot.read_error = nullptr;
  it.slot = slot_index;
  if (!it.written) {  // never written: an item starts as zeros
    std::memset(slot.data(), 0, static_cast<size_t>(it.spec.nbytes));
    slot.state = SlotState::kReady;
    return;
  }
  if (options_.record_times) {
    it.times.read_issue_ms = now_ms();
    it.times.read_done_ms = -1;
  }
  slot.state = SlotState::kReading;
  try {
    slot.handle = swap_.read(it.spec.key, slot.data());
    io_fifo_.push_back(slot_index);
  } catch (...) {
    slot.read_error = std::current_exception();
    slot.state = SlotState::kReady;
  }
}

// Reads ahead into every free slot, two streams sharing the slots fairly. True if any was issued.
bool StagingWindow::issue_reads_locked() {
  bool issued = false;
  while (prefetch_enabled_ && !error_) {
    const int f = free_slot_index_locked();
    if (f < 0) break;
    int held[2] = {0, 0};
    for (const Slot& slot : slots_)
      if (slot.item >= 0 && (slot.state == SlotState::kReading || slot.state == SlotState::kReady))
        ++held[items_[static_cast<size_t>(slot.item)].stream];
    const int64_t next[2] = {next_in_stream_locked(cursor_[0], 0),
                             next_in_stream_locked(cursor_[1], 1)};
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
    ++cursor_[stream];
    issued = true;
  }
  return issued;
}

// Waits, unlocked, for the oldest transfer, and moves its slot on.
void StagingWindow::reap_locked(std::unique_lock<std::mutex>& lock) {
  const int slot_index = io_fifo_.front();
  io_fifo_.pop_front();
  IoHandle handle = slots_[static_cast<size_t>(slot_index)].handle;
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
  Slot& slot = slots_[static_cast<size_t>(slot_index)];
  if (slot.state == SlotState::kReading) {
    if (options_.record_times) items_[static_cast<size_t>(slot.item)].times.read_done_ms = now_ms();
    slot.read_error = error;
    slot.state = SlotState::kReady;
  } else {
    finish_write_locked(slot_index, error);
  }
  cv_.notify_all();
}

void StagingWindow::pump() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (issue_reads_locked()) cv_.notify_all();
    if (io_fifo_.empty())
      cv_.wait(lock);
    else
      reap_locked(lock);
  }
}

// ---- failures (Note [Staging failures]) --------------------------------------------------------

void StagingWindow::fail_locked(std::exception_ptr error) {
  if (!error_) error_ = error;
  cv_.notify_all();
}

void StagingWindow::fail(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mutex_);
  fail_locked(error);
}

bool StagingWindow::failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_ != nullptr;
}

std::exception_ptr StagingWindow::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

void StagingWindow::keep_dirty_locked(int64_t id, const void* bytes, std::exception_ptr error) {
  fail_locked(error);
  AlignedBuffer copy(options_.slot_bytes);
  std::memcpy(copy.data(), bytes, static_cast<size_t>(items_[static_cast<size_t>(id)].spec.nbytes));
  dirty_[id] = std::move(copy);
}

void StagingWindow::free_slot_locked(int slot_index) {
  Slot& slot = slots_[static_cast<size_t>(slot_index)];
  if (slot.item >= 0) items_[static_cast<size_t>(slot.item)].slot = -1;
  slot.item = -1;
  slot.read_error = nullptr;
  slot.state = SlotState::kFree;
}

void StagingWindow::finish_write_locked(int slot_index, std::exception_ptr error) {
  Slot& slot = slots_[static_cast<size_t>(slot_index)];
  ItemState& it = items_[static_cast<size_t>(slot.item)];
  if (options_.record_times) it.times.write_done_ms = now_ms();
  if (error) keep_dirty_locked(slot.item, slot.data(), error);
  free_slot_locked(slot_index);
}

void StagingWindow::await_write_backs() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] {
    for (const Slot& s : slots_)
      if (s.state == SlotState::kWriting) return false;
    return true;
  });
}

// ---- the consumer ------------------------------------------------------------------------------

StagingLease StagingWindow::acquire(int64_t id) {
  std::unique_lock<std::mutex> lock(mutex_);
  ItemState& it = items_[static_cast<size_t>(id)];
  acquired_order_.push_back(id);
  auto present = [&] {
    return it.slot >= 0 && (slots_[it.slot].state == SlotState::kReady ||
                            slots_[it.slot].state == SlotState::kReading);
  };
  auto stalled = [&] {  // every slot holds another item's read: only the spare path can go on
    for (const Slot& slot : slots_)
      if (slot.state == SlotState::kFree || slot.state == SlotState::kWriting) return false;
    return true;
  };
  const double wait_start = now_ms();
  cv_.wait(lock, [&] { return present() || stalled() || stop_ || error_; });
  if (error_ && !present()) return {};  // read-ahead stopped at the failure
  if (!present()) return acquire_spare_locked(lock, id);
  Slot& slot = slots_[static_cast<size_t>(it.slot)];
  cv_.wait(lock, [&] { return slot.state == SlotState::kReady || stop_; });
  stats_.consumer_wait_ms += now_ms() - wait_start;
  it.acquired = true;
  StagingLease lease{id, slot.data(), slot.read_error, it.slot};
  if (slot.read_error) fail_locked(slot.read_error);
  slot.state = SlotState::kBusy;
  return lease;
}

StagingLease StagingWindow::acquire_spare_locked(std::unique_lock<std::mutex>& lock, int64_t id) {
  ItemState& it = items_[static_cast<size_t>(id)];
  it.acquired = true;
  ++stats_.spare_items;
  if (spare_.size() == 0) {
    spare_ = AlignedBuffer(options_.slot_bytes);
    stats_.staging_bytes += spare_.size();
  }
  if (options_.record_times) it.times = StagingTimes{.spare = true};
  StagingLease lease{id, spare_.data(), nullptr, -1};
  if (!it.written) {
    std::memset(lease.data, 0, static_cast<size_t>(it.spec.nbytes));
    return lease;
  }
  const std::string key = it.spec.key;
  lock.unlock();  // only the consumer uses the spare
  try {
    swap_.read(key, lease.data).wait();
  } catch (...) {
    lease.read_error = std::current_exception();
  }
  lock.lock();
  if (lease.read_error) fail_locked(lease.read_error);
  return lease;
}

void StagingWindow::write_back(StagingLease& lease) {
  std::unique_lock<std::mutex> lock(mutex_);
  ItemState& it = items_[static_cast<size_t>(lease.item)];
  it.written = true;
  if (options_.record_times) {
    it.times.write_issue_ms = now_ms();
    it.times.write_done_ms = -1;
  }
  if (lease.slot < 0) {  // the spare: synchronously
    const std::string key = it.spec.key;
    lock.unlock();
    std::exception_ptr error;
    try {
      swap_.write(key, lease.data, it.spec.nbytes).wait();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (options_.record_times) it.times.write_done_ms = now_ms();
    if (error) keep_dirty_locked(lease.item, lease.data, error);
  } else {
    Slot& slot = slots_[static_cast<size_t>(lease.slot)];
    slot.state = SlotState::kWriting;
    try {
      slot.handle = swap_.write(it.spec.key, slot.data(), it.spec.nbytes);
      io_fifo_.push_back(lease.slot);
    } catch (...) {  // e.g. ENOSPC while allocating file space
      finish_write_locked(lease.slot, std::current_exception());
    }
  }
  lease = StagingLease{};
  cv_.notify_all();
}

void StagingWindow::release(StagingLease& lease) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (lease.slot >= 0) free_slot_locked(lease.slot);
  lease = StagingLease{};
  cv_.notify_all();
}

// ---- the expected order and lent slots ---------------------------------------------------------

void StagingWindow::reorder(std::vector<int64_t> order, size_t keep_front) {
  std::lock_guard<std::mutex> lock(mutex_);
  MW_CHECK(order.size() == order_.size(), "StagingWindow::reorder: not a permutation");
  std::unordered_set<int64_t> kept(order.begin(),
                                   order.begin() + static_cast<std::ptrdiff_t>(keep_front));
  order_ = std::move(order);
  cursor_[0] = cursor_[1] = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& slot = slots_[i];
    if (slot.state != SlotState::kReady || slot.item < 0 || slot.read_error) continue;
    const ItemState& it = items_[static_cast<size_t>(slot.item)];
    if (it.written || it.acquired || kept.count(slot.item)) continue;
    free_slot_locked(static_cast<int>(i));
  }
  cv_.notify_all();
}

void StagingWindow::set_stream(const std::vector<int64_t>& ids, int stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int64_t id : ids) items_[static_cast<size_t>(id)].stream = stream;
  cursor_[0] = cursor_[1] = 0;
  cv_.notify_all();
}

bool StagingWindow::lend(void* base, int64_t bytes, int64_t max_lent_bytes) {
  const int64_t slot_bytes = options_.slot_bytes;
  if (reinterpret_cast<uintptr_t>(base) % kHostAlignment != 0) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_) return false;
  bool took = false;
  for (int64_t off = 0; off + slot_bytes <= bytes && lent_bytes_ + slot_bytes <= max_lent_bytes;
       off += slot_bytes) {
    Slot& slot = slots_.emplace_back();
    slot.lent = static_cast<char*>(base) + off;
    lent_bytes_ += slot_bytes;
    took = true;
  }
  stats_.lent_bytes_max = std::max(stats_.lent_bytes_max, lent_bytes_);
  cv_.notify_all();
  return took;
}

void StagingWindow::end_round() {
  std::unique_lock<std::mutex> lock(mutex_);
  // Lent slots go back to their owners, so their transfers must end; the owned slots' last
  // write-backs go on while the caller does whatever comes between rounds.
  cv_.wait(lock, [&] {
    if (reaping_slot_ >= static_cast<int>(owned_slots_)) return false;
    for (size_t i = owned_slots_; i < slots_.size(); ++i) {
      const SlotState st = slots_[i].state;
      if (st == SlotState::kWriting || st == SlotState::kBusy || st == SlotState::kReading)
        return false;
    }
    return true;
  });
  while (slots_.size() > owned_slots_) {  // unconsumed reads in them hold unchanged data: drop
    const Slot& slot = slots_.back();
    if (slot.item >= 0) items_[static_cast<size_t>(slot.item)].slot = -1;
    slots_.pop_back();
  }
  lent_bytes_ = 0;
  // The next round reads in the order this one acquired, then whatever it did not touch.
  std::vector<int64_t> next = acquired_order_;
  for (int64_t id : order_)
    if (!items_[static_cast<size_t>(id)].acquired) next.push_back(id);
  if (next.size() == order_.size()) order_ = std::move(next);
  acquired_order_.clear();
  for (ItemState& it : items_) it.acquired = false;
  cursor_[0] = cursor_[1] = 0;
  cv_.notify_all();
}

// ---- direct access between rounds --------------------------------------------------------------

void StagingWindow::pause() {
  std::unique_lock<std::mutex> lock(mutex_);
  prefetch_enabled_ = false;
  cv_.wait(lock, [&] {
    if (!io_fifo_.empty() || reaping_slot_ >= 0) return false;
    for (const Slot& s : slots_)
      if (s.state == SlotState::kBusy) return false;
    return true;
  });
  for (size_t i = 0; i < slots_.size(); ++i)  // read-ahead data equals what is stored: drop it
    if (slots_[i].state == SlotState::kReady) free_slot_locked(static_cast<int>(i));
}

void* StagingWindow::load(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  MW_CHECK(!prefetch_enabled_, "StagingWindow::load needs pause() first");
  const ItemState& it = items_[static_cast<size_t>(id)];
  void* buf = slots_[0].data();
  auto dirty = dirty_.find(id);
  if (dirty != dirty_.end())
    std::memcpy(buf, dirty->second.data(), static_cast<size_t>(it.spec.nbytes));
  else if (!it.written)
    std::memset(buf, 0, static_cast<size_t>(it.spec.nbytes));
  else
    swap_.read(it.spec.key, buf).wait();
  return buf;
}

void* StagingWindow::store_buffer() {
  std::lock_guard<std::mutex> lock(mutex_);
  MW_CHECK(!prefetch_enabled_, "StagingWindow::store_buffer needs pause() first");
  return slots_[0].data();
}

void StagingWindow::store(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  MW_CHECK(!prefetch_enabled_, "StagingWindow::store needs pause() first");
  ItemState& it = items_[static_cast<size_t>(id)];
  swap_.write(it.spec.key, slots_[0].data(), it.spec.nbytes).wait();
  it.written = true;
  dirty_.erase(id);
}

void StagingWindow::resume() {
  std::lock_guard<std::mutex> lock(mutex_);
  prefetch_enabled_ = true;
  cursor_[0] = cursor_[1] = 0;
  cv_.notify_all();
}

bool StagingWindow::written(int64_t id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return items_[static_cast<size_t>(id)].written;
}

std::vector<int64_t> StagingWindow::order() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return order_;
}

StagingStats StagingWindow::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

StagingTimes StagingWindow::times(int64_t id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return items_[static_cast<size_t>(id)].times;
}

}  // namespace mw::io
