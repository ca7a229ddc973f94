// Training checkpoints: DIR/step_NNNNNN folders that a run can resume from bit for bit.
//
// Note [Checkpoint layout]: a checkpoint is one folder
//   step_000120/model/            the HF folder (config.json, model.safetensors, ...; hf_io.h)
//   step_000120/optimizer.bin     HybridAdam::save_state (streamed from disk when offloaded)
//   step_000120/trainer.json      TrainState: step, data position, RNG, schedule, scaler, shape
//   step_000120/manifest.json     every other file's size and checksum, written last
// written as a StagedDirectory (data/atomic_save.h, Note [Atomic folder save]): into
// ".step_000120.tmp-PID", every file fsynced, then renamed. So a folder named step_* is always
// whole, and kill -9 at any moment leaves the earlier ones as they were. Loading checks every file
// against the manifest first: a truncated or corrupt file is a FormatError naming the checkpoint,
// the file and the checksum found and expected.
//
// Note [Exact resume]: weights and Adam states are stored exactly (F32), the step count is the
// optimizer's, the data position is a micro-batch index (Note [Data position]), the dropout
// generator's (seed, offset) is restored (Note [Counter-based dropout]), and the LR is a function
// of the step (Note [LR schedule]). A run stopped after step k and resumed with the same options
// therefore repeats exactly the updates k+1..n of an uninterrupted run. Options that change those
// updates (batch, seq, grad-accum, schedule, clipping, data order) must match the checkpoint's;
// resume refuses a mismatch, naming the option.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/random.h"
#include "data/json.h"
#include "optim/loss_scaler.h"

namespace mw::train {

// The lowest validation loss so far (infinite before the first evaluation), its step, and the
// evaluations since that did not improve on it.
struct BestValidation {
  double loss = std::numeric_limits<double>::infinity();
  int64_t step = -1;
  int64_t evals_since = 0;
};

// Everything besides weights and optimizer states that exact resume needs.
struct TrainState {
  int64_t step = 0;         // optimizer updates done
  int64_t micro_batch = 0;  // index of the next training micro-batch (Note [Data position])
  RngState dropout_rng;     // default_generator() after the last update
  // fp16's loss scaler (Note [Dynamic loss scaling]); the defaults when there is none.
  optim::LossScalerState scaler;
  // The options that determine the updates (resume checks them): one JSON object.
  json::Value run = json::Value::object();
  // optimizer.bin's layout (Note [Optimizer layouts], optim/adam_state_file.h): {"file_numels",
  // "param", "offset"}; null in checkpoints written before it was recorded (the model's order).
  json::Value optimizer_layout;
  // --save-best and --early-stop (Note [Best model and early stopping], best_model.cpp).
  BestValidation best;
  int64_t last_eval_step = -1;  // the step of the run's last evaluation; -1: none (or older)
};

json::Value to_json(const TrainState& s);
TrainState train_state_from_json(const json::Value& v, const std::string& source);

// "step_000120".
std::string checkpoint_name(int64_t step);

// Writes dir/step_NNNNNN (Note [Checkpoint layout]). save_model(path) writes the HF folder at
// `path`; save_optimizer(path) writes the optimizer file at `path`. Returns the final path.
std::string write_checkpoint(const std::string& dir, const TrainState& state,
                             const std::function<void(const std::string&)>& save_model,
                             const std::function<void(const std::string&)>& save_optimizer);

// The step_* folders in dir, oldest first (temporary ".step_*" folders are not listed).
std::vector<std::string> list_checkpoints(const std::string& dir);
// Removes all but the newest `keep` checkpoints (keep <= 0: none removed). Returns how many.
int prune_checkpoints(const std::string& dir, int64_t keep);
// The temporary folders of saves in `dir` whose process is gone (".step_N.tmp-PID", and
// ".step_N.old-PID" put back where the save was killed between its renames), of every step: a save
// removed only its own step's, so a save killed mid-write (mpirun killing rank 0 after another
// rank's failure) left a checkpoint's bytes until that step was written again. Returns how many.
int remove_stale_checkpoint_temporaries(const std::string& dir);
// The newest checkpoint in `dir`, or `dir` itself when it is a checkpoint folder (it holds
// manifest.json). IoError when there is none, saying what was looked for.
std::string find_checkpoint(const std::string& dir);
// The step of a checkpoint folder's path (".../step_000120": 120), -1 for any other name; and
// whether `path` is such a folder holding its manifest.
int64_t checkpoint_step(const std::string& path);
bool is_checkpoint_folder(const std::string& path);
// InvalidArgument when `dir` holds checkpoints past step `from`, where this run (resumed there, or
// starting) would write its own (Note [One run per checkpoint folder]).
void check_checkpoint_dir_is_this_runs(const std::string& dir, int64_t from, bool resumed);
// Checks every file of the checkpoint against its manifest (FormatError naming the checkpoint and
// the file) and reads trainer.json.
TrainState verify_checkpoint(const std::string& path);

// The checksum of the manifest: 64-bit FNV-1a over the file's 8-byte little-endian words (then its
// tail bytes), as 16 hex digits. Detects truncation and corruption, not tampering.
std::string file_checksum(const std::string& path);

}  // namespace mw::train
