// gpt2_train's data-parallel options (apps/gpt2_train.cpp): the communicator, its timeout, the ZeRO
// stage and the gradient buckets; declared on the parser and parsed into the TrainOptions. A
// header of that one app, kept apart by concern.
#pragma once

#include <string>
#include <vector>

#include "cli.h"
#include "dist/communicator.h"
#include "train/trainer.h"

namespace mw {

inline void declare_dist(cli::Parser& p) {
  p.option("dist", "auto",
           "auto|local|mpi|nccl: the communicator; auto = under mpirun NCCL for --device cuda "
           "and MPI otherwise, else this process alone (docs/distributed.md)");
  p.option("dist-timeout", "300",
           "seconds a collective may wait for the other ranks before the run stops with an error");
  p.option("zero", "0",
           "0|1|2|3: with several ranks, shard the optimizer states (1), the gradients too (2) "
           "and the parameters too (3, gathered around each use) across them (ZeRO; Gemini: 2, 3)");
  p.option("bucket-mb", "25", "gradient bucket size for the collectives, MiB");
  p.option("shard-param-frac", "", "--gemini --zero 2|3: share of chunks with sharded parameters");
}

// --dist, --dist-timeout, --zero, --bucket-mb (docs/distributed.md). The communicator itself is
// made by main(), which must be able to abandon it on an error (Note [Collective timeouts]).
inline dist::CommOptions parse_dist(const cli::Parser& p, train::TrainOptions& o) {
  dist::CommOptions c;
  c.backend = p.choice("dist", {"auto", "local", "mpi", "nccl"});
  // Note [Buckets on CUDA] (train/data_parallel.cpp): CUDA tensors go over NCCL, host ones MPI.
  if (c.backend == "auto" && o.device.is_cuda() && dist::launcher_world_size() > 1)
    c.backend = "nccl";
  MW_CHECK_T(cli::UsageError, c.backend != "nccl" || o.device.is_cuda(), "--dist nccl takes ",
             "CUDA tensors, but --device is ", o.device.str(),
             ": pass --device cuda, or --dist mpi (or leave --dist out) for cpu and sim");
  MW_CHECK_T(cli::UsageError, c.backend != "mpi" || !o.device.is_cuda(),
             "--dist mpi takes host tensors (cpu, sim), but --device is ", o.device.str(),
             ": pass --dist nccl (or leave --dist out) to train on CUDA devices");
  c.timeout_ms = 1000.0 * p.real("dist-timeout", 0.001, 1e7);
  o.zero_stage = static_cast<int>(p.integer("zero", 0, 3));
  if (p.given("shard-param-frac")) o.shard_param_frac = p.real("shard-param-frac", 0, 1);
  MW_CHECK_T(cli::UsageError, o.shard_param_frac < 0 || (!o.gemini.empty() && o.zero_stage >= 2),
             "--shard-param-frac shards Gemini's chunk parameters across ranks (default 1 at "
             "--zero 3, 0 at --zero 2): pass --gemini POLICY and --zero 2 or 3 with it");
  o.bucket_bytes = static_cast<int64_t>(p.real("bucket-mb", 0.001, 65536) * (1 << 20));
  // --dist local under mpirun -np N: N runs alone, each writing the same outputs at once.
  const int launched = dist::launcher_world_size();
  MW_CHECK_T(cli::UsageError,
             c.backend != "local" || launched < 2 ||
                 (o.save + o.save_best + o.checkpoint_dir + o.log + o.save_optimizer + o.trace +
                  o.nvme_timeline)
                     .empty(),
             "--dist local under a launcher of ", launched,
             " processes: each would train alone "
             "and write the same outputs; leave --dist out (or pass --dist mpi) to train data "
             "parallel, or launch one process");
  return c;
}

// Warnings for the data-parallel options of a run of one process (without mpirun): --zero then
// shards across that one rank, and --bucket-mb and --dist-timeout have nothing to act on.
inline std::vector<std::string> one_process_dist_warnings(const cli::Parser& p,
                                                          const train::TrainOptions& o) {
  std::vector<std::string> w;
  if (o.comm && o.comm->size() > 1) return w;
  if (o.zero_stage > 0)
    w.push_back(str("--zero ", o.zero_stage, " in one process shards across that one rank, which ",
                    "saves no memory; launch under mpirun -np N to shard across N ranks"));
  else if (!o.comm || !o.comm->required_memory())  // one NCCL rank: its collectives are real
    for (const char* name : {"bucket-mb", "dist-timeout"})
      if (p.given(name))
        w.push_back(str("--", name, " has no effect in one process (no collectives); launch under ",
                        "mpirun -np N for data parallel"));
  return w;
}

}  // namespace mw
