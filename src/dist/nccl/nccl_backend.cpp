// The NCCL backend module (libmw_dist_nccl.so): backend_abi.h's five collectives on CUDA device
// buffers with NCCL (ncclAllReduce, ncclReduceScatter, ncclAllGather, ncclBroadcast; the barrier
// is a one-element ncclAllReduce), bootstrapped through MPI: rank 0's ncclUniqueId reaches the
// other ranks by MPI_Bcast. Loaded with dlopen only for --dist nccl (Note [Backend module],
// loader.cpp), so nothing else links libnccl.so; it links MPI, NCCL and cudart, nothing of
// memwall. Compiled against CUDA 13 and NCCL 2.28; one rank ran on an H200 (session 34: every
// collective on CUDA tensors), two ranks never have (docs/distributed.md, "NCCL").
//
// Invariants: only the communicator's progress thread calls in (backend_abi.h), and it makes this
// rank's device current in init and before every call that enqueues work. Each collective is
// enqueued on the module's own stream behind the compute stream's work (Note [NCCL stream order])
// and followed by an event that test() polls. The module's state is one static Module: a process
// has one communicator, as it has one MPI_COMM_WORLD.
//
// Note [NCCL stream order]: memwall's kernels run on the legacy default stream (Note [Copy stream
// and events], core/cuda_stream.h), and a caller starts a collective on a tensor right after it
// enqueued the kernels that produce it, without waiting for them. The module's stream is created
// cudaStreamNonBlocking, so that a gradient bucket's reduction can run beside backward's kernels;
// nothing then orders it against the producer implicitly. So start() records an event on
// cudaStreamLegacy and makes the module's stream wait on it (cudaStreamWaitEvent: the host does
// not block) before it enqueues the collective. The event captures everything enqueued on the
// compute stream by then: the producer (enqueued before the caller queued the collective, which
// happened before the progress thread called start), and possibly later kernels, which can only
// delay the collective, never corrupt it. Kernels the compute stream waits for on a copy stream
// are covered too (the event follows the stream's cudaStreamWaitEvent). cudaStreamSynchronize of
// the compute stream would order it as well, but it blocks the progress thread until the GPU
// drains. The other direction needs no event: Work::wait() returns once test() saw the
// collective's event complete, so a kernel enqueued after wait() reads the result, and the
// communicator drops its references to the tensors (a bucket returns to the caching allocator)
// only then.
//
// Note [In-place reduce-scatter]: backend_abi.h puts the piece of an in-place reduce_scatter
// (recv == send) at the front of the buffer, as MPI_IN_PLACE does; NCCL's in-place form wants
// recvbuff == sendbuff + rank * recvcount. So the reduction runs in place at this rank's offset
// and, on every rank but 0, a device-to-device copy on the same stream moves the piece to the
// front. The two ranges never overlap (rank * count >= count), and the buffer's other elements are
// undefined afterwards, as communicator.h says.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "dist/backend_abi.h"
#include "dist/launch.h"

namespace {

struct Module {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;        // the collectives' stream (non-blocking)
  cudaEvent_t compute_ready = nullptr;  // recorded on the compute stream before each collective
  int32_t* barrier_word = nullptr;      // device int32[1], the barrier's all-reduce
  int rank = 0, size = 1, device = -1;
  int local_rank = 0, local_size = 1, visible_devices = 0;
};
Module self;  // this process's one communicator

struct Request {
  cudaEvent_t done = nullptr;  // recorded on self.stream after the collective
};

void say(char* err, int err_len, const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vsnprintf(err, static_cast<size_t>(err_len), format, args);
  va_end(args);
}

// Each *_failed: false on success; else err says what failed and why.
bool cuda_failed(cudaError_t rc, const char* what, char* err, int err_len) {
  if (rc == cudaSuccess) return false;
  cudaGetLastError();  // not reported again by the next call
  say(err, err_len, "%s failed on rank %d (cuda:%d): %s (CUDA error %d)", what, self.rank,
      self.device, cudaGetErrorString(rc), static_cast<int>(rc));
  return true;
}

bool nccl_failed(ncclResult_t rc, const char* what, char* err, int err_len) {
  if (rc == ncclSuccess) return false;
  const char* detail = "";
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  detail = ncclGetLastError(self.comm);  // NCCL's own words; comm may be null (init)
#endif
  say(err, err_len, "%s failed on rank %d (cuda:%d): %s (NCCL error %d)%s%s", what, self.rank,
      self.device, ncclGetErrorString(rc), static_cast<int>(rc), detail[0] ? ": " : "", detail);
  return true;
}

bool mpi_failed(int rc, const char* what, char* err, int err_len) {
  if (rc == MPI_SUCCESS) return false;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof text, "?");
  say(err, err_len, "%s failed: %s (MPI error %d)", what, text, rc);
  return true;
}

ncclDataType_t nccl_type(int dtype) {
  switch (dtype) {
    case MW_DIST_F32: return ncclFloat32;
    case MW_DIST_F64: return ncclFloat64;
    case MW_DIST_I32: return ncclInt32;
    default: return ncclInt64;
  }
}

size_t element_bytes(int dtype) { return dtype == MW_DIST_F32 || dtype == MW_DIST_I32 ? 4 : 8; }

// ---- init ----

int start_mpi(char* err, int err_len) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // A CUDA-aware MPI may open a CUDA context in MPI_Init_thread, on the current device: make
    // it this rank's first (its launcher's local rank modulo the GPUs it sees, Note [Launchers]
    // in dist/launch.h), not GPU 0 in every rank. pick_device decides again from MPI's own view of
    // the host, which agrees; a failure here is reported there.
    const int local_rank = mw::dist::launch_from_environment().local_rank;
    int visible = 0;
    if (local_rank >= 0 && cudaGetDeviceCount(&visible) == cudaSuccess && visible > 0)
      cudaSetDevice(local_rank % visible);
    cudaGetLastError();
    int provided = 0;
    if (mpi_failed(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided),
                   "MPI_Init_thread", err, err_len))
      return 1;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);  // codes, not a killed job
  MPI_Comm_rank(MPI_COMM_WORLD, &self.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &self.size);
  return 0;
}

// This rank's device: its rank among the ranks on this host (MPI_COMM_TYPE_SHARED, which every
// launcher fills, unlike OMPI_COMM_WORLD_LOCAL_RANK), modulo the visible devices, so that a
// launcher giving each rank one device through CUDA_VISIBLE_DEVICES works too. Two ranks on one
// device are refused by ncclCommInitRank ("Duplicate GPU detected").
int pick_device(char* err, int err_len) {
  MPI_Comm local = MPI_COMM_NULL;
  if (mpi_failed(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, self.rank, MPI_INFO_NULL,
                                     &local),
                 "MPI_Comm_split_type (the ranks on this host)", err, err_len))
    return 1;
  MPI_Comm_rank(local, &self.local_rank);
  MPI_Comm_size(local, &self.local_size);
  MPI_Comm_free(&local);
  const cudaError_t rc = cudaGetDeviceCount(&self.visible_devices);
  if (rc != cudaSuccess || self.visible_devices == 0) {
    cudaGetLastError();
    say(err, err_len,
        "rank %d: no CUDA device is visible (cudaGetDeviceCount: %s); the NCCL backend needs a "
        "GPU per rank: check nvidia-smi and CUDA_VISIBLE_DEVICES, or train on cpu tensors with "
        "--dist mpi",
        self.rank, rc == cudaSuccess ? "0 devices" : cudaGetErrorString(rc));
    return 1;
  }
  self.device = self.local_rank % self.visible_devices;
  return cuda_failed(cudaSetDevice(self.device), "cudaSetDevice", err, err_len) ? 1 : 0;
}

// The ranks agree that every one of them got past `step`, so that one failing rank fails them all
// with an error instead of leaving the others in the next collective call forever. 0: all did;
// 1: one failed, and all know it; 2: the agreement itself failed (MPI).
int agree(int mine_failed, const char* step, char* err, int err_len) {
  int any_failed = 0;
  if (mpi_failed(MPI_Allreduce(&mine_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD),
                 "MPI_Allreduce (agreeing on the NCCL start)", err, err_len))
    return 2;
  if (any_failed && !mine_failed)
    say(err, err_len, "another rank failed at %s (its own error says why)", step);
  return any_failed ? 1 : 0;
}

// ncclGetUniqueId on rank 0, MPI_Bcast to all, ncclCommInitRank (blocking) on every rank.
int make_comm(char* err, int err_len) {
  struct {
    int failed = 0;
    ncclUniqueId id;
  } boot;
  std::memset(&boot.id, 0, sizeof boot.id);
  if (self.rank == 0)
    boot.failed = nccl_failed(ncclGetUniqueId(&boot.id), "ncclGetUniqueId", err, err_len);
  if (mpi_failed(MPI_Bcast(&boot, sizeof boot, MPI_BYTE, 0, MPI_COMM_WORLD),
                 "MPI_Bcast of the NCCL unique id", err, err_len))
    return 1;
  if (boot.failed) {
    if (self.rank != 0)
      say(err, err_len, "rank 0 could not make the NCCL unique id (see its error)");
    return 1;
  }
  char what[160];
  std::snprintf(what, sizeof what,
                "ncclCommInitRank (local rank %d of %d on this host, %d CUDA devices visible)",
                self.local_rank, self.local_size, self.visible_devices);
  ncclComm_t comm = nullptr;
  if (nccl_failed(ncclCommInitRank(&comm, self.size, boot.id, self.rank), what, err, err_len))
    return 1;
  self.comm = comm;
  return 0;
}

int make_stream(char* err, int err_len) {
  return cuda_failed(cudaStreamCreateWithFlags(&self.stream, cudaStreamNonBlocking),
                     "cudaStreamCreateWithFlags (the NCCL stream)", err, err_len) ||
         cuda_failed(cudaEventCreateWithFlags(&self.compute_ready, cudaEventDisableTiming),
                     "cudaEventCreateWithFlags", err, err_len) ||
         cuda_failed(cudaMalloc(&self.barrier_word, sizeof(int32_t)), "cudaMalloc (4 bytes)", err,
                     err_len) ||
         cuda_failed(cudaMemset(self.barrier_word, 0, sizeof(int32_t)), "cudaMemset", err, err_len);
}

void abort_library() {
  if (self.comm) ncclCommAbort(self.comm);  // returns without waiting for the other ranks
  self.comm = nullptr;
}

void release_stream() {
  if (self.device >= 0) cudaSetDevice(self.device);
  if (self.barrier_word) cudaFree(self.barrier_word);
  if (self.compute_ready) cudaEventDestroy(self.compute_ready);
  if (self.stream) cudaStreamDestroy(self.stream);
  self.barrier_word = nullptr, self.compute_ready = nullptr, self.stream = nullptr;
}

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// Each step is agreed on, so a failure is every rank's: they all release NCCL and finalise MPI,
// and exit with the error as a clean job (mpirun reports no "exiting improperly").
int init(int* rank, int* size, char* err, int err_len) {
  if (start_mpi(err, err_len)) return 1;
  int failed = agree(pick_device(err, err_len), "choosing its CUDA device", err, err_len);
  if (!failed) failed = agree(make_comm(err, err_len), "starting NCCL", err, err_len);
  if (!failed) failed = agree(make_stream(err, err_len), "creating its NCCL stream", err, err_len);
  if (failed) {
    abort_library();
    release_stream();
    if (failed == 1) finalize_mpi();  // not when MPI itself failed: that could wait forever
    return 1;
  }
  *rank = self.rank;
  *size = self.size;
  return 0;
}

// ---- collectives ----

int reduce_scatter(const void* send, void* recv, size_t count, int dtype, char* err, int err_len) {
  const ncclDataType_t t = nccl_type(dtype);
  if (send != recv)
    return nccl_failed(ncclReduceScatter(send, recv, count, t, ncclSum, self.comm, self.stream),
                       "ncclReduceScatter", err, err_len);
  // Note [In-place reduce-scatter]
  const size_t piece_bytes = count * element_bytes(dtype);
  char* piece = static_cast<char*>(recv) + static_cast<size_t>(self.rank) * piece_bytes;
  if (nccl_failed(ncclReduceScatter(send, piece, count, t, ncclSum, self.comm, self.stream),
                  "ncclReduceScatter (in place)", err, err_len))
    return 1;
  if (self.rank == 0 || piece_bytes == 0) return 0;
  return cuda_failed(
      cudaMemcpyAsync(recv, piece, piece_bytes, cudaMemcpyDeviceToDevice, self.stream),
      "cudaMemcpyAsync (the in-place reduce_scatter's piece to the front)", err, err_len);
}

int enqueue(int kind, const void* send, void* recv, size_t count, int dtype, int root, char* err,
            int err_len) {
  const ncclDataType_t t = nccl_type(dtype);
  switch (kind) {
    case MW_DIST_ALL_REDUCE:
      return nccl_failed(ncclAllReduce(send, recv, count, t, ncclSum, self.comm, self.stream),
                         "ncclAllReduce", err, err_len);
    case MW_DIST_REDUCE_SCATTER: return reduce_scatter(send, recv, count, dtype, err, err_len);
    case MW_DIST_ALL_GATHER:
      return nccl_failed(ncclAllGather(send, recv, count, t, self.comm, self.stream),
                         "ncclAllGather", err, err_len);
    case MW_DIST_BROADCAST:
      return nccl_failed(ncclBroadcast(recv, recv, count, t, root, self.comm, self.stream),
                         "ncclBroadcast", err, err_len);
    default:  // the barrier: every rank's all-reduce completes only when all have started it
      return nccl_failed(ncclAllReduce(self.barrier_word, self.barrier_word, 1, ncclInt32, ncclSum,
                                       self.comm, self.stream),
                         "ncclAllReduce (barrier)", err, err_len);
  }
}

int start(int kind, const void* send, void* recv, int64_t count, int dtype, int root,
          void** request, char* err, int err_len) {
  if (!self.comm) {
    say(err, err_len, "the NCCL communicator was aborted after an earlier error");
    return 1;
  }
  if (cuda_failed(cudaSetDevice(self.device), "cudaSetDevice", err, err_len)) return 1;
  // Note [NCCL stream order]: behind everything enqueued on the compute stream so far.
  if (cuda_failed(cudaEventRecord(self.compute_ready, cudaStreamLegacy),
                  "cudaEventRecord on the compute stream", err, err_len) ||
      cuda_failed(cudaStreamWaitEvent(self.stream, self.compute_ready, 0), "cudaStreamWaitEvent",
                  err, err_len))
    return 1;
  if (enqueue(kind, send, recv, static_cast<size_t>(count), dtype, root, err, err_len)) return 1;
  auto* req = new Request;
  if (cuda_failed(cudaEventCreateWithFlags(&req->done, cudaEventDisableTiming),
                  "cudaEventCreateWithFlags", err, err_len) ||
      cuda_failed(cudaEventRecord(req->done, self.stream), "cudaEventRecord on the NCCL stream",
                  err, err_len)) {
    if (req->done) cudaEventDestroy(req->done);
    delete req;
    return 1;
  }
  *request = req;
  return 0;
}

void release(Request* req) {
  cudaEventDestroy(req->done);
  delete req;
}

bool healthy(ncclResult_t async) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
  if (async == ncclInProgress) return true;
#endif
  return async == ncclSuccess;
}

// Done when the event after the collective completed; an NCCL error (a peer gone, a network
// failure) is read with ncclCommGetAsyncError and aborts the communicator, since a collective
// that failed may never complete.
int test(void* request, char* err, int err_len) {
  auto* req = static_cast<Request*>(request);
  const cudaError_t rc = cudaEventQuery(req->done);
  if (rc == cudaSuccess) {
    release(req);
    return 1;
  }
  if (rc != cudaErrorNotReady) {
    cuda_failed(
        rc,
        "a collective on the NCCL stream (cudaEventQuery; the error may be an earlier kernel's)",
        err, err_len);
    release(req);
    abort_library();
    return -1;
  }
  cudaGetLastError();  // "not ready" is an answer, not an error for the next call
  if (!self.comm) {
    say(err, err_len, "the NCCL communicator was aborted with a collective in flight");
    release(req);
    return -1;
  }
  ncclResult_t async = ncclSuccess;
  const ncclResult_t q = ncclCommGetAsyncError(self.comm, &async);
  if (q == ncclSuccess && healthy(async)) return 0;
  nccl_failed(q != ncclSuccess ? q : async, "a collective (ncclCommGetAsyncError)", err, err_len);
  release(req);
  abort_library();
  return -1;
}

void finalize() {
  if (self.comm) {
    cudaStreamSynchronize(self.stream);  // every collective completed already (backend_abi.h)
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
    ncclCommFinalize(self.comm);  // blocking communicator: returns when its operations are flushed
#endif
    ncclCommDestroy(self.comm);
    self.comm = nullptr;
  }
  release_stream();
  finalize_mpi();
}

void host_name(char* out, int out_len) {
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::snprintf(out, static_cast<size_t>(out_len), "%s", name);
}

int device() { return self.device; }

const mw_dist_backend_v2 kBackend = {
    {"nccl", init, start, test, finalize, host_name}, MW_DIST_MEMORY_CUDA, device, abort_library};

}  // namespace

// Both entries: a loader that knows only v1 would still find the collectives, but memwall reads
// v2 first and learns from it that the buffers are device memory.
extern "C" __attribute__((visibility("default"))) const mw_dist_backend_v1*
mw_dist_backend_v1_entry() {
  return &kBackend.v1;
}

extern "C" __attribute__((visibility("default"))) const mw_dist_backend_v2*
mw_dist_backend_v2_entry() {
  return &kBackend;
}
