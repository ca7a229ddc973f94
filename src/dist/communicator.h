// Collective communication between the ranks of a data-parallel job: the Communicator interface,
// its asynchronous Work handles, its errors and statistics, and make_communicator, which picks the
// backend for how the process was launched (docs/distributed.md).
//
// Every collective takes contiguous tensors of f32, f64, i32 or i64: in host memory (cpu or sim)
// on the local and MPI backends, on the communicator's CUDA device (cuda_device()) on the NCCL
// backend. It is started in the order of the calls (all ranks must call the same collectives in
// the same order: MPI's rule) and returns a Work at once; the tensors must stay untouched until
// its wait() returns. The communicator keeps a reference to them until the collective completes,
// so a caller may drop its own (a bucket freed as soon as its reduction is done). On the NCCL
// backend a collective runs after every kernel enqueued on the compute stream before the call,
// so its input needs no synchronisation first (Note [NCCL stream order], dist/nccl/).
//
// Note [Collective timeouts]: a collective that has not completed `timeout_ms` after it started
// fails with CommTimeout naming the collective, its size, this rank and the ranks taking part;
// the communicator is then broken (every later collective fails at once) and is torn down without
// MPI_Finalize (NCCL: with ncclCommAbort), so the process can exit with the error instead of
// hanging on a rank that died or stalled. The launcher (mpirun) then stops the other ranks. The
// collective given up may still be writing into its tensors: NCCL's is aborted at once, before
// they are let go; MPI's cannot be, so its tensors are kept until the communicator goes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/error.h"
#include "core/tensor.h"

namespace mw::dist {

// A collective failed: the library reported an error, or the communicator is broken.
class CommError : public Error {
 public:
  using Error::Error;
};

// A collective did not complete in time (Note [Collective timeouts]).
class CommTimeout : public CommError {
 public:
  using CommError::CommError;
};

enum class Collective { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier };
constexpr int kNumCollectives = 5;
const char* collective_name(Collective c);  // "all_reduce", ...

// Counted by the communicator, per collective kind. payload: the bytes of the tensor handed in
// (all_reduce and broadcast: the tensor; reduce_scatter: the input; all_gather: the output). wire:
// what each rank sends with the bandwidth-optimal (ring) algorithm, the ZeRO paper's unit:
// all_reduce 2(N-1)/N x payload, reduce_scatter and all_gather (N-1)/N x payload, broadcast
// (N-1)/N x payload (pipelined), barrier 0.
struct CommStats {
  std::array<int64_t, kNumCollectives> calls{}, payload_bytes{}, wire_bytes{};
  double busy_ms = 0;  // time with at least one collective in flight
  double wait_ms = 0;  // time callers spent blocked in Work::wait()
  int64_t total_wire_bytes() const;
  int64_t total_payload_bytes() const;
};

// The handle of one collective.
class Work {
 public:
  struct State;
  Work() = default;
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}
  // Blocks until the collective completed; throws its CommError / CommTimeout. A default Work
  // (nothing to wait for) returns at once.
  void wait();
  bool done() const;

 private:
  std::shared_ptr<State> state_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "local", "mpi", "nccl"
  // The CUDA device whose tensors the collectives take (NCCL: chosen by this rank's place on its
  // host, so the caller puts its model there); -1 for the backends of host tensors.
  virtual int cuda_device() const { return -1; }
  // Where every collective's tensors must be (Note [Staged collectives]): cuda:cuda_device() on
  // NCCL; none on the backends of host tensors (cpu and sim alike).
  virtual std::optional<Device> required_memory() const {
    if (cuda_device() < 0) return std::nullopt;
    return Device::cuda(cuda_device());
  }
  // Sum over ranks, in place.
  virtual Work all_reduce(const Tensor& t) = 0;
  // input: size() * k elements; output: k elements, this rank's piece of the sum. output may be
  // input's first k elements (the same address): in place, input's other elements then undefined.
  virtual Work reduce_scatter(const Tensor& input, const Tensor& output) = 0;
  // input: k elements; output: size() * k, rank r's input at [r * k, (r + 1) * k).
  virtual Work all_gather(const Tensor& input, const Tensor& output) = 0;
  // root's t to every rank, in place.
  virtual Work broadcast(const Tensor& t, int root) = 0;
  virtual Work barrier() = 0;
  virtual CommStats stats() const = 0;
  virtual void reset_stats() = 0;
  // Note [Collective timeouts]; <= 0: wait forever.
  virtual void set_timeout_ms(double timeout_ms) = 0;
  // This process is failing (an error on this rank only): collectives in flight are given up and
  // the library is not finalised (that would wait for the other ranks), so the process can exit
  // at once with its error and the launcher stops the others.
  virtual void abandon() = 0;
};

// Note [Staged collectives]: the NCCL backend takes tensors on its rank's GPU only, but some
// callers hold theirs elsewhere (Gemini's chunks live in RAM, on disk and on the device). A staged
// collective runs on copies of the tensors in the communicator's memory (cuda_device()), made on
// the compute stream before it starts (so it reads them: Note [NCCL stream order]); wait() then
// copies the result back into the caller's output. Where the tensors are already there (or on the
// host backends, whose memory is the host's) it is the collective itself, without a copy. The
// copies are transients of the collective's size on the device, beside what the caller planned.
class StagedWork {
 public:
  StagedWork() = default;
  StagedWork(Work work, Tensor staged_out, Tensor out)
      : work_(std::move(work)), staged_(std::move(staged_out)), out_(std::move(out)) {}
  // Waits for the collective (throwing its error) and copies its result into the output.
  void wait();
  bool done() const { return work_.done(); }

 private:
  Work work_;
  Tensor staged_, out_;  // the collective's output and the caller's, when they differ
};

// `t` in the communicator's memory: itself when it is there, else a copy.
Tensor in_comm_memory(const Communicator& comm, const Tensor& t);
StagedWork staged_all_reduce(Communicator& comm, const Tensor& t);
StagedWork staged_broadcast(Communicator& comm, const Tensor& t, int root);
StagedWork staged_reduce_scatter(Communicator& comm, const Tensor& input, const Tensor& output);
StagedWork staged_all_gather(Communicator& comm, const Tensor& input, const Tensor& output);
// Rank 0's x on every rank: a staged broadcast of one element, waited for.
int64_t value_from_rank0(Communicator& comm, int64_t x);

// The single-process communicator (size 1, no library): every collective is a copy or nothing.
std::shared_ptr<Communicator> make_local_communicator();

struct CommOptions {
  // "auto": MPI when launched by mpirun (Note [Backend module]), else local; "local"; "mpi";
  // "nccl" (CUDA tensors; never chosen by auto).
  std::string backend = "auto";
  double timeout_ms = 300000;  // Note [Collective timeouts]
};

// What the launcher's environment says (Note [Launchers], dist/launch.h): whether an MPI launcher
// started this process; how many processes it started (0 when it does not say); this process's
// place among them on its host (-1 when it does not say).
bool launched_by_mpi();
int launcher_world_size();
int launcher_local_rank();
std::shared_ptr<Communicator> make_communicator(const CommOptions& options);

// Note [Device memory on the CPU]: NCCL's rule, every collective's tensors on the rank's device,
// checked without a GPU. `inner` (MPI, local) with required_memory() = `memory` (sim): each
// collective refuses a tensor elsewhere, so a caller that would hand NCCL a host tensor fails
// here as it would there, and the buckets, pieces and staging copies go to that device.
// make_communicator returns one when $MW_DIST_DEVICE_MEMORY=sim (the end-to-end tests'
// stand-in for NCCL, docs/distributed.md).
std::shared_ptr<Communicator> require_memory(std::shared_ptr<Communicator> inner, Device memory);

// The element type of a collective; InvalidArgument naming `what` for any other dtype, a
// non-contiguous tensor, or one in the wrong memory: cuda_device < 0 (local, MPI) takes host
// tensors only, cuda_device >= 0 (NCCL) tensors on cuda:cuda_device only.
void check_collective_tensor(const Tensor& t, const char* what, int cuda_device = -1);

}  // namespace mw::dist
