// The narrow C interface between memwall and a communication backend loaded at run time (the MPI
// module, src/dist/mpi/, and the NCCL module, src/dist/nccl/): raw buffers, element counts and
// five collectives, each started non-blocking and then polled. No memwall type crosses it, so a
// module links its libraries and nothing of memwall, and a single-process run never loads
// libmpi.so or libnccl.so (Note [Backend module]).
//
// Two versions: v1 (the functions) for buffers in host memory; v2 (v1 and three more fields) for a
// module whose buffers live on a CUDA device and that can abort. A module exports v1's entry, and
// v2's when it needs more; memwall reads a v1-only module as host memory, no device, no abort.
//
// Invariant: every function of a backend is called from one thread only, the communicator's
// progress thread (async_communicator.cpp), which also calls init first and finalize (or abort)
// last.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum mw_dist_dtype { MW_DIST_F32 = 0, MW_DIST_F64 = 1, MW_DIST_I32 = 2, MW_DIST_I64 = 3 };

enum mw_dist_op_kind {
  MW_DIST_ALL_REDUCE = 0,      // sum of `count` elements, send -> recv (recv may equal send)
  MW_DIST_REDUCE_SCATTER = 1,  // send: size * count elements, recv: count (the sum's rank-th
                               // piece); recv == send: in place, the piece lands at the front
  MW_DIST_ALL_GATHER = 2,      // send: count elements, recv: size * count (rank r's at r * count)
  MW_DIST_BROADCAST = 3,       // `count` elements of recv from rank `root` to all
  MW_DIST_BARRIER = 4
};

struct mw_dist_backend_v1 {
  const char* name;  // "mpi", "nccl"
  // Starts the library. Returns 0, or nonzero with a message in err (err_len bytes).
  int (*init)(int* rank, int* size, char* err, int err_len);
  // Starts one collective; *request is the handle to poll. Returns 0 or an error as init.
  int (*start)(int kind, const void* send, void* recv, int64_t count, int dtype, int root,
               void** request, char* err, int err_len);
  // 1 when the request has completed (it is then freed), 0 when still running, < 0 on error.
  int (*test)(void* request, char* err, int err_len);
  // Orderly shutdown when every collective completed; never called after a failure.
  void (*finalize)(void);
  // The host name, for messages.
  void (*host_name)(char* out, int out_len);
};

// Every backend module exports this symbol (dlsym'd by name).
typedef const struct mw_dist_backend_v1* (*mw_dist_backend_entry)(void);
#define MW_DIST_BACKEND_ENTRY "mw_dist_backend_v1_entry"

// Where start's send and recv point.
enum mw_dist_memory { MW_DIST_MEMORY_HOST = 0, MW_DIST_MEMORY_CUDA = 1 };

struct mw_dist_backend_v2 {
  struct mw_dist_backend_v1 v1;  // the collectives, as above ("nccl")
  int memory;                    // mw_dist_memory
  // The CUDA device index whose memory the buffers are in, chosen by init; -1 for host memory.
  // Called after init succeeded.
  int (*device)(void);
  // Optional (NULL: none). Instead of finalize after a failure, a timeout or abandon(): releases
  // the library without waiting for the other ranks (NCCL: ncclCommAbort, no MPI_Finalize).
  void (*abort)(void);
};

// Exported, besides MW_DIST_BACKEND_ENTRY, by a module that fills v2.
typedef const struct mw_dist_backend_v2* (*mw_dist_backend_v2_entry_fn)(void);
#define MW_DIST_BACKEND_V2_ENTRY "mw_dist_backend_v2_entry"

#ifdef __cplusplus
}
#endif
