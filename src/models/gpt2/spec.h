// The one table of GPT-2's tensors (STYLE: one source of truth). Parameter creation, HF loading and
// saving, chunk packing and the parity test all iterate this table; nothing else lists tensors.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/gpt2/config.h"

namespace mw::gpt2 {

enum class Init {
  Normal,           // N(0, 0.02)
  NormalResidProj,  // N(0, 0.02 / sqrt(2 * n_layer)): every c_proj.weight (GPT-2 paper, HF)
  Zeros,
  Ones,
};

struct TensorSpec {
  std::string name;  // HF name, e.g. "transformer.h.0.attn.c_attn.weight"
  Shape shape;       // HF layout: Conv1D weights are [in, out]
  Init init;
};

// In HF's parameter order. The LM head is tied to transformer.wte.weight and has no entry.
std::vector<TensorSpec> tensor_specs(const Config& config);
// Whether only matrix products read the tensor (the blocks' four weight matrices; not the
// embeddings, which the lookup reads in f32, nor biases and LayerNorms): under autocast it is
// only ever read cast to 16 bits (Note [16-bit copies], offload/gemini/low_copies.cpp).
bool read_only_by_products(const TensorSpec& spec);
std::vector<char> read_only_by_products(const Config& config);  // per tensor_specs entry
int64_t num_parameters(const Config& config);

}  // namespace mw::gpt2
