// A model folder's generation_config.json as gpt2_generate's defaults (Note [Generation defaults]).
//
// Note [Generation defaults]: transformers' generate() takes its settings from the folder's
// generation_config.json, so a fine-tune that ships {"do_sample": true, "top_k": 40,
// "repetition_penalty": 1.2} samples that way there; until session 38 gpt2_generate ignored the
// file. Now what the file says is the default, and a command-line option overrides it:
//  - do_sample false: greedy (--temperature 0); true: sampling with the file's temperature, top_k
//    and top_p, or transformers' own defaults for the ones it leaves out (1.0, 50, 1.0);
//  - do_sample absent: transformers would be greedy and ignore the sampling keys; memwall keeps its
//    own defaults (sampling at T = 1 over all tokens), so that a stock GPT-2 folder, whose file
//    holds only token ids, samples as before;
//  - repetition_penalty and max_new_tokens apply either way (they do in greedy decoding too);
//  - eos_token_id (an id or a list), when given, is where generation stops instead of
//    config.json's (transformers' generate takes the generation config's).
// A key of the wrong type is refused naming the file and the key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mw::gpt2 {

struct GenerationDefaults {
  std::optional<double> temperature, top_p, repetition_penalty;
  std::optional<int64_t> top_k, max_new_tokens;
  std::optional<std::vector<int64_t>> eos_token_ids;
  std::string said;  // what was taken, "do_sample false (greedy), max_new_tokens 40"; "" if none
};

// From DIR/generation_config.json; nothing when the file is absent.
GenerationDefaults read_generation_defaults(const std::string& dir);

}  // namespace mw::gpt2
