// GPT-2 inference with a KV cache, and sampling (greedy, temperature, top-k, top-p), for
// gpt2_generate and for sampling during training.
//
// Invariants:
// - Reads the weights through GPT2::parameter(name) (HF names, Conv1D [in, out] layout) and
//   computes one position at a time in f32 without autograd: per layer the keys and values of
//   every earlier position are kept (2 * n_layer * n_positions * n_embd floats), so token t costs
//   O(params + t * n_embd) instead of a full forward over t positions.
// - The math is GPT2::forward's (pre-LN blocks, tanh GELU, scores scaled by 1/sqrt(head size),
//   final LN, head tied to wte) in eval mode: no dropout. Its logits equal the last row of
//   forward()'s up to f32 summation order (a test bounds the difference).
// - Positions are absolute: at most n_positions tokens (prompt + generated) fit; feed() past that
//   is an InvalidArgument.
// - Sampling is deterministic for a seed: temperature 0 is argmax (the lowest id on ties);
//   otherwise logits / T, then top-k, then top-p (the smallest set of most likely tokens whose
//   probability reaches p), then one draw from a seeded SplitMix64.
// - Note [Repetition penalty]: small GPT-2s loop ("the the the", a sentence over and over) under
//   greedy and low-temperature sampling. HF's repetition_penalty (CTRL, Keskar et al. 2019) divides
//   the positive logits and multiplies the negative ones of every token id in the context (prompt
//   and generated so far) by the penalty, before the temperature; 1 leaves the logits as they are.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "models/gpt2/model.h"

namespace mw::gpt2 {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // 1: off
  uint64_t seed = 0;
  // Note [Repetition penalty]: > 1 makes every token already in the context less likely; 1: off.
  double repetition_penalty = 1.0;
};

class KvCacheDecoder {
 public:
  // The model must outlive the decoder, its parameters kept in place (their host pointers are taken
  // here; f32 is read directly, another dtype through an f32 copy).
  explicit KvCacheDecoder(const GPT2& model);

  // Runs `token` at the next position; returns the logits [vocab_size] for the following token.
  const std::vector<float>& feed(int32_t token);
  int64_t position() const { return position_; }  // tokens fed so far
  void reset() { position_ = 0; }

 private:
  struct Layer {
    const float *ln1_w, *ln1_b, *attn_w, *attn_b, *proj_w, *proj_b;
    const float *ln2_w, *ln2_b, *fc_w, *fc_b, *fc_proj_w, *fc_proj_b;
    std::vector<float> keys, values;  // [n_positions, n_embd]
  };
  const float* weight(const std::string& name);
  void attention(Layer& layer, const float* qkv, float* out);

  const GPT2& model_;
  Config config_;
  std::vector<Tensor> converted_;  // f32 copies of parameters of another dtype
  const float *wte_, *wpe_, *lnf_w_, *lnf_b_;
  std::vector<Layer> layers_;
  int64_t position_ = 0;
  // Scratch, sized once.
  std::vector<float> x_, h_, qkv_, att_, fc_, scores_, logits_;
};

class Sampler {
 public:
  explicit Sampler(SamplingOptions options);
  // The next id after `context` (the prompt and the ids drawn so far: the repetition penalty's).
  int32_t next(const std::vector<float>& logits, const std::vector<int32_t>& context);

 private:
  double uniform();  // [0, 1)
  SamplingOptions options_;
  uint64_t state_;
  std::vector<std::pair<float, int32_t>> candidates_;
  std::vector<float> penalized_;
};

// Note [Sliding context]: positions are absolute, so a model of n_positions cannot see more. With
// a Slide, generation does not stop when the context is full (an extension: transformers stops;
// nanoGPT crops to the last n_positions tokens at every step): the KV cache is rebuilt from the
// last n_positions / 2 tokens (the prompt's and the generated ones alike), which costs a forward
// of those each n_positions / 2 new tokens, and a prompt longer than the context keeps its last
// n_positions tokens. The repetition penalty still sees the whole text.
struct Slide {
  int64_t slides = 0;          // times the context was rebuilt
  int64_t prompt_dropped = 0;  // tokens cut from the prompt's start
};

// Feeds the prompt (at least one token), then samples up to max_new_tokens, stopping early when
// on_token returns false or, without `slide`, when the context is full (a prompt longer than the
// context is then an InvalidArgument). Returns the generated ids (without the prompt).
std::vector<int32_t> generate(const GPT2& model, const std::vector<int32_t>& prompt,
                              int64_t max_new_tokens, const SamplingOptions& options,
                              const std::function<bool(int32_t)>& on_token = {},
                              Slide* slide = nullptr);

}  // namespace mw::gpt2
