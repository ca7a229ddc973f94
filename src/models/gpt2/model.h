// GPT-2, equal to HuggingFace GPT2LMHeadModel: token + position embeddings, dropout, n_layer pre-LN
// blocks, final layernorm, and an LM head tied to the token embedding.
//
// Parameters are created from the tensor table (spec.h) and handed to the layers, so the module
// tree's named_parameters() are exactly HF's names, in HF's order (a test checks this).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "models/gpt2/config.h"
#include "models/gpt2/spec.h"
#include "nn/layers.h"

namespace mw::gpt2 {

// Where GPT2's parameters are made (Note [Streaming construction] in offload/gemini/gemini.h):
// make returns an uninitialised contiguous tensor for a table entry (unset: Tensor::empty on the
// model's device); fill, when set, sets its values (from a checkpoint: Note [Streaming load] in
// hf_io.h) and returns true, or returns false for the model's own initialisation; ready is called
// once the values are set.
struct ParameterFactory {
  std::function<Tensor(const TensorSpec& spec)> make;
  std::function<bool(const TensorSpec& spec, const Tensor& t)> fill;
  std::function<void(const TensorSpec& spec)> ready;
};

class GPT2 : public nn::Module {
 public:
  // Initialised as HF does (spec.h's Init), from a counter-based generator seeded with `seed`.
  GPT2(const Config& config, uint64_t seed = 0, DType dtype = DType::F32,
       Device device = Device::cpu(), const ParameterFactory& factory = {});
  // ids [B, T] (i32 or i64) -> logits [B, T, V].
  Tensor forward(const Tensor& ids) override;
  std::string type_name() const override { return "GPT2LMHeadModel"; }

  const Config& config() const { return config_; }
  const std::vector<TensorSpec>& specs() const { return specs_; }
  const Tensor& parameter(const std::string& hf_name) const;
  int64_t num_parameters() const;
  // Sets checkpointing of each block (nn/checkpoint.h); 0 segments means every block.
  std::vector<std::shared_ptr<nn::Block>>& blocks() { return blocks_; }

  // Hook for models that run their blocks differently (recomputation): maps x through block i.
  std::function<Tensor(nn::Block& block, int64_t index, const Tensor& x)> run_block;

 private:
  Config config_;
  std::vector<TensorSpec> specs_;
  std::map<std::string, Tensor> by_name_;
  std::shared_ptr<nn::Embedding> wte_, wpe_;
  std::shared_ptr<nn::LMHead> lm_head_;  // owns wte's weight too (tied)
  std::vector<std::shared_ptr<nn::Block>> blocks_;
  std::shared_ptr<nn::LayerNorm> ln_f_;
  std::shared_ptr<nn::Dropout> drop_;
  Tensor positions_;  // cached [T] int32 position ids
};

}  // namespace mw::gpt2
