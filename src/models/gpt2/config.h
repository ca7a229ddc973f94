// GPT-2 hyper-parameters, matching HuggingFace GPT2Config, with the standard presets.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace mw::gpt2 {

struct Config {
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  double layer_norm_epsilon = 1e-5;
  double embd_pdrop = 0.1;          // dropout after the embeddings
  double attn_pdrop = 0.1;          // dropout on attention probabilities
  double resid_pdrop = 0.1;         // dropout on each residual branch
  int64_t n_inner = 0;              // MLP width; 0 (config.json null) = 4 * n_embd
  double initializer_range = 0.02;  // stddev of the random initialisation
  // Token ids recorded for generation (generation_config.json); -1 = none.
  int64_t bos_token_id = 50256, eos_token_id = 50256;
  // The rest of an eos_token_id list (transformers' generate stops at any of them), in order.
  std::vector<int64_t> more_eos_token_ids;
  // Keys of the config.json read that are not GPT2Config fields (kept out of the model; the caller
  // may warn). Empty for presets.
  std::vector<std::string> unknown_fields;

  // "small" (124,439,808 params), "medium", "large", "xl", and "tiny" (2 layers, C 32, V 97, for
  // tests).
  static Config preset(const std::string& name);
  void set_dropout(double p) { embd_pdrop = attn_pdrop = resid_pdrop = p; }
  int64_t mlp_width() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
  bool is_eos(int64_t id) const {
    return id == eos_token_id || std::find(more_eos_token_ids.begin(), more_eos_token_ids.end(),
                                           id) != more_eos_token_ids.end();
  }
  void validate() const;  // throws InvalidArgument naming the bad field
  // HF config.json (config_json.cpp, Note [GPT2Config fields]): every GPT2Config field is honoured
  // or refused; a value of the wrong type is a FormatError naming the file and the field.
  static Config from_json_file(const std::string& path);
  static Config from_json_text(const std::string& text, const std::string& path);
  // HF's config.json; torch_dtype names the dtype model.safetensors holds ("float32",
  // "bfloat16" or "float16").
  std::string to_json(const std::string& torch_dtype = "float32") const;
  void to_json_file(const std::string& path) const;  // atomically (data/file_io.h)
  // generation_config.json's content: bos/eos token ids, as HF writes beside a model.
  std::string generation_config_json() const;
};

}  // namespace mw::gpt2
