// HF folder I/O for GPT-2 (hf_io.h), driven by the tensor table.
#include "models/gpt2/hf_io.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>

#include "core/convert.h"
#include "data/atomic_save.h"
#include "data/file_io.h"
#include "data/json.h"
#include "data/safetensors.h"
#include "data/tokenizer_files.h"

namespace mw::gpt2 {

namespace fs = std::filesystem;

namespace {
const char* kSingleFile = "model.safetensors";
const char* kShardIndex = "model.safetensors.index.json";
}  // namespace

// The tensors of a folder: one model.safetensors, or the shards named by its index.
class WeightFiles {
 public:
  explicit WeightFiles(const std::string& dir) {
    const std::string single = (fs::path(dir) / kSingleFile).string();
    const std::string index = (fs::path(dir) / kShardIndex).string();
    std::error_code ec;
    if (fs::exists(single, ec)) {
      add(single);
    } else if (fs::exists(index, ec)) {
      open_shards(dir, index);
    } else if (fs::exists(fs::path(dir) / "pytorch_model.bin", ec) ||
               fs::exists(fs::path(dir) / "pytorch_model.bin.index.json", ec)) {
      throw FormatError(
          str("'", dir,
              "' holds pytorch_model.bin (or its shards) but no model.safetensors; memwall reads "
              "only "
              "safetensors (pickle files can run code). Convert it with Python: from transformers "
              "import GPT2LMHeadModel; GPT2LMHeadModel.from_pretrained('",
              dir, "').save_pretrained('", dir, "', safe_serialization=True)"));
    } else {
      throw IoError(str("'", dir, "' has neither ", kSingleFile, " nor ", kShardIndex,
                        "; expected a HuggingFace GPT-2 folder with its weights"));
    }
  }
  const std::string& where() const { return where_; }
  // The record named `name` and its reader, or nulls.
  std::pair<const data::SafeTensorsReader*, const data::TensorRecord*> find(
      const std::string& name) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return {nullptr, nullptr};
    return it->second;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> n;
    for (const auto& [name, _] : by_name_) n.push_back(name);
    return n;
  }

 private:
  void add(const std::string& path) {
    readers_.push_back(std::make_unique<data::SafeTensorsReader>(path));
    const data::SafeTensorsReader* r = readers_.back().get();
    for (const auto& rec : r->tensors()) {
      MW_CHECK_T(FormatError, by_name_.count(rec.name) == 0, "tensor '", rec.name,
                 "' is in two shards (", by_name_[rec.name].first->path(), " and ", path, ")");
      by_name_[rec.name] = {r, &rec};
    }
    where_ += (where_.empty() ? "" : ", ") + path;
  }
  void open_shards(const std::string& dir, const std::string& index_path) {
    json::Value index =
        json::parse(data::read_text_file(index_path, "shard index",
                                         "expected HF's model.safetensors.index.json"),
                    index_path);
    MW_CHECK_T(
        FormatError,
        index.is_object() && index.contains("weight_map") && index.at("weight_map").is_object(),
        index_path, ": expected an object with a \"weight_map\" object");
    const json::Value& map = index.at("weight_map");
    MW_CHECK_T(FormatError, map.size() > 0, index_path,
               ": \"weight_map\" is empty; expected each tensor's shard file");
    std::set<std::string> shards;
    for (int64_t i = 0; i < map.size(); ++i) {
      const json::Value& file = map.value(i);
      MW_CHECK_T(FormatError, file.is_string(), index_path, ": weight_map \"", map.key(i),
                 "\": expected a file name, found ", file.describe());
      const std::string& name = file.as_string();
      MW_CHECK_T(
          FormatError,
          !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..",
          index_path, ": weight_map \"", map.key(i), "\" names '", name,
          "'; expected a file name in the same folder");
      shards.insert(name);
    }
    for (const auto& s : shards) add((fs::path(dir) / s).string());
    for (int64_t i = 0; i < map.size(); ++i) {
      auto [reader, rec] = find(map.key(i));
      MW_CHECK_T(FormatError,
                 rec && fs::path(reader->path()).filename() == map.value(i).as_string(), index_path,
                 ": tensor '", map.key(i), "' is not in its shard '", map.value(i).as_string(),
                 "'");
    }
  }
  std::vector<std::unique_ptr<data::SafeTensorsReader>> readers_;
  std::map<std::string, std::pair<const data::SafeTensorsReader*, const data::TensorRecord*>>
      by_name_;
  std::string where_;
};

namespace {

// Index of the first NaN or Inf in a float tensor (on the CPU), or -1.
int64_t first_non_finite(const Tensor& t) {
  const float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(p[i])) return i;
  return -1;
}

// HF GPT-2 files may carry the attention mask buffers "h.N.attn.bias" / "h.N.attn.masked_bias"
// (not parameters). Those of layers the config has are accounted for.
bool is_mask_buffer(const std::string& name, const std::string& prefix, int64_t n_layer) {
  for (int64_t i = 0; i < n_layer; ++i) {
    const std::string p = str(prefix, "h.", i, ".attn.");
    if (name == p + "bias" || name == p + "masked_bias") return true;
  }
  return false;
}

// Where a folder without config.json holds a model after all: gpt2_train's checkpoint folder
// (step_NNNNNN, its model in model/) or its --checkpoint-dir (the newest step_* folder's model/).
// Empty when neither.
std::string model_inside_checkpoint(const fs::path& dir) {
  if (fs::exists(dir / "model" / "config.json")) return (dir / "model").string();
  std::string newest;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0 && fs::exists(e.path() / "model" / "config.json"))
      newest = std::max(newest, name);  // step_NNNNNN: the names sort by step
  }
  return newest.empty() ? "" : (dir / newest / "model").string();
}

}  // namespace

Config load_hf_config(const std::string& dir, const std::string& option) {
  MW_CHECK_T(IoError, fs::is_directory(dir), option, " '", dir,
             "' is not a directory; expected a HuggingFace GPT-2 folder with config.json and "
             "model.safetensors");
  // A checkpoint given where a model folder is wanted: say where its model is (it was "cannot
  // open config.json").
  if (!fs::exists(fs::path(dir) / "config.json")) {
    const std::string inside = model_inside_checkpoint(dir);
    MW_CHECK_T(IoError, inside.empty(), option, " '", dir,
               fs::exists(fs::path(dir) / "model") ? "' is a gpt2_train checkpoint"
                                                   : "' holds gpt2_train checkpoints",
               ", not a model folder: pass ", option, " ", inside,
               option == "--init-from"
                   ? str(" (its weights), or --resume ", dir, " to continue that run")
                   : std::string());
  }
  return Config::from_json_file((fs::path(dir) / "config.json").string());
}

HfWeights::HfWeights(const std::string& dir, const Config& config)
    : files_(std::make_unique<WeightFiles>(dir)) {
  const WeightFiles& files = *files_;
  const std::string& path = files.where();
  // HF checkpoints name tensors "transformer.h.0..." (GPT2LMHeadModel) or "h.0..." (GPT2Model).
  const bool bare = !files.find("transformer.wte.weight").second && files.find("wte.weight").second;
  prefix_ = bare ? "" : "transformer.";
  wte_from_head_ = !files.find(file_name("transformer.wte.weight")).second &&
                   files.find("lm_head.weight").second;
  std::set<std::string> accounted = {"lm_head.weight"};
  for (const auto& spec : tensor_specs(config)) {
    const data::TensorRecord* rec = files.find(file_name(spec.name)).second;
    MW_CHECK_T(FormatError, rec, path, ": tensor '", file_name(spec.name),
               "' is missing; expected a GPT-2 checkpoint with n_layer ", config.n_layer,
               " and HF parameter names");
    MW_CHECK_T(FormatError, rec->shape == spec.shape, path, ": tensor '", rec->name, "' has shape ",
               shape_str(rec->shape), ", expected ", shape_str(spec.shape),
               " (does config.json match the weights?)");
    MW_CHECK_T(FormatError,
               rec->unread_dtype.empty() && (rec->dtype == DType::F32 || rec->dtype == DType::F16 ||
                                             rec->dtype == DType::BF16 || rec->dtype == DType::F64),
               path, ": tensor '", rec->name, "' has dtype ", rec->dtype_text(),
               ", expected a floating type (F32, F16, BF16 or F64)");
    accounted.insert(rec->name);
  }
  std::vector<std::string> extra;
  for (const auto& name : files.names())
    if (!accounted.count(name) && !is_mask_buffer(name, prefix_, config.n_layer))
      extra.push_back(name);
  // Another architecture's head (GPT2DoubleHeadsModel's multiple_choice_head, the classifiers'
  // score): transformers' GPT2LMHeadModel drops it with a warning; memwall says what it is.
  for (const std::string& name : extra)
    for (const char* head : {"multiple_choice_head.", "score.", "qa_outputs."})
      MW_CHECK_T(FormatError, name.rfind(head, 0) != 0, path, ": tensor '", name,
                 "' belongs to another model's head than GPT2LMHeadModel's (config.json's "
                 "architectures say which); memwall loads the language model: save it as one "
                 "(transformers: GPT2LMHeadModel.from_pretrained(DIR).save_pretrained(OUT)) and "
                 "pass OUT");
  if (!extra.empty()) {
    std::string list;
    for (size_t i = 0; i < extra.size() && i < 8; ++i) list += (i ? ", " : "") + extra[i];
    throw FormatError(str(path, ": ", extra.size(),
                          " tensors are not accounted for by config.json (", list,
                          extra.size() > 8 ? ", ..." : "", "); does config.json (n_layer ",
                          config.n_layer, ") match the weights?"));
  }
  if (auto [head_reader, head] = files.find("lm_head.weight"); head && !wte_from_head_) {
    auto [wte_reader, wte] = files.find(file_name("transformer.wte.weight"));
    MW_CHECK_T(FormatError, head->shape == wte->shape, path, ": lm_head.weight has shape ",
               shape_str(head->shape), " but the head must be tied to wte ", shape_str(wte->shape));
    // Bit for bit: a NaN in both at one place is the same tensor (damaged, which wte's own check
    // then says), not two that differ.
    const std::vector<float> h = head_reader->read_as_f32(*head), w = wte_reader->read_as_f32(*wte);
    MW_CHECK_T(FormatError, std::memcmp(h.data(), w.data(), h.size() * sizeof(float)) == 0, path,
               ": lm_head.weight differs from transformer.wte.weight; memwall's GPT-2 ties them");
  }
}

HfWeights::~HfWeights() = default;

const std::string& HfWeights::where() const { return files_->where(); }

std::string HfWeights::file_name(const std::string& hf_name) const {
  if (wte_from_head_ && hf_name == "transformer.wte.weight") return "lm_head.weight";
  return prefix_.empty() ? hf_name.substr(std::strlen("transformer.")) : hf_name;
}

void HfWeights::read(const std::string& hf_name, const Tensor& dst) const {
  auto [reader, rec] = files_->find(file_name(hf_name));
  MW_CHECK_T(InvalidArgument, rec && rec->shape == dst.shape(), "HfWeights::read: '", hf_name,
             "' is not a table entry of shape ", dst.desc());
  // Straight into dst when it is host memory of the file's dtype; else through one staged tensor.
  const bool direct = dst.device().is_cpu() && dst.dtype() == rec->dtype && dst.is_contiguous();
  Tensor raw = direct ? dst : Tensor::empty(rec->shape, rec->dtype);
  reader->read(*rec, raw.raw_data());
  Tensor f32 = raw.dtype() == DType::F32 ? raw : raw.to(DType::F32);
  const int64_t bad = first_non_finite(f32);
  MW_CHECK_T(FormatError, bad < 0, reader->path(), ": tensor '", rec->name, "' holds ",
             bad >= 0 ? f32.data<float>()[bad] : 0.f, " at element ", bad,
             "; weights must be finite (the checkpoint is damaged or diverged)");
  if (direct) return;
  NoGradGuard no_grad;
  Tensor(dst).copy_(f32);
}

std::function<bool(const TensorSpec&, const Tensor&)> HfWeights::filler() const {
  return [this](const TensorSpec& spec, const Tensor& t) {
    read(spec.name, t);
    return true;
  };
}

void load_hf_weights(GPT2& model, const std::string& dir) {
  HfWeights weights(dir, model.config());
  // Everything is read (and checked) before any parameter changes, so a bad file changes nothing.
  std::vector<Tensor> staged;
  for (const auto& spec : model.specs()) {
    staged.push_back(Tensor::empty(spec.shape, model.parameter(spec.name).dtype()));
    weights.read(spec.name, staged.back());
  }
  NoGradGuard no_grad;
  for (size_t i = 0; i < staged.size(); ++i) {
    Tensor p = model.parameter(model.specs()[i].name);
    p.copy_(staged[i].to(p.device()));
  }
}

bool is_saved_model_entry(const std::string& name) {
  for (const char* saved : {kSingleFile, "config.json", "generation_config.json", "tokenizer.json",
                            "vocab.json", "merges.txt"})
    if (name == saved) return true;
  for (const char* companion : data::kTokenizerCompanions)
    if (name == companion) return true;
  return false;
}

void save_hf(const GPT2& model, const std::string& dir) { save_hf(model, dir, model.config()); }

namespace {

std::string torch_dtype_name(DType d) {
  return d == DType::BF16 ? "bfloat16" : d == DType::F16 ? "float16" : "float32";
}

// fp16's largest finite value is 65504; an f32 of magnitude 65520 or more rounds to inf.
void check_fits_fp16(const Tensor& t, const std::string& name, const std::string& dir) {
  const float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    MW_CHECK_T(FormatError, std::fabs(p[i]) < 65520.f, "not saving to '", dir,
               "' in fp16: parameter '", name, "' holds ", p[i], " at element ", i,
               ", beyond fp16's largest value 65504; save in bf16 or fp32 (any earlier save is "
               "kept)");
}

}  // namespace

// Note [Streaming save]: each parameter is read (and checked finite) only when the writer reaches
// it, converted to f32 on the host, and dropped after its bytes are written, so a save holds one
// tensor (and, under Gemini's three tiers, one chunk: before_read) beyond the model. A non-finite
// weight found midway throws, the staged folder is removed, and any earlier save is kept.
void save_hf(const GPT2& model, const std::string& dir, const Config& config,
             const std::function<void(const std::string& hf_name)>& before_read,
             const std::vector<std::pair<std::string, std::string>>& extra_files, DType dtype) {
  MW_CHECK_T(InvalidArgument, dtype == DType::F32 || is_low_precision(dtype),
             "save_hf: models are saved in f32, bf16 or f16, not ", dtype_name(dtype));
  MW_CHECK_T(InvalidArgument,
             tensor_specs(config).size() == model.specs().size() &&
                 num_parameters(config) == model.num_parameters(),
             "save_hf: the config to write does not describe the model's tensors");
  data::SafeTensorsWriter writer;
  for (const auto& spec : model.specs()) {
    writer.add_streamed(spec.name, dtype, spec.shape, [&](const data::ByteSink& emit) {
      if (before_read) before_read(spec.name);
      Tensor t = model.parameter(spec.name).to(Device::cpu()).contiguous().to(DType::F32);
      const int64_t bad = first_non_finite(t);
      MW_CHECK_T(FormatError, bad < 0, "not saving to '", dir, "': parameter '", spec.name,
                 "' holds ", bad >= 0 ? t.data<float>()[bad] : 0.f, " at element ", bad,
                 "; a model with non-finite weights is never written (any earlier save is kept)");
      if (dtype == DType::F16) check_fits_fp16(t, spec.name, dir);  // Note [Saving in bf16 or fp16]
      if (dtype != DType::F32) t = t.to(dtype);
      emit(t.raw_data(), t.nbytes());
    });
  }
  writer.set_metadata("format", "pt");
  const char* hint = "pass --save a folder in a writable directory with room";
  std::error_code ec;
  const bool had_folder = std::filesystem::exists(dir, ec);
  try {
    data::StagedDirectory staged(dir, hint, is_saved_model_entry);
    writer.write(staged.file(kSingleFile), /*atomic=*/false);  // the model first
    const std::string config_json = config.to_json(torch_dtype_name(dtype)),
                      generation = config.generation_config_json();
    data::write_file(staged.file("config.json"),
                     {{config_json.data(), static_cast<int64_t>(config_json.size())}}, hint);
    data::write_file(staged.file("generation_config.json"),
                     {{generation.data(), static_cast<int64_t>(generation.size())}}, hint);
    for (const auto& [name, bytes] : extra_files)
      data::write_file(staged.file(name), {{bytes.data(), static_cast<int64_t>(bytes.size())}},
                       hint);
    staged.commit();
  } catch (const IoError& e) {  // say what became of the earlier folder, when there was one
    throw IoError(
        str("saving the model to '", dir, "' failed",
            had_folder ? str("; the earlier '", dir, "' is kept as it was") : "", ": ", e.what()),
        e.path, e.offset, e.length, e.err);
  }
}

}  // namespace mw::gpt2
