// AsyncCommunicator: the progress thread, the queue and the timeouts (async_communicator.h).
#include "dist/async_communicator.h"

#include <algorithm>
#include <chrono>
#include <future>

#include "core/numbers.h"
#include "dist/work_state.h"

namespace mw::dist {

struct AsyncCommunicator::Op {
  Collective kind;
  Tensor send, recv;  // held until the collective completes
  int64_t count = 0;  // elements per rank (backend_abi.h's meaning)
  int root = 0;
  int64_t sequence = 0;
  std::shared_ptr<Work::State> state;
};

namespace {

using clock = std::chrono::steady_clock;

int abi_dtype(const Tensor& t) {
  switch (t.dtype()) {
    case DType::F32: return MW_DIST_F32;
    case DType::F64: return MW_DIST_F64;
    case DType::I32: return MW_DIST_I32;
    default: return MW_DIST_I64;
  }
}

// Note [Collective timeouts]'s arithmetic for the wire bytes of one rank.
int64_t wire_bytes(Collective c, int64_t payload_bytes, int64_t size) {
  const int64_t share = payload_bytes / size * (size - 1);
  return c == Collective::kAllReduce ? 2 * share : c == Collective::kBarrier ? 0 : share;
}

std::shared_ptr<AsyncCommunicator::Op> make_op(Collective kind, const Tensor& send,
                                               const Tensor& recv, int64_t count, int root = 0) {
  auto op = std::make_shared<AsyncCommunicator::Op>();
  op->kind = kind, op->send = send, op->recv = recv, op->count = count, op->root = root;
  return op;
}

}  // namespace

AsyncCommunicator::AsyncCommunicator(const mw_dist_backend_v1* backend, double timeout_ms)
    : AsyncCommunicator(mw_dist_backend_v2{*backend, MW_DIST_MEMORY_HOST, nullptr, nullptr},
                        timeout_ms) {}

AsyncCommunicator::AsyncCommunicator(const mw_dist_backend_v2& backend, double timeout_ms)
    : backend_(backend), timeout_ms_(timeout_ms), stats_(std::make_shared<StatsBox>()) {
  thread_ = std::thread([this] { run(); });
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return started_; });
  if (!start_error_.empty()) {
    lock.unlock();
    thread_.join();
    throw CommError(str("the ", backend_.v1.name, " backend did not start: ", start_error_));
  }
}

AsyncCommunicator::~AsyncCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void AsyncCommunicator::run() {
  char err[512] = {0};
  const int rc = backend_.v1.init(&rank_, &size_, err, sizeof err);
  char host[256] = {0};
  if (rc == 0) backend_.v1.host_name(host, sizeof host);
  if (rc == 0 && backend_.memory == MW_DIST_MEMORY_CUDA) cuda_device_ = backend_.device();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    started_ = true;
    host_ = host;
    if (rc != 0) start_error_ = err[0] ? err : "init failed";
  }
  cv_.notify_all();
  if (rc != 0) return;
  for (;;) {
    std::shared_ptr<Op> op;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) break;  // stopping, with every collective done
      op = queue_.front();
      queue_.pop_front();
    }
    progress(*op);
  }
  // A broken communicator may have a collective in flight that will never complete: MPI_Finalize
  // would wait for it, so the process exits without it (Note [Collective timeouts]); a backend
  // that can abort (NCCL: ncclCommAbort) releases its library without waiting.
  if (!broken_ && !abandoned_)
    backend_.v1.finalize();
  else if (backend_.abort)
    backend_.abort();
}

std::string AsyncCommunicator::describe(const Op& op) const {
  const Tensor& t = op.recv.defined() ? op.recv : op.send;
  std::string s = str(collective_name(op.kind), " #", op.sequence);
  if (t.defined()) s += str(" of ", t.desc(), " (", format_thousands(t.nbytes()), " bytes)");
  return s + str(" on rank ", rank_, " of ranks 0-", size_ - 1, " (host ", host_, ")");
}

void AsyncCommunicator::progress(Op& op) {
  auto fail = [&](auto error) {
    op.send = op.recv = Tensor();
    op.state->finish(std::make_exception_ptr(error));
  };
  // A collective given up (timed out, or this rank failing) may still be running and writing into
  // its tensors, which the caller frees once its wait throws. A backend that can abort stops it
  // first (NCCL: ncclCommAbort, without waiting for the other ranks); one that cannot (MPI) has
  // its tensors kept until the communicator goes, at the process's end.
  auto give_up = [&](auto error) {
    if (backend_.abort)
      backend_.abort();
    else
      given_up_.insert(given_up_.end(), {op.send, op.recv});
    fail(error);
  };
  if (broken_ || abandoned_) {
    fail(CommError(
        str(describe(op), " was not started: the communicator is broken (", broken_reason_, ")")));
    return;
  }
  char err[512] = {0};
  void* request = nullptr;
  const void* send = op.send.defined() ? op.send.raw_data() : nullptr;
  void* recv = op.recv.defined() ? op.recv.raw_data() : nullptr;
  const auto t0 = clock::now();
  if (backend_.v1.start(static_cast<int>(op.kind), send, recv, op.count,
                        op.recv.defined() ? abi_dtype(op.recv) : MW_DIST_F32, op.root, &request,
                        err, sizeof err) != 0) {
    broken_ = true, broken_reason_ = err;
    fail(CommError(str(describe(op), ": ", err)));
    return;
  }
  // Polled with a growing sleep (2 us .. 1 ms): a small collective completes within
  // microseconds, a waiting one costs no core (the machine may be oversubscribed).
  auto sleep = std::chrono::microseconds(2);
  for (;;) {
    const int done = backend_.v1.test(request, err, sizeof err);
    const double elapsed_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    if (done == 1) {
      std::lock_guard<std::mutex> lock(stats_->mutex);
      stats_->stats.busy_ms += elapsed_ms;
      break;
    }
    if (abandoned_) {
      give_up(CommError(str(describe(op), " was given up: this rank is failing")));
      return;
    }
    if (done < 0) {
      broken_ = true, broken_reason_ = err;
      fail(CommError(str(describe(op), ": ", err)));
      return;
    }
    double timeout_ms;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      timeout_ms = timeout_ms_;
    }
    if (timeout_ms > 0 && elapsed_ms > timeout_ms) {
      broken_ = true;
      broken_reason_ = str(collective_name(op.kind), " #", op.sequence, " timed out");
      give_up(CommTimeout(str(
          describe(op), " did not complete within ", format_fixed(timeout_ms / 1000, 1),
          " s: another rank has died, stalled, or called its collectives in a different order. ",
          "If a rank is only slow (a busy machine, a long checkpoint), raise --dist-timeout")));
      return;
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
  }
  op.send = op.recv = Tensor();  // a bucket dropped by its caller is freed now
  op.state->finish();
}

Work AsyncCommunicator::enqueue(std::shared_ptr<Op> op) {
  op->state = std::make_shared<Work::State>();
  std::weak_ptr<StatsBox> box = stats_;
  op->state->on_wait = [box](double ms) {
    if (auto b = box.lock()) {
      std::lock_guard<std::mutex> lock(b->mutex);
      b->stats.wait_ms += ms;
    }
  };
  const Tensor& t = op->kind == Collective::kReduceScatter ? op->send : op->recv;
  const int64_t bytes = t.defined() ? t.nbytes() : 0;
  {
    std::lock_guard<std::mutex> lock(stats_->mutex);
    const int k = static_cast<int>(op->kind);
    ++stats_->stats.calls[k];
    stats_->stats.payload_bytes[k] += bytes;
    stats_->stats.wire_bytes[k] += wire_bytes(op->kind, bytes, size_);
  }
  Work work(op->state);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    op->sequence = sequence_++;
    queue_.push_back(std::move(op));
  }
  cv_.notify_all();
  return work;
}

Work AsyncCommunicator::all_reduce(const Tensor& t) {
  check_collective_tensor(t, "all_reduce", cuda_device_);
  return enqueue(make_op(Collective::kAllReduce, t, t, t.numel()));
}

Work AsyncCommunicator::reduce_scatter(const Tensor& input, const Tensor& output) {
  check_shard_shapes(input, output, size_, true, cuda_device_);
  return enqueue(make_op(Collective::kReduceScatter, input, output, output.numel()));
}

Work AsyncCommunicator::all_gather(const Tensor& input, const Tensor& output) {
  check_shard_shapes(input, output, size_, false, cuda_device_);
  return enqueue(make_op(Collective::kAllGather, input, output, input.numel()));
}

Work AsyncCommunicator::broadcast(const Tensor& t, int root) {
  check_collective_tensor(t, "broadcast", cuda_device_);
  MW_CHECK_T(InvalidArgument, root >= 0 && root < size_, "broadcast from rank ", root,
             ": expected a rank in 0-", size_ - 1);
  return enqueue(make_op(Collective::kBroadcast, Tensor(), t, t.numel(), root));
}

Work AsyncCommunicator::barrier() {
  return enqueue(make_op(Collective::kBarrier, Tensor(), Tensor(), 0));
}

CommStats AsyncCommunicator::stats() const {
  std::lock_guard<std::mutex> lock(stats_->mutex);
  return stats_->stats;
}

void AsyncCommunicator::reset_stats() {
  std::lock_guard<std::mutex> lock(stats_->mutex);
  stats_->stats = {};
}

void AsyncCommunicator::abandon() {
  abandoned_ = true;
  cv_.notify_all();
}

void AsyncCommunicator::set_timeout_ms(double timeout_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  timeout_ms_ = timeout_ms;
}

}  // namespace mw::dist
