// Which tokenizer files a model goes with: named by options (--vocab/--merges or --tokenizer) or
// found beside the weights in an HF folder, so that gpt2_generate and gpt2_train agree, and a saved
// model folder carries the files it was trained with (gpt2_generate --model SAVED --prompt works).
//
// Note [A model folder's tokenizer]: a folder saved by transformers' save_pretrained holds
// tokenizer.json (the fast tokenizer, which AutoTokenizer loads), vocab.json + merges.txt (the
// slow one's) and its companions (tokenizer_config.json, special_tokens_map.json, and
// added_tokens.json when tokens were added). As AutoTokenizer, tokenizer.json is the tokenizer
// when the folder has one, else vocab.json + merges.txt with added_tokens.json's tokens (as
// GPT2Tokenizer); every file is carried to saves, so that transformers reads the saved folder
// as it read this one. (vocab.json + merges.txt used to win, and a fine-tune's added tokens were
// encoded as ordinary text.)
//
// Invariants: options name one kind (vocab.json + merges.txt, or tokenizer.json); the files are
// named by path and read only by load_tokenizer() and read_tokenizer_files(), which name the file
// in any error.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/bpe.h"

namespace mw::data {

// The files beside a tokenizer that transformers reads with it (Note [A model folder's tokenizer]).
inline constexpr const char* kTokenizerCompanions[] = {
    "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"};

struct TokenizerFiles {
  std::string vocab_json, merges_txt, tokenizer_json;
  std::string added_tokens_json;  // a model folder's, joined to vocab.json + merges.txt
  // A model folder's tokenizer_config.json, special_tokens_map.json, added_tokens.json: carried
  // to saves as they are (Note [A model folder's tokenizer]).
  std::vector<std::string> companions;
  bool known() const { return !tokenizer_json.empty() || !vocab_json.empty(); }
  // The file that names the tokenizer in messages: tokenizer.json, or vocab.json.
  const std::string& source() const { return tokenizer_json.empty() ? vocab_json : tokenizer_json; }
};

// The files' names in a model folder and their contents ({"vocab.json", ...}, {"merges.txt",
// ...}, {"tokenizer.json", ...}, the companions), read now so that a save does not depend on the
// files staying (a pruned checkpoint's). Empty when `files` is unknown.
std::vector<std::pair<std::string, std::string>> read_tokenizer_files(const TokenizerFiles& files);

// The explicit files when any is given (vocab and merges must come together: InvalidArgument,
// naming `option_prefix` + "vocab"/"merges"), else those found in `model_dir` (Note [A model
// folder's tokenizer]), else none. `model_dir` may be empty.
TokenizerFiles find_tokenizer_files(const std::string& vocab_json, const std::string& merges_txt,
                                    const std::string& tokenizer_json,
                                    const std::string& model_dir);

// Loads the tokenizer (the files' own errors, naming them); nullptr when `files` is unknown.
std::unique_ptr<BpeTokenizer> load_tokenizer(const TokenizerFiles& files);

// When `given` (a tokenizer named by option) is not the one saved in `model_dir` (another
// fingerprint: its ids mean other text), a warning saying so, without the program's name and
// newline; "" when they agree, or the folder holds none (Note [Shard tokenizer stamp]).
std::string other_than_models_tokenizer(const BpeTokenizer& given, const std::string& model_dir);

}  // namespace mw::data
