// AsyncCommunicator: a Communicator over a backend module (backend_abi.h). One progress thread
// owns the library: it initialises it, starts the queued collectives in call order, polls them,
// enforces the timeout (Note [Collective timeouts]) and finalises the library at the end. Callers
// only queue and wait, so a collective runs while the caller computes (backward goes on while a
// gradient bucket is reduced).
//
// Invariant: at most one collective is in flight; they start and complete in call order, the same
// order on every rank. A backend of CUDA memory (NCCL) takes tensors on its device only, every
// other backend host tensors only (check_collective_tensor).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/backend_abi.h"
#include "dist/communicator.h"

namespace mw::dist {

class AsyncCommunicator : public Communicator {
 public:
  // Starts the progress thread and the library; CommError when the library cannot start.
  AsyncCommunicator(const mw_dist_backend_v2& backend, double timeout_ms);
  // A v1 backend: host memory, no abort (backend_abi.h).
  AsyncCommunicator(const mw_dist_backend_v1* backend, double timeout_ms);
  ~AsyncCommunicator() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return backend_.v1.name; }
  int cuda_device() const override { return cuda_device_; }
  Work all_reduce(const Tensor& t) override;
  Work reduce_scatter(const Tensor& input, const Tensor& output) override;
  Work all_gather(const Tensor& input, const Tensor& output) override;
  Work broadcast(const Tensor& t, int root) override;
  Work barrier() override;
  CommStats stats() const override;
  void reset_stats() override;
  void set_timeout_ms(double timeout_ms) override;
  void abandon() override;

  struct Op;

 private:
  Work enqueue(std::shared_ptr<Op> op);
  void run();
  void progress(Op& op);  // starts and polls one collective on the progress thread
  std::string describe(const Op& op) const;

  const mw_dist_backend_v2 backend_;
  int rank_ = 0, size_ = 1;
  int cuda_device_ = -1;  // the backend's device (set by the progress thread before started_)
  std::string host_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Op>> queue_;
  bool stopping_ = false, started_ = false, broken_ = false;
  std::string start_error_, broken_reason_;
  double timeout_ms_;
  std::atomic<bool> abandoned_{false};
  std::vector<Tensor> given_up_;  // progress thread: tensors a given-up MPI collective may write
  int64_t sequence_ = 0;
  struct StatsBox {
    std::mutex mutex;
    CommStats stats;
  };
  std::shared_ptr<StatsBox> stats_;  // shared with the Work states, which add their wait time
  std::thread thread_;
};

}  // namespace mw::dist
