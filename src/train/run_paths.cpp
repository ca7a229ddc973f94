// The checks on a training run's output paths (run_paths.h, Note [Outputs apart]).
#include "train/run_paths.h"

#include <algorithm>
#include <filesystem>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/atomic_save.h"
#include "models/gpt2/hf_io.h"
#include "train/checkpoint.h"
#include "train/token_stream.h"

namespace mw::train {
namespace {

namespace fs = std::filesystem;

// `path` absolute, with the symbolic links, "." and ".." of its existing part resolved and no
// trailing separator.
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) p = fs::absolute(path, ec).lexically_normal();
  while (!p.has_filename() && p.has_relative_path()) p = p.parent_path();
  return p;
}

using Named = std::pair<std::string, std::string>;  // option, path

// The files this run reads that a file output could overwrite.
std::vector<Named> input_files(const TrainOptions& o) {
  std::vector<Named> in;
  for (const auto& [option, spec, split] :
       {std::tuple{"--data", o.data, "train"}, std::tuple{"--val-data", o.val_data, "val"}}) {
    if (spec.empty()) continue;
    try {
      for (const std::string& shard : resolve_shards(spec, split, option))
        in.emplace_back(option, shard);
    } catch (const Error&) {  // reported where the run opens them
    }
  }
  for (const auto& [option, path] :
       {Named{"--config", o.config_path}, Named{"--vocab", o.vocab}, Named{"--merges", o.merges},
        Named{"--tokenizer", o.tokenizer}, Named{"--load-optimizer", o.load_optimizer}})
    if (!path.empty()) in.emplace_back(option, path);
  return in;
}

void check_file_output(const Named& out, const std::vector<Named>& inputs, const TrainOptions& o) {
  const auto& [option, path] = out;
  for (const auto& [in_option, in_path] : inputs) {
    if (option == "--save-optimizer" && in_option == "--load-optimizer") continue;
    MW_CHECK_T(InvalidArgument, !same_path(path, in_path), option, " '", path,
               "' is an input of this run (", in_option, " '", in_path,
               "'): writing it would destroy it; pass ", option, " another path");
  }
  const std::string name = fs::path(path).filename().string();
  MW_CHECK_T(
      InvalidArgument,
      o.init_from.empty() || !lies_inside(path, o.init_from) || !gpt2::is_saved_model_entry(name),
      option, " '", path, "' is a file of the --init-from model '", o.init_from,
      "': writing it would destroy it; pass ", option, " another path");
}

// The checkpoint folder (a step_* folder holding manifest.json) that `path` lies in, or "".
std::string enclosing_checkpoint(const std::string& path) {
  for (fs::path a = resolved(path); a.has_relative_path(); a = a.parent_path())
    if (is_checkpoint_folder(a.string())) return a.string();
  return "";
}

}  // namespace

bool same_path(const std::string& a, const std::string& b) { return resolved(a) == resolved(b); }

bool lies_inside(const std::string& path, const std::string& dir) {
  const fs::path p = resolved(path), d = resolved(dir);
  auto [d_end, p_at] = std::mismatch(d.begin(), d.end(), p.begin(), p.end());
  return d_end == d.end() && p_at != p.end();
}

void check_run_paths(const TrainOptions& o) {
  // Each can be written: --save replaces its folder as a whole, so only one that holds a saved
  // model's files alone (Note [Replacing only what a save wrote]); --checkpoint-dir holds
  // step_NNNNNN folders.
  for (const auto& [option, dir] : {Named{"--save", o.save}, Named{"--save-best", o.save_best}})
    if (!dir.empty())
      data::check_output_path(dir, option, /*as_directory=*/true, gpt2::is_saved_model_entry);
  if (!o.checkpoint_dir.empty())
    data::check_output_path(o.checkpoint_dir, "--checkpoint-dir", /*as_directory=*/true);
  const std::vector<Named> files = {{"--log", o.log},
                                    {"--save-optimizer", o.save_optimizer},
                                    {"--nvme-timeline", o.nvme_timeline},
                                    {"--trace", o.trace}};
  for (const auto& [option, path] : files)
    if (!path.empty()) data::check_output_path(path, option, /*as_directory=*/false);
  // The optimizer's file is written beside its path and renamed over it (atomically): a FIFO or a
  // device there would be replaced by a regular file (as root, --save-optimizer /dev/null replaced
  // the system's /dev/null), or, without the right to create files beside it, the run failed at
  // its end. The logs and traces are written in place, so /dev/stdout and FIFOs suit them.
  std::error_code ec;
  if (!o.save_optimizer.empty() && fs::exists(o.save_optimizer, ec) &&
      !fs::is_regular_file(o.save_optimizer, ec))
    throw IoError(str("--save-optimizer '", o.save_optimizer,
                      "' is not a regular file (a device, a FIFO or a socket): the optimizer's ",
                      "file is written beside it and renamed over it, which would replace it; ",
                      "pass a regular file path"));

  // Where they lie (Note [Outputs apart]).
  std::vector<Named> outputs;
  const std::vector<Named> inputs = input_files(o);
  for (const Named& f : files)
    if (!f.second.empty()) outputs.push_back(f), check_file_output(f, inputs, o);
  for (const Named& d :
       {Named{"--save", o.save}, Named{"--save-best", o.save_best},
        Named{"--checkpoint-dir", o.checkpoint_dir}, Named{"--nvme-dir", o.nvme.dir}})
    if (!d.second.empty()) outputs.push_back(d);
  for (size_t i = 0; i < outputs.size(); ++i)
    for (size_t j = i + 1; j < outputs.size(); ++j)
      MW_CHECK_T(InvalidArgument, !same_path(outputs[i].second, outputs[j].second),
                 outputs[i].first, " and ", outputs[j].first, " both name '", outputs[j].second,
                 "'; give each output its own path");
  // A checkpoint is written whole and checked against its manifest: --save into its model/
  // (a fine-tune "in place" of a checkpoint's model) made the checkpoint fail to resume.
  for (const auto& [option, path] : outputs) {
    const std::string checkpoint = enclosing_checkpoint(path);
    MW_CHECK_T(InvalidArgument, checkpoint.empty(), option, " '", path,
               "' lies inside the checkpoint '", checkpoint,
               "', which is written whole and checked against its manifest: writing there would "
               "break it for --resume; pass ",
               option, " another path");
  }
  for (const auto& [saved, dir] : {Named{"--save", o.save}, Named{"--save-best", o.save_best}}) {
    if (dir.empty()) continue;
    for (const auto& [option, path] : outputs)
      MW_CHECK_T(InvalidArgument, !lies_inside(path, dir), option, " '", path, "' lies inside ",
                 saved, " '", dir,
                 "', a folder the save replaces as a whole (deleting what else it ",
                 "holds); pass ", saved, " a folder of its own, e.g. '",
                 (fs::path(dir) / "model").string(), "'");
  }
}

}  // namespace mw::train
