// The thread-pool backend of IoEngine: workers run pread/pwrite, for kernels or sandboxes where
// io_uring is refused (Note [Backend choice]).
//
// Invariants: a request is taken by exactly one worker, which loops until the request is complete
// or failed (resuming short transfers through detail::account_attempt, exactly as the uring
// backend does), then records it under IoEngine::mutex_. Workers only stop once every accepted
// request has finished, so the destructor never strands a waiter.
#include <unistd.h>

#include <cerrno>
#include <deque>
#include <thread>

#include "core/error.h"
#include "offload/io/backends.h"

namespace mw::io::detail {

namespace {

class ThreadEngine final : public IoEngine {
 public:
  ThreadEngine(int queue_depth, int threads) : IoEngine(queue_depth) {
    int n = threads > 0 ? threads : queue_depth;
    workers_.reserve(n);
    for (int i = 0; i < n; ++i) workers_.emplace_back([this] { work_loop(); });
  }

  ~ThreadEngine() override {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      drain(lock);
      stopping_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  std::string backend_name() const override { return "threads"; }

 protected:
  void enqueue_locked(std::vector<std::shared_ptr<RequestState>>& states) override {
    for (auto& s : states) jobs_.push_back(std::move(s));
    ++stats_.submit_calls;
    work_cv_.notify_all();
  }

 private:
  void work_loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and nothing left
      std::shared_ptr<RequestState> state = std::move(jobs_.front());
      jobs_.pop_front();
      IoStats delta;
      lock.unlock();
      run(*state, delta);
      lock.lock();
      stats_.bytes_read += delta.bytes_read;
      stats_.bytes_written += delta.bytes_written;
      stats_.resumed_transfers += delta.resumed_transfers;
      finish_locked(state);
    }
  }

  // Moves the whole request, resuming short transfers; without the engine mutex.
  static void run(RequestState& s, IoStats& delta) {
    for (;;) {
      int64_t result;
      if (s.fault_error != 0) {
        result = -s.fault_error;  // injected: no syscall
      } else {
        int64_t len = next_attempt_bytes(s);
        char* buf = static_cast<char*>(s.request.buf) + s.done_bytes;
        off_t off = static_cast<off_t>(s.request.offset + s.done_bytes);
        ssize_t n = s.request.op == IoOp::kRead ? ::pread(s.request.fd, buf, len, off)
                                                : ::pwrite(s.request.fd, buf, len, off);
        result = n < 0 ? -static_cast<int64_t>(errno) : static_cast<int64_t>(n);
      }
      if (account_attempt(s, result, delta)) return;
    }
  }

  std::condition_variable work_cv_;
  std::deque<std::shared_ptr<RequestState>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoEngine> make_thread_engine(const IoOptions& options) {
  return std::make_unique<ThreadEngine>(options.queue_depth, options.threads);
}

}  // namespace mw::io::detail
