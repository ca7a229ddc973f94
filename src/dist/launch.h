// What this process's environment says about how it was launched (Note [Launchers]). Read by the
// communicator's loader (loader.cpp: which backend, the launcher's world size and local rank),
// gpt2_train (plain --device cuda is this rank's GPU; the memory plan's ranks on one host) and the
// NCCL module (its device before MPI_Init_thread), so that all of them read the same variables.
// Header-only and standard C++ alone: the backend modules link nothing of memwall.
//
// Note [Launchers]: each launcher says it in its own variables, and a PMI wire-up without a
// launcher's own variables is how Slurm's srun starts MPI programs:
//
//   launcher              "launched"            world size            local rank, local size
//   Open MPI mpirun       OMPI_COMM_WORLD_SIZE  OMPI_COMM_WORLD_SIZE  OMPI_COMM_WORLD_LOCAL_RANK,
//                                                                     OMPI_COMM_WORLD_LOCAL_SIZE
//   MPICH, Intel MPI      PMI_SIZE              PMI_SIZE              MPI_LOCALRANKID,
//   (hydra)                                                           MPI_LOCALNRANKS
//   MVAPICH2              MV2_COMM_WORLD_SIZE   MV2_COMM_WORLD_SIZE   MV2_COMM_WORLD_LOCAL_RANK,
//                                                                     MV2_COMM_WORLD_LOCAL_SIZE
//   srun --mpi=pmix       PMIX_RANK             SLURM_STEP_NUM_TASKS  SLURM_LOCALID,
//                                                                     SLURM_STEP_TASKS_PER_NODE
//   srun --mpi=pmi2       PMI_SIZE              PMI_SIZE              SLURM_LOCALID,
//                                                                     SLURM_STEP_TASKS_PER_NODE
//
// A launcher's own variables come first; Slurm's are read only after them, and only in a step
// (SLURM_STEP_ID) of an MPI wire-up: an mpirun inside an allocation starts its daemons with srun,
// and its ranks inherit the daemons' Slurm variables, which then describe the daemons. A step's
// tasks per node, "4(x2)" or "2(x3),1", give one local size only when every node runs as many.
// A Slurm step of several tasks without any wire-up variable (srun --mpi=none) would start that
// many single-process runs, each training alone and writing the same outputs: slurm_step_tasks
// lets the loader refuse it (make_communicator).
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace mw::dist {

struct Launch {
  const char* variable = nullptr;  // the variable that names an MPI launcher; null: none did
  int world_size = 0;              // processes it started; 0: not said
  int local_rank = -1;             // this one's place among them on its host; -1: not said
  int local_size = 0;              // how many of them run on its host; 0: not said
  int slurm_step_tasks = 0;        // tasks of the srun step this process is one of; 0: none
  int slurm_task = -1;             // its SLURM_PROCID there
};

namespace launch_detail {

// A non-negative decimal integer, nothing else; -1 for anything else (absent, empty, "4(x2)").
inline int whole(const char* v) {
  if (v == nullptr || *v == '\0' || std::strlen(v) > 9) return -1;
  int n = 0;
  for (const char* c = v; *c; ++c) {
    if (*c < '0' || *c > '9') return -1;
    n = n * 10 + (*c - '0');
  }
  return n;
}

// SLURM_STEP_TASKS_PER_NODE: "N" or "N(xK)" is N on every node; a list of several counts is no
// single answer (0).
inline int same_on_every_node(const char* v) {
  if (v == nullptr) return 0;
  const char* paren = std::strchr(v, '(');
  if (paren == nullptr) return std::max(0, whole(v));
  if (std::strchr(v, ',') != nullptr || paren[1] != 'x') return 0;
  char head[16] = {};
  const size_t n = static_cast<size_t>(paren - v);
  if (n == 0 || n >= sizeof head) return 0;
  std::memcpy(head, v, n);
  return std::max(0, whole(head));
}

}  // namespace launch_detail

// `get` looks a variable up (std::getenv; a table in the tests).
template <typename Get>
Launch read_launch(Get&& get) {
  using launch_detail::whole;
  Launch l;
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE"})
    if (get(name) != nullptr) {
      l.variable = name;
      break;
    }
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"})
    if (whole(get(name)) >= 0) {
      l.world_size = whole(get(name));
      break;
    }
  for (const char* name :
       {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK"})
    if (whole(get(name)) >= 0) {
      l.local_rank = whole(get(name));
      break;
    }
  for (const char* name :
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE"})
    if (whole(get(name)) >= 1) {
      l.local_size = whole(get(name));
      break;
    }
  if (get("SLURM_STEP_ID") == nullptr) return l;
  l.slurm_step_tasks = std::max(0, whole(get("SLURM_STEP_NUM_TASKS")));
  l.slurm_task = whole(get("SLURM_PROCID"));
  if (l.variable == nullptr) return l;  // srun without a wire-up: the loader refuses several
  const bool own_variables = l.local_rank >= 0;  // a launcher inside the step set its own
  if (own_variables) return l;
  if (l.world_size == 0) l.world_size = l.slurm_step_tasks;
  l.local_rank = whole(get("SLURM_LOCALID"));
  if (l.local_size == 0)
    l.local_size = launch_detail::same_on_every_node(get("SLURM_STEP_TASKS_PER_NODE"));
  return l;
}

inline Launch launch_from_environment() {
  return read_launch([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
}

}  // namespace mw::dist
