// The MPI backend module (libmw_dist_mpi.so): backend_abi.h's five collectives on MPI's
// non-blocking ones (MPI_Iallreduce, MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibcast,
// MPI_Ibarrier) over MPI_COMM_WORLD. Loaded with dlopen only for a run under mpirun or with
// --dist mpi (Note [Backend module], loader.cpp), so nothing else links libmpi.so.
//
// Invariant: MPI is initialised with MPI_THREAD_FUNNELED from the communicator's progress thread,
// and only that thread calls into this file (backend_abi.h).
#include <mpi.h>

#include <cstdio>
#include <cstring>

#include "dist/backend_abi.h"

namespace {

void set_error(char* err, int err_len, const char* what, int code) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof text, "?");
  std::snprintf(err, static_cast<size_t>(err_len), "%s failed: %s (MPI error %d)", what, text,
                code);
}

MPI_Datatype mpi_type(int dtype) {
  switch (dtype) {
    case MW_DIST_F32: return MPI_FLOAT;
    case MW_DIST_F64: return MPI_DOUBLE;
    case MW_DIST_I32: return MPI_INT32_T;
    default: return MPI_INT64_T;
  }
}

int init(int* rank, int* size, char* err, int err_len) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) {
      set_error(err, err_len, "MPI_Init_thread", rc);
      return 1;
    }
  }
  // Errors come back as codes (and become memwall exceptions) instead of aborting the job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  MPI_Comm_size(MPI_COMM_WORLD, size);
  return 0;
}

// MPI counts are int: a larger collective is refused (the caller splits buckets far below this).
int start(int kind, const void* send, void* recv, int64_t count, int dtype, int root,
          void** request, char* err, int err_len) {
  if (count > 0x7fffffff) {
    std::snprintf(err, static_cast<size_t>(err_len),
                  "a collective of %lld elements exceeds MPI's int count; use smaller buckets",
                  static_cast<long long>(count));
    return 1;
  }
  const int n = static_cast<int>(count);
  const MPI_Datatype t = mpi_type(dtype);
  auto* req = new MPI_Request(MPI_REQUEST_NULL);
  int rc = MPI_SUCCESS;
  const char* what = "?";
  switch (kind) {
    case MW_DIST_ALL_REDUCE:
      what = "MPI_Iallreduce";
      rc = MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, n, t, MPI_SUM, MPI_COMM_WORLD,
                          req);
      break;
    case MW_DIST_REDUCE_SCATTER:
      what = "MPI_Ireduce_scatter_block";
      rc = MPI_Ireduce_scatter_block(send == recv ? MPI_IN_PLACE : send, recv, n, t, MPI_SUM,
                                     MPI_COMM_WORLD, req);
      break;
    case MW_DIST_ALL_GATHER:
      what = "MPI_Iallgather";
      rc = MPI_Iallgather(send, n, t, recv, n, t, MPI_COMM_WORLD, req);
      break;
    case MW_DIST_BROADCAST:
      what = "MPI_Ibcast";
      rc = MPI_Ibcast(recv, n, t, root, MPI_COMM_WORLD, req);
      break;
    default: what = "MPI_Ibarrier"; rc = MPI_Ibarrier(MPI_COMM_WORLD, req);
  }
  if (rc != MPI_SUCCESS) {
    delete req;
    set_error(err, err_len, what, rc);
    return 1;
  }
  *request = req;
  return 0;
}

int test(void* request, char* err, int err_len) {
  auto* req = static_cast<MPI_Request*>(request);
  int done = 0;
  const int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) {
    set_error(err, err_len, "MPI_Test", rc);
    return -1;
  }
  if (done) delete req;
  return done ? 1 : 0;
}

void finalize() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void host_name(char* out, int out_len) {
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::snprintf(out, static_cast<size_t>(out_len), "%s", name);
}

const mw_dist_backend_v1 kBackend = {"mpi", init, start, test, finalize, host_name};

}  // namespace

extern "C" __attribute__((visibility("default"))) const mw_dist_backend_v1*
mw_dist_backend_v1_entry() {
  return &kBackend;
}
