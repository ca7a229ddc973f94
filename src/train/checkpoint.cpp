// Training checkpoints: Note [Checkpoint layout] and Note [Exact resume] (checkpoint.h).
#include "train/checkpoint.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "data/atomic_save.h"
#include "data/file_io.h"

namespace mw::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kTrainerState = "trainer.json";
constexpr const char* kPrefix = "step_";

std::string u64_text(uint64_t v) { return std::to_string(v); }

uint64_t u64_from(const json::Value& v, std::string_view key, const std::string& source) {
  const std::string& s = v.get_string(key);
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(s.c_str(), &end, 10);
  MW_CHECK_T(FormatError, !s.empty() && *end == '\0' && errno == 0, source, ": \"", key, "\" is '",
             s, "', expected a decimal unsigned 64-bit integer");
  return x;
}

// Regular files under root, as paths relative to it, sorted.
std::vector<std::string> files_under(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) out.push_back(fs::relative(e.path(), root).string());
  std::sort(out.begin(), out.end());
  return out;
}

bool is_checkpoint_name(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0 || name.size() <= std::strlen(kPrefix)) return false;
  return std::all_of(name.begin() + static_cast<std::ptrdiff_t>(std::strlen(kPrefix)), name.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

void write_text(const std::string& path, const std::string& text, const std::string& hint) {
  data::write_file(path, {{text.data(), static_cast<int64_t>(text.size())}}, hint);
}

}  // namespace

json::Value to_json(const TrainState& s) {
  json::Value v = json::Value::object();
  v.set("format", "memwall-train-state-1");
  v.set("step", s.step);
  v.set("micro_batch", s.micro_batch);
  v.set("dropout_rng_seed", u64_text(s.dropout_rng.seed));
  v.set("dropout_rng_offset", u64_text(s.dropout_rng.offset));
  v.set("loss_scale", s.scaler.scale);
  v.set("loss_scale_growth_tracker", s.scaler.growth_tracker);
  v.set("loss_scale_hysteresis_left", s.scaler.hysteresis_left);
  v.set("skipped_steps", s.scaler.skipped_steps);
  v.set("run", s.run);
  if (!s.optimizer_layout.is_null()) v.set("optimizer_layout", s.optimizer_layout);
  if (s.best.step >= 0) {  // Note [Best model and early stopping]
    v.set("best_val_loss", s.best.loss);
    v.set("best_val_step", s.best.step);
  }
  // Also without a best: evaluations whose loss was not finite count towards --early-stop (they
  // were lost on resume until session 38).
  v.set("evals_since_best", s.best.evals_since);
  if (s.last_eval_step >= 0) v.set("last_eval_step", s.last_eval_step);
  return v;
}

TrainState train_state_from_json(const json::Value& v, const std::string& source) {
  MW_CHECK_T(FormatError,
             v.is_object() && v.find("format") && v.get_string("format") == "memwall-train-state-1",
             source,
             ": not a memwall training state (expected \"format\": "
             "\"memwall-train-state-1\")");
  TrainState s;
  s.step = v.get_int("step");
  s.micro_batch = v.get_int("micro_batch");
  s.dropout_rng.seed = u64_from(v, "dropout_rng_seed", source);
  s.dropout_rng.offset = u64_from(v, "dropout_rng_offset", source);
  s.scaler.scale = v.get_double("loss_scale");
  s.scaler.growth_tracker = v.get_int("loss_scale_growth_tracker");
  s.scaler.hysteresis_left = v.get_int("loss_scale_hysteresis_left");
  s.scaler.skipped_steps = v.get_int("skipped_steps");
  s.run = v.at("run");
  if (const json::Value* layout = v.find("optimizer_layout")) s.optimizer_layout = *layout;
  if (v.find("best_val_step")) {  // absent before any evaluation, and in older checkpoints
    s.best.loss = v.get_double("best_val_loss");
    s.best.step = v.get_int("best_val_step");
  }
  if (v.find("evals_since_best")) s.best.evals_since = v.get_int("evals_since_best");
  if (v.find("last_eval_step")) s.last_eval_step = v.get_int("last_eval_step");
  return s;
}

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%06" PRId64, kPrefix, step);
  return buf;
}

std::string file_checksum(const std::string& path) {
  data::ReadOnlyFile f(path, "checkpoint file", "the checkpoint is incomplete");
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a offset basis and prime, over 64-bit words
  constexpr uint64_t kPrime = 0x100000001b3ull;
  std::vector<uint64_t> buf(size_t{1} << 17);  // 1 MiB
  const int64_t size = f.size_bytes();
  for (int64_t off = 0; off < size;) {
    const int64_t n = std::min<int64_t>(size - off, static_cast<int64_t>(buf.size() * 8));
    f.read_exact(buf.data(), n, off);
    const int64_t words = n / 8;
    for (int64_t i = 0; i < words; ++i) h = (h ^ buf[static_cast<size_t>(i)]) * kPrime;
    const auto* tail = reinterpret_cast<const unsigned char*>(buf.data()) + words * 8;
    for (int64_t i = 0; i < n - words * 8; ++i) h = (h ^ tail[i]) * kPrime;
    off += n;
  }
  h = (h ^ static_cast<uint64_t>(size)) * kPrime;  // a zero tail cannot hide a truncation
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, h);
  return hex;
}

std::string write_checkpoint(const std::string& dir, const TrainState& state,
                             const std::function<void(const std::string&)>& save_model,
                             const std::function<void(const std::string&)>& save_optimizer) {
  const std::string final_path = (fs::path(dir) / checkpoint_name(state.step)).string();
  const std::string hint = "pass --checkpoint-dir a writable directory with free space";
  // What a checkpoint folder holds (an earlier run's step of the same number is replaced).
  const data::SavedEntries saved = [](const std::string& name) {
    return name == "model" || name == kTrainerState || name == kManifest ||
           name.rfind("optimizer", 0) == 0;
  };
  data::StagedDirectory staged(final_path, hint, saved);
  try {
    save_model(staged.file("model"));
    if (save_optimizer) save_optimizer(staged.file("optimizer.bin"));
  } catch (const IoError& e) {  // the writers name their staging paths and --save: say which
    // A failure of the offload files the weights or states are read from (an EIO of Gemini's disk
    // tier) is not the checkpoint folder's: it was blamed on --checkpoint-dir before.
    const bool in_folder = !e.path.empty() && e.path.rfind(dir, 0) == 0;
    throw IoError(
        str("writing the checkpoint of step ", state.step, " to '", final_path,
            "' failed and none of it was kept (earlier checkpoints in '", dir,
            "' are whole): ", e.what(),
            in_folder ? ". For checkpoints: " + hint
                      : str(". The error is in '", e.path, "', not in the checkpoint folder")),
        e.path, e.offset, e.length, e.err);
  }
  write_text(staged.file(kTrainerState), to_json(state).dump() + "\n", hint);
  const std::string root = fs::path(staged.file(kTrainerState)).parent_path().string();
  json::Value files = json::Value::array();
  for (const auto& rel : files_under(root)) {
    json::Value f = json::Value::object();
    f.set("path", rel);
    f.set("bytes", static_cast<int64_t>(fs::file_size(fs::path(root) / rel)));
    f.set("checksum", file_checksum((fs::path(root) / rel).string()));
    files.push_back(std::move(f));
  }
  json::Value manifest = json::Value::object();
  manifest.set("checksum", "fnv1a64-words");
  manifest.set("files", std::move(files));
  write_text(staged.file(kManifest), manifest.dump() + "\n", hint);
  staged.commit();
  return final_path;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && is_checkpoint_name(name))
      found.emplace_back(checkpoint_step(name), e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

int remove_stale_checkpoint_temporaries(const std::string& dir) {
  std::vector<std::string> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();  // ".step_000004.tmp-1234"
    const size_t dot = name.find('.', 1);
    if (name.size() > 1 && name[0] == '.' && dot != std::string::npos &&
        is_checkpoint_name(name.substr(1, dot - 1)))
      steps.push_back(dir + "/" + name.substr(1, dot - 1));
  }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  int removed = 0;
  for (const std::string& step : steps) removed += data::remove_stale_temporaries(step);
  return removed;
}

int prune_checkpoints(const std::string& dir, int64_t keep) {
  if (keep <= 0) return 0;
  const std::vector<std::string> all = list_checkpoints(dir);
  int removed = 0;
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) {
    fs::remove_all(all[i]);
    ++removed;
  }
  return removed;
}

int64_t checkpoint_step(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  return is_checkpoint_name(name) ? std::stoll(name.substr(std::strlen(kPrefix))) : -1;
}

bool is_checkpoint_folder(const std::string& path) {
  std::error_code ec;
  return checkpoint_step(path) >= 0 && fs::exists(fs::path(path) / kManifest, ec);
}

std::string find_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / kManifest, ec)) return dir;
  MW_CHECK_T(IoError, fs::is_directory(dir, ec), "--resume '", dir,
             "' is not a directory; pass the --checkpoint-dir of the run to resume");
  const std::vector<std::string> all = list_checkpoints(dir);
  // A saved model (--save's folder) resumes nothing, but it can start a run.
  const bool model = fs::exists(fs::path(dir) / "config.json", ec);
  MW_CHECK_T(
      IoError, !all.empty(), "--resume '", dir,
      "' holds no checkpoint (no step_NNNNNN folder); pass the --checkpoint-dir of a run "
      "that wrote one (--checkpoint-every N)",
      model ? str("; it is a model folder: --init-from ", dir, " starts a new run from its weights")
            : std::string());
  return all.back();
}

TrainState verify_checkpoint(const std::string& path) {
  const std::string manifest_path = (fs::path(path) / kManifest).string();
  auto corrupt = [&](const std::string& what) {
    return FormatError(str("checkpoint '", path, "' is corrupt: ", what,
                           "; delete that folder to resume from the previous checkpoint, or "
                           "pass --resume the folder of an earlier one"));
  };
  std::error_code ec;
  if (!fs::exists(manifest_path, ec)) throw corrupt("manifest.json is missing");
  // A manifest that does not parse, or lacks what every checkpoint holds, is a corrupt checkpoint
  // too (it was a bare JSON error, "missing key 'files'" without a path, or, listing no files,
  // resumed with nothing verified).
  struct Listed {
    std::string path, checksum;
    int64_t bytes;
  };
  std::vector<Listed> listed;
  try {
    const json::Value manifest = json::parse(
        data::read_text_file(manifest_path, "checkpoint manifest", "the checkpoint is incomplete"),
        manifest_path);
    for (const json::Value& f : manifest.at("files").elements())
      listed.push_back({f.get_string("path"), f.get_string("checksum"), f.get_int("bytes")});
  } catch (const IoError&) {
    throw;
  } catch (const Error& e) {
    throw corrupt(str("its manifest.json cannot be read (", e.what(), ")"));
  }
  for (const char* needed : {kTrainerState, "model/model.safetensors"})
    if (std::none_of(listed.begin(), listed.end(),
                     [&](const Listed& f) { return f.path == needed; }))
      throw corrupt(str("its manifest.json does not list ", needed));
  for (const Listed& f : listed) {
    const std::string& rel = f.path;
    const fs::path file = fs::path(path) / rel;
    if (!fs::is_regular_file(file, ec)) throw corrupt(str("file '", rel, "' is missing"));
    const int64_t bytes = static_cast<int64_t>(fs::file_size(file));
    if (bytes != f.bytes)
      throw corrupt(str("file '", rel, "' is ", bytes, " bytes, the manifest says ", f.bytes,
                        " (truncated or overwritten)"));
    const std::string sum = file_checksum(file.string());
    if (sum != f.checksum)
      throw corrupt(str("file '", rel, "' has checksum ", sum, ", the manifest says ", f.checksum));
  }
  const std::string state_path = (fs::path(path) / kTrainerState).string();
  return train_state_from_json(json::parse(data::read_text_file(state_path, "training state",
                                                                "the checkpoint is incomplete"),
                                           state_path),
                               state_path);
}

// Note [One run per checkpoint folder]: --resume DIR takes the newest checkpoint by step, so a run
// that writes into a folder holding later checkpoints than its own start (another run's, or the
// steps a rolled-back run went back from) mixes two runs, and a resume after a kill would take the
// other run's newest: a fresh run that forgot --resume, or a resume from step_000002 with
// step_000006 beside it. Refused before the first step, naming both ways out.
void check_checkpoint_dir_is_this_runs(const std::string& dir, int64_t from, bool resumed) {
  std::vector<std::string> later;
  for (const std::string& c : list_checkpoints(dir))
    if (checkpoint_step(c) > from) later.push_back(fs::path(c).filename().string());
  if (later.empty()) return;
  throw InvalidArgument(str(
      "--checkpoint-dir '", dir, "' holds ", later.size(), " checkpoint",
      later.size() > 1 ? "s" : "", " past step ", from, " (", later.front(),
      later.size() > 1 ? str(" .. ", later.back()) : "", ") of another run: this run (from step ",
      from, ") would mix its checkpoints with them, and a later --resume would take their newest. ",
      resumed ? "Going back to an earlier checkpoint: pass another --checkpoint-dir (or move the "
                "later ones away)"
              : str("Pass --resume ", dir, " to continue that run, or another --checkpoint-dir")));
}

}  // namespace mw::train
