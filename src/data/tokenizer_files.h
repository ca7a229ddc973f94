// Which tokenizer files a model goes with: named by options (--vocab/--merges or --tokenizer) or
// found beside the weights in an HF folder, so that gpt2_generate and gpt2_train agree, and a saved
// model folder carries the files it was trained with (gpt2_generate --model SAVED --prompt works).
//
// Invariants: at most one kind is set (vocab.json + merges.txt, or tokenizer.json); the files are
// named by path and read only by load_tokenizer() and copy_tokenizer_files(), which name the file
// in any error.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/bpe.h"

namespace mw::data {

struct TokenizerFiles {
  std::string vocab_json, merges_txt, tokenizer_json;
  bool known() const { return !tokenizer_json.empty() || !vocab_json.empty(); }
  // The file that names the tokenizer in messages: tokenizer.json, or vocab.json.
  const std::string& source() const { return tokenizer_json.empty() ? vocab_json : tokenizer_json; }
};

// The files' names in a model folder and their contents ({"vocab.json", ...}, {"merges.txt",
// ...}, or {"tokenizer.json", ...}), read now so that a save does not depend on the files staying
// (a pruned checkpoint's). Empty when `files` is unknown.
std::vector<std::pair<std::string, std::string>> read_tokenizer_files(const TokenizerFiles& files);

// The explicit files when any is given (vocab and merges must come together: InvalidArgument,
// naming `option_prefix` + "vocab"/"merges"), else those found in `model_dir` (vocab.json +
// merges.txt first, then tokenizer.json), else none. `model_dir` may be empty.
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
