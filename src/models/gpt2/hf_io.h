// Loading and saving GPT-2 weights in the HuggingFace folder layout: config.json plus
// model.safetensors with HF's names and Conv1D [in, out] weights. A missing lm_head.weight means
// the head is tied to transformer.wte.weight (the only layout GPT-2 uses).
#pragma once

#include <string>

#include "models/gpt2/model.h"

namespace mw::gpt2 {

// Reads DIR/config.json.
Config load_hf_config(const std::string& dir);
// Copies DIR/model.safetensors into the model's parameters (converting F16/BF16/F64 to the model's
// dtype). Every table entry must be present with its exact shape. Errors name the file, the tensor
// and the problem, and leave the model's parameters as they were.
void load_hf_weights(GPT2& model, const std::string& dir);
// Writes DIR/config.json and DIR/model.safetensors (F32), creating DIR if needed.
void save_hf(const GPT2& model, const std::string& dir);

}  // namespace mw::gpt2
