// A GPT-2 folder that gpt2_generate can run on text: the tiny preset with the vocabulary of the
// fixture tokenizer (tests/fixtures/bpe, 588 ids), seeded weights, and that tokenizer's
// vocab.json + merges.txt beside them. tests/fixtures/gpt2_tiny has no tokenizer.
#pragma once

#include <filesystem>
#include <string>

#include "../data/temp_dir.h"
#include "data/bpe.h"
#include "models/gpt2/hf_io.h"

namespace mw::gpt2::testing {

inline std::string fixture_bpe_dir() { return std::string(MW_SOURCE_DIR) + "/tests/fixtures/bpe/"; }

inline data::BpeTokenizer fixture_tokenizer() {
  const std::string bpe = fixture_bpe_dir();
  return data::BpeTokenizer(data::load_vocab_and_merges(bpe + "vocab.json", bpe + "merges.txt"),
                            "bpe");
}

// The model (in eval mode), also saved with the tokenizer's files into `dir`.
struct TextModel {
  data::BpeTokenizer tokenizer = fixture_tokenizer();
  GPT2 model;
  TextModel(const data::testing::TempDir& dir, uint64_t seed) : model(config(tokenizer), seed) {
    model.eval();
    save_hf(model, dir.path());
    std::filesystem::copy_file(fixture_bpe_dir() + "vocab.json", dir.file("vocab.json"));
    std::filesystem::copy_file(fixture_bpe_dir() + "merges.txt", dir.file("merges.txt"));
  }

 private:
  static Config config(const data::BpeTokenizer& tok) {
    Config c = Config::preset("tiny");
    c.vocab_size = tok.vocab_size();
    c.set_dropout(0);
    return c;
  }
};

}  // namespace mw::gpt2::testing
