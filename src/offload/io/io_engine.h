// IoEngine: asynchronous reads and writes of byte ranges between host buffers and files.
//
// Two backends share this interface (Note [Backend choice]): io_uring through liburing, with one
// io_uring_submit per batch, and a thread pool doing pread/pwrite. IoEngine::create() probes
// io_uring at run time, because a kernel switch (io_uring_disabled) or a seccomp filter can refuse
// it, and logs the choice and its reason.
//
// Note [Every completion is checked]: each request ends in exactly one of two ways.
//  - All `length` bytes were transferred. Short transfers (a read or write that moved fewer bytes
//    than asked) are resumed from where they stopped, and counted in IoStats::resumed_transfers.
//    EINTR and EAGAIN are retried.
//  - It failed: a negative result (EIO, ENOSPC, EFBIG, ...) or a read that hit end of file. The
//    request's handle then throws mw::IoError naming the file, offset, length and errno text.
//  A failure never touches other requests: they complete on their own and their handles stay
//  clean. Handles whose errors nobody waited for are not lost either: wait_all() throws the first
//  of them.
//
// Invariants:
//  - Buffers must stay alive and untouched until the request's handle reports done. IoHandle::wait
//    waits for every part of the handle before it throws, so an exception never leaves I/O in
//    flight into a buffer the caller is about to free.
//  - The engine's destructor waits for every outstanding request. Handles must not outlive it
//    unless they are already done.
//  - With O_DIRECT files, buf, offset and length must be multiples of 4096 (kHostAlignment).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace mw::io {

enum class IoOp { kRead, kWrite };

// One transfer. `path` is only used in error messages.
struct IoRequest {
  int fd = -1;
  std::string path;
  int64_t offset = 0;
  void* buf = nullptr;
  int64_t length = 0;
  IoOp op = IoOp::kRead;
};

enum class BackendKind { kAuto, kUring, kThreads };

struct IoOptions {
  BackendKind backend = BackendKind::kAuto;  // kAuto: env MW_IO_BACKEND, else the probe
  int queue_depth = 32;                      // most requests in flight at once
  int threads = 0;                           // thread backend workers; 0 = queue_depth
};

// Counters since the engine was created. Bytes count what the kernel actually moved.
struct IoStats {
  int64_t bytes_read = 0;
  int64_t bytes_written = 0;
  int64_t requests_completed = 0;  // requests finished, successfully or not
  int64_t requests_failed = 0;
  int64_t resumed_transfers = 0;  // short transfers continued (Note [Every completion is checked])
  int64_t submit_calls = 0;       // io_uring_submit calls (uring) or batches handed to the pool
  int64_t fixed_transfers = 0;    // transfers into registered buffers (READ/WRITE_FIXED)
};

// Test hook (Note [Fault injection]): what to do to request number `seq` (0-based, in submission
// order over the engine's life).
struct Fault {
  int error = 0;             // != 0: the request fails with this errno, and moves no bytes
  int64_t short_bytes = -1;  // >= 0: its first transfer moves only this many bytes (then resumes)
};
using FaultInjector = std::function<Fault(const IoRequest& request, int64_t seq)>;

namespace detail {
struct RequestState;
}
class IoEngine;

// A waitable, pollable handle on one request, or on a group of requests (SwapSpace splits a blob
// into several). Copyable; copies refer to the same requests. A default handle is done.
class IoHandle {
 public:
  IoHandle() = default;
  // True when every request of the handle has completed (successfully or not). Never blocks.
  bool done() const;
  // Blocks until every request of the handle has completed, then throws the IoError of the first
  // one that failed, if any.
  void wait() const;
  // Blocks like wait() but never throws; a failure stays reportable by wait() and wait_all().
  void join() const;
  // True when done() and some request failed. Never blocks, never throws.
  bool failed() const;
  int64_t request_count() const { return static_cast<int64_t>(states_.size()); }
  // Appends the requests of `other` to this handle.
  void merge(const IoHandle& other);

 private:
  friend class IoEngine;
  IoEngine* engine_ = nullptr;
  std::vector<std::shared_ptr<detail::RequestState>> states_;
};

class IoEngine {
 public:
  // Picks and starts a backend (Note [Backend choice]). Throws DeviceError when the backend asked
  // for explicitly cannot start, InvalidArgument on a bad option or MW_IO_BACKEND value.
  static std::unique_ptr<IoEngine> create(const IoOptions& options = {});
  virtual ~IoEngine();
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // Submits a batch; returns one handle per request, in order. Requests beyond the queue depth
  // are queued and started as earlier ones complete. Throws InvalidArgument for a malformed
  // request (nothing of the batch is submitted then).
  std::vector<IoHandle> submit(std::span<const IoRequest> requests);
  IoHandle submit(const IoRequest& request);
  // Blocks until at least one of `handles` is done (at once if one already is, or if the span is
  // empty); returns the index of the first done one, or -1 for an empty span. Never throws an
  // I/O error: call wait() on the done handle to see its result.
  int64_t wait_any(std::span<const IoHandle> handles);
  // Waits until nothing is outstanding, then throws the first failure that no handle's wait()
  // has reported (and forgets the others, whose count is in the message).
  void wait_all();

  IoStats stats() const;
  // "uring" or "threads".
  virtual std::string backend_name() const = 0;
  // Why this backend was chosen, e.g. "probe: io_uring works (READ/WRITE opcodes supported)".
  const std::string& choice_reason() const { return choice_reason_; }
  int queue_depth() const { return queue_depth_; }

  // Note [Registered buffers]: long-lived buffers that most transfers use (a pipeline's slots) can
  // be registered once: io_uring then pins their pages once (IORING_REGISTER_BUFFERS) instead of
  // on every request, and transfers wholly inside one use READ/WRITE_FIXED. Call before submitting
  // anything; the buffers must outlive the engine. Returns false, with the reason logged once, when
  // the backend cannot (the threads backend, or e.g. RLIMIT_MEMLOCK): transfers work as before.
  virtual bool register_buffers(const std::vector<std::pair<void*, int64_t>>& buffers) {
    (void)buffers;
    return false;
  }

  // Note [Fault injection]: a test-only hook consulted once per submitted request. Pass an empty
  // function to remove it. Works identically for both backends.
  void set_fault_injector(FaultInjector injector);

  // Internals for IoHandle.
  void wait_states(const std::vector<std::shared_ptr<detail::RequestState>>& states);
  // Harvests finished completions without blocking (used by IoHandle::done()).
  void poll();

 protected:
  explicit IoEngine(int queue_depth);
  // Backend hook, called with mutex_ held: start (or queue) these requests.
  virtual void enqueue_locked(std::vector<std::shared_ptr<detail::RequestState>>& states) = 0;
  // Records the end of a request (mutex_ held; state.failed/err/error_message already set by
  // detail::account_attempt) and wakes waiters.
  void finish_locked(const std::shared_ptr<detail::RequestState>& state);
  // Waits, with mutex_ held through `lock`, until no request is outstanding.
  void drain(std::unique_lock<std::mutex>& lock);
  // Called with mutex_ held (through `lock`) by a thread that must wait for some completion:
  // blocks until at least one more request may have finished. The default sleeps on
  // completed_cv_; a backend whose completions need reaping does the reaping here.
  virtual void await_progress(std::unique_lock<std::mutex>& lock) { completed_cv_.wait(lock); }
  // Called with mutex_ held: harvest ready completions without blocking. Default: nothing.
  virtual void poll_locked() {}

  mutable std::mutex mutex_;
  std::condition_variable completed_cv_;
  IoStats stats_;
  int queue_depth_;

 private:
  friend std::unique_ptr<IoEngine> create_engine_with_reason(BackendKind, const IoOptions&,
                                                             std::string);
  std::string choice_reason_;
  FaultInjector injector_;
  int64_t next_seq_ = 0;
  int64_t outstanding_ = 0;
  std::vector<std::shared_ptr<detail::RequestState>> failed_;  // for wait_all()
};

namespace detail {
// The life of one request. Fields other than `complete` and `observed` are written by the
// engine under its mutex before `complete` is released, and read by handles after it is acquired.
struct RequestState {
  IoRequest request;
  int64_t seq = 0;
  int64_t done_bytes = 0;          // bytes transferred so far
  int fault_error = 0;             // injected errno (Note [Fault injection])
  int64_t first_limit_bytes = -1;  // injected short first transfer
  bool first_attempt = true;
  int err = 0;  // errno of the failure, 0 if none or not from a system call
  bool failed = false;
  std::string error_message;
  std::atomic<bool> complete{false};
  std::atomic<bool> observed{false};  // its failure was thrown by some IoHandle::wait
};
}  // namespace detail

const char* backend_kind_name(BackendKind kind);
// Parses "auto", "uring" or "threads"; throws InvalidArgument otherwise.
BackendKind parse_backend_kind(const std::string& text);

}  // namespace mw::io
