// Work handles, statistics, tensor checks and the single-process communicator (communicator.h).
#include "dist/communicator.h"

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>

#include "dist/work_state.h"

namespace mw::dist {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllGather: return "all_gather";
    case Collective::kBroadcast: return "broadcast";
    default: return "barrier";
  }
}

int64_t CommStats::total_wire_bytes() const {
  int64_t s = 0;
  for (int64_t b : wire_bytes) s += b;
  return s;
}

int64_t CommStats::total_payload_bytes() const {
  int64_t s = 0;
  for (int64_t b : payload_bytes) s += b;
  return s;
}

void Work::wait() {
  if (!state_) return;
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->cv.wait(lock, [&] { return state_->done; });
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (state_->on_wait) state_->on_wait(ms);
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Work::done() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->done;
}

void Work::State::finish(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
    error = std::move(e);
  }
  cv.notify_all();
}

void check_collective_tensor(const Tensor& t, const char* what, int cuda_device) {
  MW_CHECK_T(InvalidArgument, t.defined(), what, ": the tensor is undefined");
  if (cuda_device < 0) {
    MW_CHECK_T(InvalidArgument, !t.device().is_cuda(), what, ": ", t.desc(),
               " is on a CUDA device; the MPI and local backends take cpu or sim tensors (copy it "
               "to the host first, or use the NCCL backend: --dist nccl)");
  } else {
    MW_CHECK_T(InvalidArgument, t.device().is_cuda() && t.device().index == cuda_device, what, ": ",
               t.desc(), " is not on cuda:", cuda_device,
               ", the device of this rank's NCCL communicator (chosen by the rank's place on its "
               "host); put the tensor there, or use --dist mpi for cpu or sim tensors");
  }
  MW_CHECK_T(InvalidArgument, t.is_contiguous(), what, ": ", t.desc(),
             " is not contiguous; pass .contiguous()");
  const DType d = t.dtype();
  MW_CHECK_T(InvalidArgument,
             d == DType::F32 || d == DType::F64 || d == DType::I32 || d == DType::I64, what, ": ",
             t.desc(), " has a dtype collectives do not take; use f32, f64, i32 or i64");
}

void check_shard_shapes(const Tensor& input, const Tensor& output, int64_t size, bool scatter,
                        int cuda_device) {
  const char* what = scatter ? "reduce_scatter" : "all_gather";
  check_collective_tensor(input, what, cuda_device);
  check_collective_tensor(output, what, cuda_device);
  MW_CHECK_T(InvalidArgument, input.dtype() == output.dtype(), what, ": input ", input.desc(),
             " and output ", output.desc(), " differ in dtype");
  const Tensor& whole = scatter ? input : output;
  const Tensor& piece = scatter ? output : input;
  MW_CHECK_T(InvalidArgument, whole.numel() == size * piece.numel(), what, ": expected the ",
             scatter ? "input" : "output", " to hold ", size, " x the ", piece.numel(),
             " elements of the ", scatter ? "output" : "input", ", found ", whole.numel(),
             "; pad the buffer to a multiple of the number of ranks");
}

namespace {

// Size 1: the sum over one rank is the tensor itself, its only piece is the whole. Its copies
// write raw bytes, as the MPI backend does: a collective is not an in-place op that autograd
// tracks (ZeRO 3 gathers a parameter again, same values, under a tensor saved for backward).
void copy_raw(const Tensor& input, const Tensor& output) {
  if (!input.is_same(output) && input.raw_data() != output.raw_data())  // in place: nothing
    copy_bytes(output.raw_data(), output.device(), input.raw_data(), input.device(),
               input.nbytes());
}

class LocalCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }
  Work all_reduce(const Tensor& t) override {
    check_collective_tensor(t, "all_reduce");
    count(Collective::kAllReduce, t.nbytes());
    return Work();
  }
  Work reduce_scatter(const Tensor& input, const Tensor& output) override {
    check_shard_shapes(input, output, 1, true);
    count(Collective::kReduceScatter, input.nbytes());
    copy_raw(input, output);
    return Work();
  }
  Work all_gather(const Tensor& input, const Tensor& output) override {
    check_shard_shapes(input, output, 1, false);
    count(Collective::kAllGather, output.nbytes());
    copy_raw(input, output);
    return Work();
  }
  Work broadcast(const Tensor& t, int root) override {
    check_collective_tensor(t, "broadcast");
    MW_CHECK_T(InvalidArgument, root == 0, "broadcast from rank ", root, ": there is one rank");
    count(Collective::kBroadcast, t.nbytes());
    return Work();
  }
  Work barrier() override {
    count(Collective::kBarrier, 0);
    return Work();
  }
  CommStats stats() const override { return stats_; }
  void reset_stats() override { stats_ = {}; }
  void set_timeout_ms(double) override {}
  void abandon() override {}

 private:
  void count(Collective c, int64_t bytes) {  // nothing crosses a wire
    ++stats_.calls[static_cast<int>(c)];
    stats_.payload_bytes[static_cast<int>(c)] += bytes;
  }
  CommStats stats_;
};

}  // namespace

std::shared_ptr<Communicator> make_local_communicator() {
  return std::make_shared<LocalCommunicator>();
}

namespace {

class MemoryRequiringCommunicator : public Communicator {
 public:
  MemoryRequiringCommunicator(std::shared_ptr<Communicator> inner, Device memory)
      : inner_(std::move(inner)), memory_(memory) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  std::optional<Device> required_memory() const override { return memory_; }
  Work all_reduce(const Tensor& t) override {
    check(t, "all_reduce");
    return inner_->all_reduce(t);
  }
  Work reduce_scatter(const Tensor& in, const Tensor& out) override {
    check(in, "reduce_scatter"), check(out, "reduce_scatter");
    return inner_->reduce_scatter(in, out);
  }
  Work all_gather(const Tensor& in, const Tensor& out) override {
    check(in, "all_gather"), check(out, "all_gather");
    return inner_->all_gather(in, out);
  }
  Work broadcast(const Tensor& t, int root) override {
    check(t, "broadcast");
    return inner_->broadcast(t, root);
  }
  Work barrier() override { return inner_->barrier(); }
  CommStats stats() const override { return inner_->stats(); }
  void reset_stats() override { inner_->reset_stats(); }
  void set_timeout_ms(double ms) override { inner_->set_timeout_ms(ms); }
  void abandon() override { inner_->abandon(); }

 private:
  void check(const Tensor& t, const char* what) const {
    MW_CHECK_T(InvalidArgument, t.defined() && t.device() == memory_, what, ": ", t.desc(),
               " is not on ", memory_.str(),
               ", the memory this communicator requires (NCCL would refuse it too: Note "
               "[Device memory on the CPU])");
  }
  std::shared_ptr<Communicator> inner_;
  Device memory_;
};

}  // namespace

std::shared_ptr<Communicator> require_memory(std::shared_ptr<Communicator> inner, Device memory) {
  return std::make_shared<MemoryRequiringCommunicator>(std::move(inner), memory);
}

// Note [Staged collectives].
void StagedWork::wait() {
  work_.wait();
  if (out_.defined() && out_.raw_data() != staged_.raw_data()) out_.copy_(staged_);
  staged_ = out_ = Tensor();  // once
}

Tensor in_comm_memory(const Communicator& comm, const Tensor& t) {
  const std::optional<Device> m = comm.required_memory();
  return !m || t.device() == *m ? t : t.to(*m);
}

namespace {

// An output in the communicator's memory: itself when it is there, else an empty one there.
Tensor staged_output(const Communicator& comm, const Tensor& out) {
  const std::optional<Device> m = comm.required_memory();
  return !m || out.device() == *m ? out : Tensor::empty(out.shape(), out.dtype(), *m);
}

}  // namespace

StagedWork staged_all_reduce(Communicator& comm, const Tensor& t) {
  Tensor s = in_comm_memory(comm, t);
  return {comm.all_reduce(s), s, t};
}

StagedWork staged_broadcast(Communicator& comm, const Tensor& t, int root) {
  Tensor s = in_comm_memory(comm, t);
  return {comm.broadcast(s, root), s, t};
}

StagedWork staged_reduce_scatter(Communicator& comm, const Tensor& input, const Tensor& output) {
  Tensor in = in_comm_memory(comm, input);
  // In place (output = input's front, the same bytes): the staged output is the staged input's.
  const bool in_place = output.raw_data() == input.raw_data();
  Tensor out = in_place && in.raw_data() != input.raw_data() ? in.narrow(0, 0, output.numel())
                                                             : staged_output(comm, output);
  return {comm.reduce_scatter(in, out), out, output};
}

int64_t value_from_rank0(Communicator& comm, int64_t x) {
  Tensor t = Tensor::full({1}, static_cast<double>(x), DType::I64);
  staged_broadcast(comm, t, 0).wait();
  return t.data<int64_t>()[0];
}

StagedWork staged_all_gather(Communicator& comm, const Tensor& input, const Tensor& output) {
  Tensor out = staged_output(comm, output);
  return {comm.all_gather(in_comm_memory(comm, input), out), out, output};
}

}  // namespace mw::dist
