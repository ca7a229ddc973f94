// ZeRO checkpoints: the one-process optimizer file written from the ranks' shards of the Adam
// states, and read back into them (docs/distributed.md).
//
// Note [ZeRO checkpoints]: under --zero 1|2, rank r's optimizer steps pieces of the parameters
// (DataParallel::pieces) and holds only their m, v and step counts, in memory or on NVMe. Its
// optimizer.bin (a checkpoint's, or --save-optimizer) is nevertheless the file that one process
// with the same options writes (Note [Optimizer checkpoint format]): the model's parameters, the
// same segments (one per stepped parameter; one per NVMe slice for the parameters one process
// would offload), the same bytes up to the values themselves. So it resumes at any rank count, at
// any stage, and in one process without --zero. Saving is collective (every rank calls it):
//  1. every rank knows every rank's pieces: the buckets are the same everywhere;
//  2. each rank tells, for each segment of the file, the lowest and highest step count of the
//     elements it owns (one all_gather of 2 int64 per segment); the ranks agree on each segment's
//     step or all throw the same error (a partially applied step is not one segment);
//  3. rank 0 writes the header, then the data in file order: each run of m (then of v) elements is
//     broadcast by the rank that owns it, in chunks of at most kChunkNumel, two in flight, and
//     rank 0 appends it (a run rank 0 owns is not sent). The file is written atomically (a
//     temporary sibling renamed into place), and inside a checkpoint's staged folder.
// Memory beyond the states, per rank: at most three chunk buffers (3 x 4 MiB: two in flight, one
// being filled) and, with NVMe, two slices' m and v (2 x 4 MiB by default); rank 0 adds the
// writer's 1 MiB buffer. No rank holds the whole
// model's states; one process saving holds no more than that either (its states are resident or
// streamed one slice at a time). Wire: each element of m and v goes from its owner to every other
// rank (a broadcast: the communicator has no point-to-point send), 8 Psi (N-1)/N bytes per rank.
// Loading needs no collective: each rank reads the header and pread()s its pieces' ranges only
// (Note [Sharded state files], optim/adam_state_file.h).
#pragma once

#include <string>
#include <vector>

#include "optim/hybrid_adam.h"
#include "optim/nvme_states.h"
#include "optim/optimizer.h"
#include "train/data_parallel.h"

namespace mw::train {

// What one process with the same options writes: per model parameter, 0 for one segment (its
// states in memory), else the NVMe slice size of its segments.
struct OneProcessLayout {
  std::vector<int64_t> numels;
  std::vector<int64_t> slice_numel;
};

// The layout of HybridAdam (hybrid) or AdamW over `params` with these NVMe options (HybridAdam's
// choice of offloaded parameters, select_nvme_offloaded).
OneProcessLayout one_process_layout(const std::vector<Tensor>& params,
                                    const optim::NvmeOffloadOptions& nvme, bool hybrid);

// Who steps what: the file's parameters, and per rank its optimizer's parameters as pieces of
// them, in that optimizer's order. DataParallel's (stages 1-2: pieces of the model's parameters)
// or Gemini's (Note [Sharded optimizer states]: pieces of its chunks).
struct ShardLayout {
  std::vector<int64_t> numels;
  std::vector<std::vector<ShardPiece>> pieces;  // [rank]
};
ShardLayout shard_layout(const DataParallel& dp);

// A tensor of the file as a range of a parameter of the shard layout.
using FileTensor = optim::HybridAdam::SavedRange;

// Collective: every rank calls it with its optimizer (HybridAdam or AdamW over
// dp.optimizer_params(), or over the pieces of `shards`); rank 0 writes `path` (the other ranks
// ignore it). dp provides the communicator. The file's tensors are `shards`' parameters, or with
// `tensors`, ranges of them: file tensor t is elements [offset, offset + numel) of parameter
// tensors[t].param (Note [Saving in the model's layout], optim/hybrid_adam.h: Gemini's chunks
// saved as the model's parameters); `layout` describes the file's tensors.
void save_zero_state(DataParallel& dp, optim::Optimizer& opt, const OneProcessLayout& layout,
                     const std::string& path);
void save_zero_state(DataParallel& dp, const ShardLayout& shards, optim::Optimizer& opt,
                     const OneProcessLayout& layout, const std::string& path,
                     const std::vector<FileTensor>* tensors = nullptr);
// Each rank on its own: this rank's pieces' states from a one-process file (any rank count).
void load_zero_state(DataParallel& dp, optim::Optimizer& opt, const std::string& path);
void load_zero_state(const ShardLayout& shards, int rank, optim::Optimizer& opt,
                     const std::string& path);

}  // namespace mw::train
