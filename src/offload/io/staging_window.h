// StagingWindow: a fixed pool of aligned RAM slots through which *items* (blobs of a SwapSpace) are
// read ahead in an expected order, handed to one consumer when ready, and written back behind it.
// It knows nothing of what the bytes mean: NvmeAdamStates (optim/nvme_states.h) puts Adam's m and
// v through it; any owner of a SwapSpace whose blobs are consumed in a predictable order can.
//
// Note [Staging window]: one pump thread and one consumer thread share the slots.
//  - The pump reads items ahead into every free slot in the *expected order*, and reaps transfers
//    in issue order (a FIFO): a finished read makes its slot Ready, a finished write makes it Free
//    again, and a free slot takes the next read. An item is only read after its own last write
//    completed. An item never written reads as zeros (no I/O).
//  - The consumer acquire()s an item (blocking until its read is done), changes the bytes in place,
//    and write_back()s it: the write is issued at once and the slot frees when it completes, so
//    the consumer never waits for the disk to take its bytes. release() gives a slot back
//    unwritten.
//  - A *round* is one pass of the consumer over (some of) the items. end_round() makes the next
//    round expect the order this one acquired items in (then the items it did not touch), and
//    restarts read-ahead at once, so the next round's reads overlap whatever the caller does
//    between rounds. Owners that learn more mid-round call reorder().
//  - Two read streams (set_stream): while both have items left, each holds at most half of the
//    slots, so a long stream consumed in the gaps of another does not starve it.
//  - An item acquired out of the expected order while every slot holds another item's read goes
//    through one *spare* slot, read and written synchronously, so the window never deadlocks.
//  - Lent slots: memory that happens to be dead for the rest of a round (a spent gradient) can be
//    lent as extra slots (lend); end_round() waits for their transfers and drops them.
//  - The slots are registered with the engine once (Note [Registered buffers], io_engine.h).
//
// Note [Staging failures]: nothing is lost and every failure surfaces at one point. A failed read
// is reported to the consumer by its lease (the bytes are garbage; release() the slot). A failed
// write keeps the item's new bytes in RAM (a "dirty" copy, served by load()). Either way, and for
// any failure the owner records with fail(), the window is *failed*: read-ahead stops, acquire()
// of an item not already in a slot returns an empty lease, and error() holds the first failure,
// which the owner throws at a point it defines (NvmeAdamStates: finish_step()).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "offload/io/io_engine.h"
#include "offload/io/swap_space.h"

namespace mw::io {

struct StagingItem {
  std::string key;     // its blob in the SwapSpace
  int64_t nbytes = 0;  // at most StagingOptions::slot_bytes
};

struct StagingOptions {
  int64_t slot_bytes = int64_t{4} << 20;     // a multiple of 4096
  int64_t window_bytes = int64_t{32} << 20;  // max(2, window_bytes / slot_bytes) slots
  bool record_times = false;                 // keep StagingTimes per item
};

// When the last transfers of one item happened (ms since the window was made; -1: not yet).
struct StagingTimes {
  double read_issue_ms = -1, read_done_ms = -1;  // of its last read (none when zero-filled)
  double write_issue_ms = -1, write_done_ms = -1;
  bool spare = false;  // its last acquire went through the spare slot
};

struct StagingStats {
  double consumer_wait_ms = 0;  // time acquire() waited for reads
  int64_t spare_items = 0;      // acquires that took the spare slot
  int64_t staging_bytes = 0;    // RAM of the slots (and the spare, once made)
  int64_t lent_bytes_max = 0;   // most memory lent as slots in one round
  bool registered = false;      // slots registered with the engine
};

// An item in a slot, held by the consumer between acquire() and write_back()/release().
struct StagingLease {
  int64_t item = -1;
  void* data = nullptr;  // the item's bytes; null when the window failed before it was read
  std::exception_ptr read_error;  // its read failed (already recorded): release() it
  int slot = -1;                  // -1: the spare slot
  explicit operator bool() const { return data != nullptr; }
};

class StagingWindow {
 public:
  // `order`: the expected order of the first round (a permutation of the item ids). The swap and
  // engine must outlive the window. Starts the pump.
  StagingWindow(std::vector<StagingItem> items, std::vector<int64_t> order, SwapSpace& swap,
                IoEngine& engine, StagingOptions options);
  ~StagingWindow();
  StagingWindow(const StagingWindow&) = delete;
  StagingWindow& operator=(const StagingWindow&) = delete;

  // ---- the consumer (one thread at a time) ----
  // Blocks until `item` is in a slot (Note [Staging window]) and hands it over.
  StagingLease acquire(int64_t item);
  // Writes the lease's bytes back behind the consumer (the spare's synchronously) and ends it.
  void write_back(StagingLease& lease);
  // Ends a lease without writing (the item's stored bytes stay what they were).
  void release(StagingLease& lease);

  // ---- the expected order ----
  // Replaces this round's expected order. Ready zero-filled items (never written, not acquired)
  // at positions >= keep_front are dropped from their slots: redoing them costs nothing.
  void reorder(std::vector<int64_t> order, size_t keep_front);
  // Puts items in read stream 0 (the default) or 1.
  void set_stream(const std::vector<int64_t>& items, int stream);
  // Ends a round: waits for the lent slots' transfers and drops them; the next round expects this
  // one's acquisition order; read-ahead restarts.
  void end_round();
  // Lends [base, base + bytes) as extra slots until end_round(), as long as the total lent stays
  // <= max_lent_bytes. base must be 4096-aligned. Returns false when no slot fitted.
  bool lend(void* base, int64_t bytes, int64_t max_lent_bytes);

  // ---- failures (Note [Staging failures]) ----
  void fail(std::exception_ptr error);  // records a failure of the owner's (the first one wins)
  bool failed() const;
  std::exception_ptr error() const;
  // Waits for every write-back in flight.
  void await_write_backs();

  // ---- direct access between rounds (checkpoints) ----
  // Stops read-ahead and waits for every transfer; no lease may be out.
  void pause();
  // Paused: a slot-sized buffer holding the item's current bytes (its dirty copy after a failed
  // write, zeros if never written, else read from disk). Valid until the next load/store/resume.
  void* load(int64_t item);
  // Paused: the buffer that store() writes; fill it with the item's new bytes first.
  void* store_buffer();
  // Paused: writes store_buffer() as the item's bytes, synchronously (throws IoError).
  void store(int64_t item);
  // Restarts read-ahead after pause().
  void resume();

  bool written(int64_t item) const;
  std::vector<int64_t> order() const;  // this round's expected order
  int64_t item_count() const { return static_cast<int64_t>(items_.size()); }
  StagingStats stats() const;
  StagingTimes times(int64_t item) const;
  double now_ms() const;

 private:
  enum class SlotState { kFree, kReading, kReady, kBusy, kWriting };
  struct Slot {
    void* data() { return lent ? lent : buf.data(); }
    AlignedBuffer buf;
    void* lent = nullptr;  // a piece of lent memory instead of buf
    SlotState state = SlotState::kFree;
    int64_t item = -1;
    IoHandle handle;
    std::exception_ptr read_error;
  };
  struct ItemState {
    StagingItem spec;
    bool written = false;   // written at least once: reads come from disk
    bool acquired = false;  // this round
    int slot = -1;          // slot holding it, or -1
    int stream = 0;
    StagingTimes times;
  };

  void pump();
  bool issue_reads_locked();
  int64_t next_in_stream_locked(size_t& cursor, int stream);
  void start_read_locked(int64_t item, int slot);
  void reap_locked(std::unique_lock<std::mutex>& lock);
  void finish_write_locked(int slot, std::exception_ptr error);
  StagingLease acquire_spare_locked(std::unique_lock<std::mutex>& lock, int64_t item);
  void keep_dirty_locked(int64_t item, const void* bytes, std::exception_ptr error);
  void free_slot_locked(int slot);
  int free_slot_index_locked() const;
  void fail_locked(std::exception_ptr error);

  StagingOptions options_;
  SwapSpace& swap_;
  std::vector<ItemState> items_;
  std::chrono::steady_clock::time_point t0_;

  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  std::deque<Slot> slots_;  // owned slots first, then lent ones; a deque keeps references valid
  size_t owned_slots_ = 0;
  int reaping_slot_ = -1;  // slot whose transfer the pump is waiting on, unlocked
  int64_t lent_bytes_ = 0;
  AlignedBuffer spare_;
  std::unordered_map<int64_t, AlignedBuffer> dirty_;  // item -> its bytes after a failed write
  std::deque<int> io_fifo_;                           // slots with I/O in flight, issue order
  std::vector<int64_t> order_, acquired_order_;
  size_t cursor_[2] = {0, 0};
  bool prefetch_enabled_ = true;
  bool stop_ = false;
  std::exception_ptr error_;
  StagingStats stats_;
  std::thread pump_thread_;
};

}  // namespace mw::io
