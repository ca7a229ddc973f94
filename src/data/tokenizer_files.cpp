// Finding and loading a model's tokenizer files (tokenizer_files.h).
#include "data/tokenizer_files.h"

#include <filesystem>

#include "core/error.h"
#include "data/file_io.h"

namespace mw::data {

std::vector<std::pair<std::string, std::string>> read_tokenizer_files(const TokenizerFiles& files) {
  const char* hint = "pass the tokenizer's files (--vocab/--merges or --tokenizer)";
  std::vector<std::pair<std::string, std::string>> out;
  if (!files.tokenizer_json.empty())
    out.emplace_back("tokenizer.json",
                     read_text_file(files.tokenizer_json, "tokenizer.json", hint));
  if (!files.vocab_json.empty()) {
    out.emplace_back("vocab.json", read_text_file(files.vocab_json, "vocab.json", hint));
    out.emplace_back("merges.txt", read_text_file(files.merges_txt, "merges.txt", hint));
  }
  for (const std::string& path : files.companions) {
    const std::string name = std::filesystem::path(path).filename().string();
    out.emplace_back(name, read_text_file(path, name.c_str(), hint));
  }
  return out;
}

TokenizerFiles find_tokenizer_files(const std::string& vocab_json, const std::string& merges_txt,
                                    const std::string& tokenizer_json,
                                    const std::string& model_dir) {
  namespace fs = std::filesystem;
  MW_CHECK_T(InvalidArgument, vocab_json.empty() == merges_txt.empty(),
             "--vocab and --merges go together (HF's vocab.json and merges.txt); got only --",
             vocab_json.empty() ? "merges" : "vocab");
  MW_CHECK_T(InvalidArgument, vocab_json.empty() || tokenizer_json.empty(),
             "--tokenizer and --vocab/--merges both name a tokenizer: pass one of them");
  TokenizerFiles f;
  if (!vocab_json.empty() || !tokenizer_json.empty()) {
    f.vocab_json = vocab_json, f.merges_txt = merges_txt, f.tokenizer_json = tokenizer_json;
    return f;
  }
  if (model_dir.empty()) return f;
  std::error_code ec;
  const std::string dir = model_dir + "/";
  // Note [A model folder's tokenizer]: all of them; load_tokenizer prefers tokenizer.json.
  if (fs::is_regular_file(dir + "tokenizer.json", ec)) f.tokenizer_json = dir + "tokenizer.json";
  if (fs::is_regular_file(dir + "vocab.json", ec) && fs::is_regular_file(dir + "merges.txt", ec)) {
    f.vocab_json = dir + "vocab.json";
    f.merges_txt = dir + "merges.txt";
  }
  if (!f.known()) return f;
  if (fs::is_regular_file(dir + "added_tokens.json", ec))
    f.added_tokens_json = dir + "added_tokens.json";
  for (const char* name : kTokenizerCompanions)
    if (fs::is_regular_file(dir + name, ec)) f.companions.push_back(dir + name);
  return f;
}

std::unique_ptr<BpeTokenizer> load_tokenizer(const TokenizerFiles& files) {
  if (!files.tokenizer_json.empty())
    return std::make_unique<BpeTokenizer>(load_tokenizer_json(files.tokenizer_json),
                                          files.tokenizer_json);
  if (files.vocab_json.empty()) return nullptr;
  BpeModel model = load_vocab_and_merges(files.vocab_json, files.merges_txt);
  if (!files.added_tokens_json.empty()) add_added_tokens_json(model, files.added_tokens_json);
  return std::make_unique<BpeTokenizer>(model, files.vocab_json);
}

std::string other_than_models_tokenizer(const BpeTokenizer& given, const std::string& model_dir) {
  if (model_dir.empty()) return "";
  const TokenizerFiles own = find_tokenizer_files("", "", "", model_dir);
  if (!own.known()) return "";
  const std::unique_ptr<BpeTokenizer> theirs = load_tokenizer(own);
  if (theirs->fingerprint() == given.fingerprint()) return "";
  return str("warning: the tokenizer given (", given.vocab_size(),
             " tokens) is not the one saved with the model in '", model_dir, "' (",
             theirs->vocab_size(), " tokens): its weights learned that tokenizer's ids, so each ",
             "id now means other text; leave out --vocab/--merges/--tokenizer to use the model's");
}

}  // namespace mw::data
