// Room on disk for what a training run saves, checked with the memory plan before the first step.
//
// Note [Room for the saves]: a full disk is refused up front, not at hour ten's checkpoint. The
// bytes each save adds, from the model's shape alone:
//   model folder (--save, a checkpoint's model/)     4 P + 256 per tensor + 16 KiB + tokenizer
//     (--save-best: two, each new best written beside the last; one once a best is there)
//   optimizer file (--save-optimizer, optimizer.bin) 8 P + 256 per tensor
//   checkpoint                                       the two above + 16 KiB (trainer.json, ...)
// (P parameters in f32; the tokenizer's files, which a save copies, by their sizes, or 4 MiB
// where they cannot be told before the run: GPT-2's are 2.8 MiB.)
// --checkpoint-dir gets the checkpoints the run will write (every --checkpoint-every steps from
// where it starts, and the last), with --keep K at most max(1, K + 1 - E) beyond the E already
// there, as each new one is written before the oldest is pruned. A --save or checkpoint folder is
// written beside the one it replaces, so its whole size is needed even over an earlier save. The
// needs are summed per file system (the NVMe files of --offload nvme or Gemini's third tier on
// it too) and compared with its free bytes (statvfs). Rank 0 alone writes, so it alone checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/trainer.h"

namespace mw::train {

struct SaveNeed {
  std::string what;  // "--save 'm' (the model)"
  std::string path;  // where it is written
  int64_t bytes = 0;
};

// The bytes of an HF folder of this model (bytes_per_weight: 4 in f32, 2 in bf16 or fp16).
int64_t saved_model_bytes(const gpt2::Config& config, int64_t bytes_per_weight = 4);
int64_t saved_optimizer_bytes(const gpt2::Config& config);
// Checkpoints written for steps (first, total] every `every` steps (0: only the last), the last
// step's included.
int64_t checkpoints_to_write(int64_t first, int64_t total, int64_t every);

// The saves of this run (none under --eval-only or on ranks other than 0).
std::vector<SaveNeed> save_needs(const TrainOptions& o, const gpt2::Config& config);
// "  saves: ..." for the plan; "" without saves.
std::string save_needs_text(const std::vector<SaveNeed>& needs);
// OutOfMemory naming the file system, what goes there, and what would make it fit, when the saves
// (plus `nvme_bytes` of NVMe files at `nvme_path`, when on the same file system) exceed its free
// bytes.
void check_save_room(const std::vector<SaveNeed>& needs, const std::string& nvme_path,
                     int64_t nvme_bytes);

}  // namespace mw::train
