// The checks on a training run's output paths, made before anything is loaded or written.
//
// Note [Outputs apart]: every output of gpt2_train is checked before the run starts
// (data::check_output_path: the folder or file can be written), and so is where they lie:
//  - no two outputs name the same path (--log, --save-optimizer, --nvme-timeline, --trace, --save,
//    --checkpoint-dir, --nvme-dir): the later write would replace the earlier;
//  - none lies inside --save, a folder the save replaces as a whole: `--save run --log run/log`
//    trained to the end and then could not save (the folder held the log);
//  - no file output names an input (a --data or --val-data shard, --config, --vocab, --merges,
//    --tokenizer, --load-optimizer, a file of the --init-from model): `--log` on the training
//    shard truncated the user's data before the first step, `--save-optimizer` on a validation
//    shard replaced it. --save-optimizer may name --load-optimizer's file (it is replaced whole,
//    after training);
//  - none lies inside a checkpoint folder (step_* with a manifest.json): `--init-from
//    ck/step_000001/model --save ck/step_000001/model` replaced the checkpoint's model, which then
//    failed its manifest's checksum on --resume.
// Paths are compared as absolute paths with their existing part's symbolic links, "." and ".."
// resolved; hard links are not followed.
#pragma once

#include <string>

#include "train/trainer.h"

namespace mw::train {

// InvalidArgument or IoError naming the options, the paths and what to pass instead.
void check_run_paths(const TrainOptions& o);

// Whether two paths name the same file or folder, and whether `path` lies strictly inside folder
// `dir` (Note [Outputs apart]).
bool same_path(const std::string& a, const std::string& b);
bool lies_inside(const std::string& path, const std::string& dir);

}  // namespace mw::train
