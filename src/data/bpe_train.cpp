// BPE training: counts of adjacent pairs kept up to date incrementally. See bpe_train.h.
//
// Each distinct piece is a "word" of symbol ids with a count. pair_count holds, for every adjacent
// pair, the number of its occurrences over all words; where_ lists the words where a pair was ever
// seen, each once (stale entries are skipped). A merge rewrites only the words holding the pair
// and applies each word's difference of pairs. The most frequent pair comes from a max-heap with
// lazy updates: an entry whose count no longer matches is pushed again with the current count.
#include "data/bpe_train.h"

#include <algorithm>
#include <queue>
#include <unordered_set>

#include "core/error.h"
#include "core/interrupt.h"
#include "data/pretokenize.h"

namespace mw::data {

namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct Word {
  std::vector<int32_t> symbols;
  int64_t count;
};

struct HeapEntry {
  int64_t count;
  uint64_t pair;
  bool operator<(const HeapEntry& o) const {  // max count first, then the smallest pair
    return count != o.count ? count < o.count : pair > o.pair;
  }
};

class PairCounts {
 public:
  explicit PairCounts(std::vector<Word>& words) : words_(words) {
    for (int32_t w = 0; w < static_cast<int32_t>(words_.size()); ++w) {
      std::unordered_map<uint64_t, int64_t> occurrences;
      count_pairs(words_[w].symbols, +1, occurrences);
      for (const auto& [p, n] : occurrences) {
        count_[p] += n * words_[w].count;
        where_[p].push_back(w);  // once per word, however often the pair occurs in it
      }
    }
    for (const auto& [pair, count] : count_) heap_.push({count, pair});
  }

  // The most frequent pair and its count (count 0 when none is left). An entry whose pair's count
  // fell since it was pushed is pushed again with the count it has now (counts of pairs a merge
  // did not create only fall; those it created are pushed by merge).
  HeapEntry best() {
    while (!heap_.empty()) {
      const HeapEntry top = heap_.top();
      auto it = count_.find(top.pair);
      if (it != count_.end() && it->second == top.count) return top;
      heap_.pop();
      if (it != count_.end() && it->second < top.count) heap_.push({it->second, top.pair});
    }
    return {0, 0};
  }

  // Replaces every (a, b) in every word by merged. Each word holding it changes its pairs' counts
  // by the difference of its pairs before and after; a word joins where_ only for a pair it did
  // not hold, and only pairs whose count rose are pushed. (Subtracting and re-adding every pair
  // of every such word, each occurrence a where_ entry and each pair a heap entry, held 50 M
  // entries after 700 merges of 120 KB of unpunctuated CJK text: one piece per paragraph.)
  void merge(uint64_t pair, int32_t merged) {
    const int32_t a = static_cast<int32_t>(pair >> 32), b = static_cast<int32_t>(pair & 0xFFFFFFFF);
    std::vector<int32_t> holders = std::move(where_[pair]);
    where_.erase(pair);
    std::sort(holders.begin(), holders.end());
    holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
    std::unordered_set<uint64_t> rose;
    std::unordered_map<uint64_t, int64_t> before, delta;
    for (int32_t w : holders) {
      std::vector<int32_t>& s = words_[w].symbols;
      bool found = false;
      for (size_t i = 0; i + 1 < s.size() && !found; ++i) found = s[i] == a && s[i + 1] == b;
      if (!found) continue;
      before.clear(), delta.clear();
      count_pairs(s, +1, before);
      count_pairs(s, -1, delta);
      size_t out = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          s[out++] = merged;
          ++i;
        } else {
          s[out++] = s[i];
        }
      }
      s.resize(out);
      count_pairs(s, +1, delta);
      for (const auto& [p, d] : delta) {
        if (d == 0) continue;
        int64_t& c = count_[p];
        c += d * words_[w].count;
        if (c == 0) count_.erase(p);
        if (d > 0) rose.insert(p);
        if (d > 0 && !before.count(p)) where_[p].push_back(w);
      }
    }
    for (uint64_t p : rose) {
      auto it = count_.find(p);
      if (it != count_.end()) heap_.push({it->second, p});
    }
  }

 private:
  static void count_pairs(const std::vector<int32_t>& s, int64_t sign,
                          std::unordered_map<uint64_t, int64_t>& into) {
    for (size_t i = 0; i + 1 < s.size(); ++i) into[pair_key(s[i], s[i + 1])] += sign;
  }

  std::vector<Word>& words_;
  std::unordered_map<uint64_t, int64_t> count_;
  std::unordered_map<uint64_t, std::vector<int32_t>> where_;
  std::priority_queue<HeapEntry> heap_;
};

}  // namespace

void BpeTrainer::add_text(std::string_view text) {
  Pretokenizer pieces(text);
  for (std::string_view piece; pieces.next(piece);) {
    auto it = piece_counts_.find(std::string(piece));
    if (it == piece_counts_.end())
      piece_counts_.emplace(std::string(piece), 1);
    else
      ++it->second;
  }
}

BpeModel BpeTrainer::train(int64_t vocab_size, int64_t min_pair_count) const {
  MW_CHECK_T(InvalidArgument, vocab_size >= 257 && vocab_size <= 65536, "BPE vocab size ",
             vocab_size,
             " must be in [257, 65536]: 256 byte tokens + <|endoftext|> at least, and ids that "
             "fit the uint16 tokens of llm.c shards");
  MW_CHECK_T(InvalidArgument, min_pair_count >= 1, "min_pair_count must be >= 1");
  // The byte tokens in bytes_to_unicode() order, which is the order of their code points.
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(byte_to_token_char(static_cast<uint8_t>(b)));
  std::vector<uint8_t> bytes_in_order(256);
  for (int b = 0; b < 256; ++b) bytes_in_order[b] = static_cast<uint8_t>(b);
  std::sort(bytes_in_order.begin(), bytes_in_order.end(), [&](uint8_t x, uint8_t y) {
    return decode_utf8(tokens[x], 0).code_point < decode_utf8(tokens[y], 0).code_point;
  });
  std::vector<int32_t> id_of_byte(256);
  BpeModel model;
  std::unordered_map<std::string, int32_t> id_of_token;
  for (int32_t id = 0; id < 256; ++id) {
    id_of_byte[bytes_in_order[id]] = id;
    model.vocab.emplace_back(tokens[bytes_in_order[id]], id);
    id_of_token[tokens[bytes_in_order[id]]] = id;
  }
  // Words in a fixed order (sorted pieces), so training does not depend on hash order.
  std::vector<std::pair<std::string, int64_t>> pieces(piece_counts_.begin(), piece_counts_.end());
  std::sort(pieces.begin(), pieces.end());
  std::vector<Word> words;
  for (const auto& [piece, count] : pieces) {
    Word w{{}, count};
    for (char c : piece) w.symbols.push_back(id_of_byte[static_cast<uint8_t>(c)]);
    words.push_back(std::move(w));
  }
  PairCounts counts(words);
  while (static_cast<int64_t>(model.vocab.size()) < vocab_size - 1) {
    throw_if_stop_requested("training the BPE merges");  // between merges
    const HeapEntry best = counts.best();
    if (best.count < min_pair_count) break;
    const auto& left = model.vocab[best.pair >> 32].first;
    const auto& right = model.vocab[best.pair & 0xFFFFFFFF].first;
    model.merges.emplace_back(left, right);
    const std::string merged = left + right;
    // The same string reached by another merge path keeps its first id.
    auto [it, inserted] = id_of_token.emplace(merged, static_cast<int32_t>(model.vocab.size()));
    if (inserted) model.vocab.emplace_back(merged, it->second);
    counts.merge(best.pair, it->second);
  }
  model.vocab.emplace_back(kEndOfText, static_cast<int32_t>(model.vocab.size()));
  return model;
}

}  // namespace mw::data
