// Loading and saving GPT-2 weights in the HuggingFace folder layout: config.json plus
// model.safetensors with HF's names and Conv1D [in, out] weights. A missing lm_head.weight means
// the head is tied to transformer.wte.weight (the only layout GPT-2 uses).
#pragma once

#include <string>

#include "models/gpt2/model.h"

namespace mw::gpt2 {

// Reads DIR/config.json.
Config load_hf_config(const std::string& dir);
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
void save_hf(const GPT2& model, const std::string& dir);
void save_hf(const GPT2& model, const std::string& dir, const Config& config);

}  // namespace mw::gpt2
