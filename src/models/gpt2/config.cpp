// GPT-2 presets and validation (config.json is config_json.cpp).
#include "models/gpt2/config.h"

#include "core/error.h"

namespace mw::gpt2 {

Config Config::preset(const std::string& name) {
  Config c;
  if (name == "small") return c;
  if (name == "medium") {
    c.n_layer = 24;
    c.n_head = 16;
    c.n_embd = 1024;
    return c;
  }
  if (name == "large") {
    c.n_layer = 36;
    c.n_head = 20;
    c.n_embd = 1280;
    return c;
  }
  if (name == "xl") {
    c.n_layer = 48;
    c.n_head = 25;
    c.n_embd = 1600;
    return c;
  }
  if (name == "tiny") {
    c.n_layer = 2;
    c.n_head = 4;
    c.n_embd = 32;
    c.vocab_size = 97;
    c.n_positions = 32;
    c.bos_token_id = c.eos_token_id = 96;  // the last token, as GPT-2's 50256
    return c;
  }
  throw InvalidArgument(
      str("unknown GPT-2 preset '", name, "': expected tiny, small, medium, large or xl"));
}

void Config::validate() const {
  MW_CHECK_T(
      InvalidArgument, n_layer > 0 && n_head > 0 && n_embd > 0 && vocab_size > 0 && n_positions > 0,
      "GPT-2 config: n_layer, n_head, n_embd, vocab_size and n_positions must be positive (got ",
      n_layer, ", ", n_head, ", ", n_embd, ", ", vocab_size, ", ", n_positions, ")");
  MW_CHECK_T(InvalidArgument, n_embd % n_head == 0, "GPT-2 config: n_embd ", n_embd,
             " is not divisible by n_head ", n_head);
  MW_CHECK_T(InvalidArgument, layer_norm_epsilon > 0 && layer_norm_epsilon < 1,
             "GPT-2 config: layer_norm_epsilon ", layer_norm_epsilon, " must be in (0, 1)");
  MW_CHECK_T(InvalidArgument, n_inner >= 0, "GPT-2 config: n_inner ", n_inner,
             " must be positive (or null for 4 * n_embd)");
  MW_CHECK_T(InvalidArgument, initializer_range > 0 && initializer_range < 10,
             "GPT-2 config: initializer_range ", initializer_range, " must be in (0, 10)");
  // HF's default ids (50256) are kept even for a smaller vocabulary, as HF keeps them.
  for (int64_t id : {bos_token_id, eos_token_id})
    MW_CHECK_T(InvalidArgument, id >= -1, "GPT-2 config: token id ", id,
               " (bos_token_id / eos_token_id) must be >= 0 (or null)");
  // Bounds that keep every size product far inside int64 (a 2^24-wide model is already absurd);
  // the memory a shape needs is checked by the run, not here.
  constexpr int64_t kMaxDim = int64_t{1} << 24;
  for (int64_t d : {n_layer, n_head, n_embd, vocab_size, n_positions, n_inner})
    MW_CHECK_T(InvalidArgument, d <= kMaxDim, "GPT-2 config: a size of ", d, " exceeds ", kMaxDim,
               " (n_layer, n_head, n_embd, n_inner, vocab_size, n_positions)");
  for (double p : {embd_pdrop, attn_pdrop, resid_pdrop})
    MW_CHECK_T(InvalidArgument, p >= 0 && p < 1, "GPT-2 config: dropout ", p, " must be in [0, 1)");
}

}  // namespace mw::gpt2
