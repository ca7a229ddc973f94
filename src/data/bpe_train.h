// Learning byte-level BPE merges from a corpus (GPT-2's vocabulary construction), for users
// without GPT-2's vocab.json/merges.txt.
//
// Invariants:
// - Training sees the corpus as the pre-tokenizer's pieces (pretokenize.h) with their counts, so
//   merges never cross a piece boundary, as in GPT-2 and HF tokenizers.
// - The vocabulary is GPT-2's layout: ids 0..255 the byte tokens in bytes_to_unicode() order ("!"
//   is 0), then one token per merge in merge order, then "<|endoftext|>" as the last id.
// - Each step merges the most frequent adjacent pair (summed over pieces, weighted by counts); ties
//   go to the pair of smallest (left id, right id), so training is deterministic. Training stops
//   at vocab_size tokens or when no pair occurs at least min_pair_count times.
// - Memory is one entry per distinct piece (not per occurrence), and per pair one entry per word
//   holding it: a corpus of many GB with a natural vocabulary holds a few million distinct
//   pieces. (Until session 40 every occurrence of every pair of every rewritten word added an
//   entry: 120 KB of unpunctuated CJK text, one piece per paragraph, took 736 MB; now 17 MB.)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

#include "data/bpe.h"

namespace mw::data {

class BpeTrainer {
 public:
  // Counts the pieces of `text` (call once per document or chunk; see Note [Chunk boundaries]).
  void add_text(std::string_view text);
  int64_t num_distinct_pieces() const { return static_cast<int64_t>(piece_counts_.size()); }

  // vocab_size counts the 256 byte tokens and "<|endoftext|>": InvalidArgument outside
  // [257, 65536] (65536: llm.c shards hold uint16 ids).
  BpeModel train(int64_t vocab_size, int64_t min_pair_count = 2) const;

 private:
  std::unordered_map<std::string, int64_t> piece_counts_;
};

}  // namespace mw::data
