// The io_uring backend of IoEngine (liburing).
//
// Invariants:
//  - At most queue_depth requests are in the ring; each holds one slot, whose index is the SQE's
//    user_data. Further requests wait in `pending_` and are started as slots free up.
//  - One io_uring_submit per batch: submit() fills SQEs for everything that fits and submits once;
//    the reaper does the same for the resumptions and queued requests a group of CQEs unlocks.
//  - Note [Waiters reap]: there is no completion thread. A thread that must wait takes the reaper
//    role (reaping_, under IoEngine::mutex_) if nobody holds it, blocks in io_uring_wait_cqe
//    *without* the mutex, then under the mutex handles every ready CQE, submits what they unlock,
//    drops the role and wakes the other waiters, one of which takes the role next if it still has
//    to wait. Only the role holder touches the completion queue; everything else (SQ, slots,
//    states, stats) is touched only under the mutex. The kernel allows one thread to submit while
//    another waits for completions. This saves a thread hand-off per completion (docs/io.md).
//  - An injected error (Note [Fault injection]) is issued as a NOP, so the failure still travels
//    the real completion path.
#include <liburing.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <deque>

#include "core/error.h"
#include "offload/io/backends.h"
#include "offload/io/log.h"

namespace mw::io::detail {

namespace {

std::atomic<bool> g_fail_submits{false};  // set_uring_submit_failure_for_testing
std::atomic<int> g_init_limit{0};         // set_uring_init_limit_for_testing

class UringEngine final : public IoEngine {
 public:
  explicit UringEngine(int queue_depth) : IoEngine(queue_depth), slots_(queue_depth) {
    const int limit = g_init_limit.load();
    int rc = limit > 0 && queue_depth > limit
                 ? -ENOMEM
                 : io_uring_queue_init(static_cast<unsigned>(queue_depth), &ring_, 0);
    MW_CHECK_T(DeviceError, rc == 0, "io_uring_queue_init(", queue_depth,
               ") failed: ", errno_text(-rc), "; use the threads backend (MW_IO_BACKEND=threads)");
    for (int i = queue_depth - 1; i >= 0; --i) free_slots_.push_back(i);
  }

  ~UringEngine() override {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      drain(lock);
    }
    io_uring_queue_exit(&ring_);
  }

  std::string backend_name() const override { return "uring"; }

  // Note [Registered buffers].
  bool register_buffers(const std::vector<std::pair<void*, int64_t>>& buffers) override {
    std::unique_lock<std::mutex> lock(mutex_);
    MW_CHECK_T(InvalidArgument, fixed_.empty(), "io_uring: buffers are already registered");
    std::vector<iovec> iov;
    for (auto [base, bytes] : buffers) iov.push_back({base, static_cast<size_t>(bytes)});
    const int rc = io_uring_register_buffers(&ring_, iov.data(), static_cast<unsigned>(iov.size()));
    if (rc < 0) {
      log_warning(str("io_uring: registering ", iov.size(), " buffers failed: ", errno_text(-rc),
                      "; transfers pin their pages per request instead (raise RLIMIT_MEMLOCK to "
                      "avoid that)"));
      return false;
    }
    for (size_t i = 0; i < buffers.size(); ++i)
      fixed_.push_back({static_cast<char*>(buffers[i].first), buffers[i].second});
    return true;
  }

 protected:
  void enqueue_locked(std::vector<std::shared_ptr<RequestState>>& states) override {
    for (auto& s : states) pending_.push_back(std::move(s));
    if (!broken_.empty()) return fail_everything_locked(broken_);
    try {
      fill_and_submit_locked();
    } catch (const std::exception& e) {  // a broken ring: the handles report it
      fail_everything_locked(e.what());
    }
  }

 private:
  // Prepares the SQE for the next attempt of the request in `slot`.
  void prep_locked(int slot) {
    RequestState& s = *slots_[slot];
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    // Cannot fail: the SQ has queue_depth entries and at most queue_depth slots are busy, and the
    // SQ is flushed by io_uring_submit before this function is called again for a new round.
    MW_CHECK_T(DeviceError, sqe != nullptr, "io_uring: submission queue unexpectedly full");
    if (s.fault_error != 0) {
      io_uring_prep_nop(sqe);
    } else {
      int64_t len = next_attempt_bytes(s);
      char* buf = static_cast<char*>(s.request.buf) + s.done_bytes;
      uint64_t off = static_cast<uint64_t>(s.request.offset + s.done_bytes);
      // A single SQE moves at most 2 GiB - 4 KiB (the kernel's MAX_RW_COUNT); more is a short
      // transfer that account_attempt resumes.
      unsigned n = static_cast<unsigned>(std::min<int64_t>(len, 0x7ffff000));
      const int fixed = fixed_index(buf, n);
      if (fixed >= 0) {
        ++stats_.fixed_transfers;
        if (s.request.op == IoOp::kRead)
          io_uring_prep_read_fixed(sqe, s.request.fd, buf, n, off, fixed);
        else
          io_uring_prep_write_fixed(sqe, s.request.fd, buf, n, off, fixed);
      } else if (s.request.op == IoOp::kRead) {
        io_uring_prep_read(sqe, s.request.fd, buf, n, off);
      } else {
        io_uring_prep_write(sqe, s.request.fd, buf, n, off);
      }
    }
    io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(slot));
    ++prepared_;
  }

  // The registered buffer that holds [buf, buf + n) wholly, or -1.
  int fixed_index(const char* buf, unsigned n) const {
    for (size_t i = 0; i < fixed_.size(); ++i)
      if (buf >= fixed_[i].first && buf + n <= fixed_[i].first + fixed_[i].second)
        return static_cast<int>(i);
    return -1;
  }

  void fill_and_submit_locked() {
    while (!pending_.empty() && !free_slots_.empty()) {
      int slot = free_slots_.back();
      free_slots_.pop_back();
      slots_[slot] = std::move(pending_.front());
      pending_.pop_front();
      prep_locked(slot);
    }
    submit_prepared_locked();
  }

  void submit_prepared_locked() {
    MW_CHECK_T(DeviceError, !g_fail_submits, "io_uring_submit failed: injected for a test");
    while (prepared_ > 0) {
      int rc = io_uring_submit(&ring_);
      ++stats_.submit_calls;
      if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) continue;
      MW_CHECK_T(DeviceError, rc >= 0, "io_uring_submit failed: ", errno_text(-rc));
      prepared_ -= rc;
    }
  }

  void handle_cqe_locked(uint64_t slot, int64_t res) {
    std::shared_ptr<RequestState>& state = slots_[slot];
    if (!state) return;  // already failed by fail_everything_locked
    if (!account_attempt(*state, res, stats_)) {
      prep_locked(static_cast<int>(slot));  // resume (or retry) from done_bytes
      return;
    }
    finish_locked(state);
    state.reset();
    free_slots_.push_back(static_cast<int>(slot));
  }

  // Note [Waiters reap].
  void await_progress(std::unique_lock<std::mutex>& lock) override {
    if (reaping_) {
      completed_cv_.wait(lock);
      return;
    }
    reaping_ = true;
    lock.unlock();
    io_uring_cqe* cqe = nullptr;
    int rc;
    do {
      rc = io_uring_wait_cqe(&ring_, &cqe);
    } while (rc == -EINTR || rc == -EAGAIN);
    lock.lock();
    reaping_ = false;
    if (rc < 0) {
      fail_everything_locked(str("io_uring_wait_cqe failed: ", errno_text(-rc)));
    } else {
      harvest_locked();
    }
    completed_cv_.notify_all();  // hand the role on, even when nothing of ours finished
  }

  void poll_locked() override {
    if (!reaping_) harvest_locked();  // the role holder will harvest otherwise
  }

  // Handles every ready CQE and submits what they unlock. Caller holds the mutex and either holds
  // the reaper role or has checked that nobody does.
  void harvest_locked() {
    unsigned head, count = 0;
    io_uring_cqe* cqe;
    try {
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++count;
        handle_cqe_locked(io_uring_cqe_get_data64(cqe), cqe->res);
      }
      io_uring_cq_advance(&ring_, count);
      fill_and_submit_locked();
    } catch (const std::exception& e) {
      // Only a broken ring gets here (io_uring_submit failing). No waiter may hang on it.
      io_uring_cq_advance(&ring_, count);
      fail_everything_locked(e.what());
    }
  }

  // Note [A broken ring]: once a submit or a wait on the ring has failed, every request in it,
  // queued, or submitted later fails with that reason. Until session 39 the failed requests' slots
  // were never freed, so once all were lost later requests waited forever. A request the kernel
  // had taken may still complete into its buffer after its handle failed: a broken ring is an
  // error to stop on, not one to go on from.
  void fail_everything_locked(const std::string& why) {
    if (broken_.empty()) broken_ = why;
    prepared_ = 0;
    auto fail = [&](std::shared_ptr<RequestState> s) {
      s->failed = true;
      s->err = EIO;
      s->error_message = str("io_uring engine failure while handling '", s->request.path,
                             "' at offset ", s->request.offset, ": ", why);
      finish_locked(s);
    };
    for (auto& s : pending_) fail(std::move(s));
    pending_.clear();
    for (auto& s : slots_)
      if (s) fail(std::move(s)), s.reset();
  }

  io_uring ring_{};
  std::vector<std::shared_ptr<RequestState>> slots_;
  std::vector<int> free_slots_;
  std::deque<std::shared_ptr<RequestState>> pending_;
  std::vector<std::pair<char*, int64_t>> fixed_;  // registered buffers, by index
  int prepared_ = 0;                              // SQEs prepared and not yet submitted
  bool reaping_ = false;                          // Note [Waiters reap]
  std::string broken_;                            // Note [A broken ring]: why, once it broke
};

}  // namespace

void set_uring_submit_failure_for_testing(bool fail) { g_fail_submits = fail; }
void set_uring_init_limit_for_testing(int entries) { g_init_limit = entries; }

std::unique_ptr<IoEngine> make_uring_engine(const IoOptions& options) {
  return std::make_unique<UringEngine>(options.queue_depth);
}

std::string probe_uring() {
  io_uring ring{};
  int rc = io_uring_queue_init(4, &ring, 0);
  if (rc < 0) {
    return str("io_uring_queue_init failed: ", errno_text(-rc),
               -rc == EPERM ? " (disabled by /proc/sys/kernel/io_uring_disabled or seccomp)" : "");
  }
  std::string problem;
  io_uring_probe* probe = io_uring_get_probe_ring(&ring);
  if (!probe) {
    problem = "io_uring opcode probe failed (kernel older than 5.6)";
  } else {
    if (!io_uring_opcode_supported(probe, IORING_OP_READ) ||
        !io_uring_opcode_supported(probe, IORING_OP_WRITE))
      problem = "io_uring lacks the READ/WRITE opcodes (kernel older than 5.6)";
    io_uring_free_probe(probe);
  }
  if (problem.empty()) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    io_uring_prep_nop(sqe);
    rc = io_uring_submit(&ring);
    io_uring_cqe* cqe = nullptr;
    if (rc == 1) rc = io_uring_wait_cqe(&ring, &cqe);
    if (rc < 0)
      problem = str("an io_uring NOP failed: ", errno_text(-rc));
    else
      io_uring_cqe_seen(&ring, cqe);
  }
  io_uring_queue_exit(&ring);
  return problem;
}

}  // namespace mw::io::detail
