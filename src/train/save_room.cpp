// Room on disk for a run's saves (save_room.h, Note [Room for the saves]).
#include "train/save_room.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "data/tokenizer_files.h"
#include "models/gpt2/spec.h"
#include "train/checkpoint.h"
#include "train/plan_bytes.h"

namespace mw::train {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kMiB = int64_t{1} << 20;

double tensor_count(const gpt2::Config& c) { return 12.0 * static_cast<double>(c.n_layer) + 4; }

// In double, from one block's count: num_parameters lists every tensor, and a config of 2^24
// layers (refused by the plan at once) took a minute and gigabytes.
double parameter_count(const gpt2::Config& c) {
  gpt2::Config one = c, two = c;
  one.n_layer = 1, two.n_layer = 2;
  const auto first = static_cast<double>(gpt2::num_parameters(one));
  const double block = static_cast<double>(gpt2::num_parameters(two)) - first;
  return first + static_cast<double>(c.n_layer - 1) * block;
}

// The nearest existing ancestor of `path` (itself when it exists): where its file system is told.
std::string existing_part(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec).lexically_normal();
  while (!fs::exists(p, ec) && p.has_relative_path()) p = p.parent_path();
  return p.string();
}

// The checkpoint a --resume starts from, "" when it cannot be told here (the trainer reports a
// missing or damaged one).
std::string resumed_checkpoint(const TrainOptions& o) {
  if (o.resume.empty()) return "";
  try {
    return find_checkpoint(o.resume);
  } catch (const Error&) {
    return "";
  }
}

// The tokenizer files a save copies beside the model (the options', or those of the folder the run
// starts from); 4 MiB, more than GPT-2's, when they cannot be told here.
int64_t tokenizer_bytes(const TrainOptions& o, const std::string& resumed) {
  try {
    const std::string from =
        !resumed.empty() ? (fs::path(resumed) / "model").string() : o.init_from;
    const data::TokenizerFiles f = data::find_tokenizer_files(o.vocab, o.merges, o.tokenizer, from);
    int64_t bytes = 0;
    std::vector<std::string> files = f.companions;
    for (const std::string& file : {f.vocab_json, f.merges_txt, f.tokenizer_json})
      if (!file.empty()) files.push_back(file);
    for (const std::string& file : files) bytes += static_cast<int64_t>(fs::file_size(file));
    return bytes;
  } catch (const std::exception&) {
    return 4 * kMiB;
  }
}

}  // namespace

int64_t saved_model_bytes(const gpt2::Config& config, int64_t bytes_per_weight) {
  return plan_bytes::clamp_bytes(static_cast<double>(bytes_per_weight) * parameter_count(config) +
                                 256 * tensor_count(config) + 16 * 1024);
}

int64_t saved_optimizer_bytes(const gpt2::Config& config) {
  return plan_bytes::clamp_bytes(8 * parameter_count(config) + 256 * tensor_count(config));
}

int64_t checkpoints_to_write(int64_t first, int64_t total, int64_t every) {
  if (total <= first) return 0;
  if (every <= 0) return 1;
  return total / every - first / every + (total % every != 0 ? 1 : 0);
}

std::vector<SaveNeed> save_needs(const TrainOptions& o, const gpt2::Config& config) {
  std::vector<SaveNeed> needs;
  if (o.eval_only || (o.comm && o.comm->rank() != 0)) return needs;
  const std::string resumed = resumed_checkpoint(o);
  const auto tokenizer = static_cast<double>(tokenizer_bytes(o, resumed));
  auto folder = [&](int64_t bytes_per_weight) {  // an HF folder: the weights and the tokenizer
    return plan_bytes::clamp_bytes(
        static_cast<double>(saved_model_bytes(config, bytes_per_weight)) + tokenizer);
  };
  // --save and --save-best in --save-dtype (Note [Saving in bf16 or fp16]); checkpoints in f32.
  const int64_t model = folder(4), final_model = folder(dtype_size(o.save_dtype));
  const int64_t optimizer = saved_optimizer_bytes(config);
  const double checkpoint = static_cast<double>(model) + static_cast<double>(optimizer) + 16 * 1024;
  if (!o.save.empty())
    needs.push_back({str("--save '", o.save, "' (the model)"), o.save, final_model});
  // Each new best is written beside the one it replaces: two models, once the first is there.
  if (!o.save_best.empty()) {
    std::error_code ec;
    const bool held = std::filesystem::exists(o.save_best + "/model.safetensors", ec);
    needs.push_back({str("--save-best '", o.save_best, "' (", held ? "a model" : "two models", ")"),
                     o.save_best, held ? final_model : 2 * final_model});
  }
  if (!o.save_optimizer.empty())
    needs.push_back(
        {str("--save-optimizer '", o.save_optimizer, "'"), o.save_optimizer, optimizer});
  if (!o.checkpoint_dir.empty()) {
    const int64_t first = std::max<int64_t>(0, checkpoint_step(resumed));
    // With --resume --steps is the run's total; after --load-optimizer the count is from 0.
    int64_t n = checkpoints_to_write(first, o.steps, o.checkpoint_every);
    std::string kept;
    if (o.keep > 0) {
      const auto existing = static_cast<int64_t>(list_checkpoints(o.checkpoint_dir).size());
      n = std::min(n, std::max<int64_t>(1, o.keep + 1 - existing));
      kept = str(", --keep ", o.keep, " with ", existing, " there");
    }
    if (n > 0)
      needs.push_back(
          {str("--checkpoint-dir '", o.checkpoint_dir, "' (", n, " checkpoint", n > 1 ? "s" : "",
               " of ", plan_bytes::mib_text(plan_bytes::clamp_bytes(checkpoint)), kept, ")"),
           o.checkpoint_dir, plan_bytes::clamp_bytes(static_cast<double>(n) * checkpoint)});
  }
  return needs;
}

std::string save_needs_text(const std::vector<SaveNeed>& needs) {
  if (needs.empty()) return "";
  std::string text = "  saves:";
  for (size_t i = 0; i < needs.size(); ++i)
    text += str(i ? ";" : "", " ", needs[i].what, " ", plan_bytes::mib_text(needs[i].bytes));
  return text + "\n";
}

void check_save_room(const std::vector<SaveNeed>& needs, const std::string& nvme_path,
                     int64_t nvme_bytes) {
  struct Disk {
    std::string at, names;
    int64_t need = 0;
  };
  std::map<dev_t, Disk> disks;  // by file system
  auto add = [&](const std::string& path, const std::string& what, int64_t bytes) {
    const std::string at = existing_part(path);
    struct stat st {};
    if (bytes <= 0 || ::stat(at.c_str(), &st) != 0) return;  // unknown: not checked
    Disk& d = disks[st.st_dev];
    if (d.at.empty()) d.at = at;
    d.names += str(d.names.empty() ? "" : ", ", what, " ", plan_bytes::mib_text(bytes));
    d.need += bytes;
  };
  for (const SaveNeed& n : needs) add(n.path, n.what, n.bytes);
  if (needs.empty()) return;
  if (nvme_bytes > 0) {  // the NVMe files share the disk only where it is one of the saves'
    const std::string at = existing_part(nvme_path);
    struct stat st {};
    if (::stat(at.c_str(), &st) == 0 && disks.count(st.st_dev))
      add(nvme_path, "the NVMe files", nvme_bytes);
  }
  for (const auto& [dev, d] : disks) {
    struct statvfs s {};
    if (::statvfs(d.at.c_str(), &s) != 0) continue;
    const int64_t free = static_cast<int64_t>(s.f_bavail) * static_cast<int64_t>(s.f_frsize);
    if (d.need <= free) continue;
    throw OutOfMemory(
        str("the run's saves do not fit, stopped before the first step: the disk at '", d.at,
            "' needs ", plan_bytes::mib_text(d.need), " (", d.names, "), ",
            plan_bytes::mib_text(free),
            " free; to fit: --keep K or a larger --checkpoint-every, outputs on a larger disk, or "
            "room made there (Note [Room for the saves]); --skip-memory-check runs anyway"),
        d.need, free, 0);
  }
}

}  // namespace mw::train
