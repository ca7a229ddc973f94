// Loading and saving GPT-2 weights in the HuggingFace folder layout: config.json plus
// model.safetensors with HF's names and Conv1D [in, out] weights. A missing lm_head.weight means
// the head is tied to transformer.wte.weight (the only layout GPT-2 uses).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/gpt2/model.h"

namespace mw::gpt2 {

class WeightFiles;

// A folder's weights, checked against a config's tensor table before anything is read: every
// table entry present with its exact shape and a floating dtype, no tensor the config does not
// account for (listed), a separate lm_head.weight equal to wte. read() then streams one tensor at a
// time into its destination (Note [Streaming load]), so nothing but that tensor is staged in RAM.
//
// Note [Streaming load]: a model larger than RAM is loaded as it is built: the model's parameter
// factory (model.h) fills each parameter straight from the file (into its chunk, for Gemini, which
// writes a disk-homed chunk out once it is full). A bad value found midway (NaN, a read error)
// fails the construction, so no half-loaded model is ever trained or saved.
class HfWeights {
 public:
  HfWeights(const std::string& dir, const Config& config);
  ~HfWeights();
  HfWeights(const HfWeights&) = delete;
  HfWeights& operator=(const HfWeights&) = delete;
  // Reads table entry `hf_name` into dst (any device and floating dtype, the table's shape),
  // converting as needed; FormatError naming the file and tensor for a NaN or Inf. Thread-safe.
  void read(const std::string& hf_name, const Tensor& dst) const;
  // A ParameterFactory::fill that loads every parameter from these weights.
  std::function<bool(const TensorSpec&, const Tensor&)> filler() const;
  const std::string& where() const;

 private:
  std::string file_name(const std::string& hf_name) const;  // the name in the file

  std::unique_ptr<WeightFiles> files_;
  std::string prefix_;  // "transformer." unless the file uses GPT2Model's bare names
  // The tied embedding stored only as lm_head.weight (some conversions kept the tied pair under
  // that name; transformers loads it, as the two are one parameter).
  bool wte_from_head_ = false;
};

// Reads DIR/config.json; `option` is what named DIR on the command line, for the error.
Config load_hf_config(const std::string& dir, const std::string& option = "--init-from");
// Copies DIR/model.safetensors (or the shards of DIR/model.safetensors.index.json) into the model's
// parameters (converting F16/BF16/F64 to the model's dtype). Every table entry must be present with
// its exact shape; a tensor the config does not account for (e.g. an extra layer) is refused,
// listing them; a NaN or Inf is refused naming the tensor; pytorch_model.bin alone gets the
// conversion command. Errors name the file, the tensor and the problem, and leave the parameters as
// they were.
void load_hf_weights(GPT2& model, const std::string& dir);
// Writes DIR/model.safetensors (F32), DIR/config.json and DIR/generation_config.json as one folder
// (Note [Atomic folder save]): DIR is replaced whole or left as it was. `config` is the one to
// record (the user's, without a run's --dropout override); it must describe the model's tensors. A
// model with a NaN or Inf weight is refused (FormatError naming the parameter) before anything is
// written.
//
// Tensors are written one at a time in table order (Note [Streaming save]): `before_read(name)`,
// when given, is called before a parameter's bytes are read, so a caller whose parameters live on
// disk (Gemini's three tiers) can bring in one chunk at a time. `extra_files` (name, contents),
// such as the tokenizer's vocab.json + merges.txt or tokenizer.json, are written into the folder.
//
// An existing DIR is replaced only when it holds nothing but what save_hf writes
// (is_saved_model_entry; Note [Replacing only what a save wrote], data/atomic_save.h); otherwise
// IoError naming the foreign entries, and nothing is written.
void save_hf(const GPT2& model, const std::string& dir);
//
// Note [Saving in bf16 or fp16]: `dtype` F32 (the default), BF16 or F16 is the dtype of the
// tensors in model.safetensors (and config.json's torch_dtype), each rounded once to nearest even
// from the f32 weights: half the bytes, as HF's save_pretrained of a model cast with .half() or
// .to(torch.bfloat16). Loading widens them back exactly (to the rounded values). A weight beyond
// fp16's largest finite value (65504) would be written as inf: that save is refused naming the
// tensor, and any earlier save is kept. Checkpoints always save f32 (they resume bit for bit).
void save_hf(const GPT2& model, const std::string& dir, const Config& config,
             const std::function<void(const std::string& hf_name)>& before_read = {},
             const std::vector<std::pair<std::string, std::string>>& extra_files = {},
             DType dtype = DType::F32);

// The names save_hf writes into its folder: model.safetensors, config.json,
// generation_config.json and the tokenizer's tokenizer.json, vocab.json, merges.txt and
// companions (data::kTokenizerCompanions).
bool is_saved_model_entry(const std::string& name);

}  // namespace mw::gpt2
