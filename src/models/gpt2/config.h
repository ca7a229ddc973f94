// GPT-2 hyper-parameters, matching HuggingFace GPT2Config, with the standard presets.
#pragma once

#include <cstdint>
#include <string>

namespace mw::gpt2 {

struct Config {
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  double layer_norm_epsilon = 1e-5;
  double embd_pdrop = 0.1;   // dropout after the embeddings
  double attn_pdrop = 0.1;   // dropout on attention probabilities
  double resid_pdrop = 0.1;  // dropout on each residual branch

  // "small" (124,439,808 params), "medium", "large", "xl", and "tiny" (2 layers, C 32, V 97, for
  // tests).
  static Config preset(const std::string& name);
  void set_dropout(double p) { embd_pdrop = attn_pdrop = resid_pdrop = p; }
  void validate() const;  // throws InvalidArgument naming the bad field
  // HF config.json: reads n_layer, n_head, n_embd, vocab_size, n_positions, layer_norm_epsilon
  // (and the three dropouts when present); writes them with model_type "gpt2".
  static Config from_json_file(const std::string& path);
  void to_json_file(const std::string& path) const;
};

}  // namespace mw::gpt2
