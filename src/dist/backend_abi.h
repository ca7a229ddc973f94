// The narrow C interface between memwall and a communication backend loaded at run time (the MPI
// module, src/dist/mpi/): raw host buffers, element counts and five collectives, each started
// non-blocking and then polled. No memwall type crosses it, so the module links MPI and nothing
// of memwall, and a single-process run never loads libmpi.so (Note [Backend module]).
//
// Invariant: every function of a backend is called from one thread only, the communicator's
// progress thread (async_communicator.cpp), which also calls init first and finalize last.
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
  const char* name;  // "mpi"
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

#ifdef __cplusplus
}
#endif
