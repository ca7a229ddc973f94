// A corpus tokenized into llm.c token shards DIR/{train,val}_NNNNNN.bin (apps/gpt2_tokenize.cpp).
//
// Invariants:
// - Every document is preceded by <|endoftext|> (its id found in the vocabulary by its string), as
//   in llm.c's data scripts. A literal "<|endoftext|>" in a text ends its document there (Note
//   [End-of-text markers], data/corpus.h).
// - A document goes whole to one split: to val when that brings val's share of the tokens nearer
//   val_fraction than train would (so the first document is train, and a long one does not make
//   val of most of a small corpus); the assignment is deterministic.
// - Note [One document]: a corpus of one document (one text file: a user's own book, nanoGPT's
//   shakespeare.txt) had no val split at all, since the first document is train. With
//   val_from_byte set, the document's bytes from there on (cut at the first piece boundary of Note
//   [Chunk boundaries] at or after it, so both parts tokenize as the whole does) go to val,
//   preceded by <|endoftext|> as every shard's text is: nanoGPT's 90/10 cut of one text. A text
//   file of documents separated by <|endoftext|> markers (Note [End-of-text markers], TinyStories'
//   .txt) is cut where a document starts instead, the one nearest that byte if it leaves val
//   between half and 1.5 times its share of the bytes, and each document's <|endoftext|> goes
//   with its text (until session 39 the cut fell mid-story and val's documents left their
//   <|endoftext|> tokens in train).
// - With N tokenizers, about N chunks are read ahead and encoded in parallel, each worker with its
//   own tokenizer (and cache); the shards are the same for any N.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/bpe.h"
#include "data/corpus.h"
#include "data/token_shard.h"

namespace mw::data {

// The two splits and the rule that assigns documents to them (see the invariants above).
struct ShardSplits {
  TokenShardWriter train, val;
  double val_fraction;
  int32_t eot;
  TokenShardWriter* current = &train;

  ShardSplits(const std::string& dir, int64_t shard_tokens, double val_fraction, int32_t eot,
              std::optional<ShardTokenizer> stamp = std::nullopt)
      : train(dir, "train", shard_tokens, stamp),
        val(dir, "val", shard_tokens, stamp),
        val_fraction(val_fraction),
        eot(eot) {}
  ShardSplits(const ShardSplits&) = delete;
  ShardSplits& operator=(const ShardSplits&) = delete;
  int64_t num_tokens() const { return train.num_tokens() + val.num_tokens(); }
  // `starts_val`: the rest of the one document goes to val (Note [One document]).
  void add(bool starts_document, const std::vector<int32_t>& ids, bool starts_val = false);

  int64_t val_from_byte = -1;    // Note [One document]: -1 = documents go whole
  bool val_at_document = false;  // cut where a marked document starts at or after val_from_byte
  int64_t val_cut_byte = -1;     // where the cut fell (set by tokenize_corpus)
};

// Makes `dir` (a writable directory) ready for shards; IoError if it cannot be, or if it already
// holds shards of an earlier run (they would mix with this run's).
void prepare_shard_dir(const std::string& dir);
// A name a shard split writes: train_*.bin or val_*.bin.
bool is_shard_file_name(const std::string& name);

// Reads chunks until about one chunk per worker is pending, encodes them in parallel (worker s
// encodes a contiguous slice with its own tokenizer, whose cache is not shared), then adds them to
// the splits in order; `progress(tokens)` after each batch. The ids do not depend on the number of
// workers.
void tokenize_corpus(CorpusReader& reader, std::vector<std::unique_ptr<BpeTokenizer>>& workers,
                     ShardSplits& splits, const std::function<void(int64_t tokens)>& progress);

// "train: N tokens in K shard(s) PATH (BYTES bytes)..." with a newline; past three shards the
// first two, "... (K-3 more)" and the last.
std::string split_summary(const char* name, const TokenShardWriter& w);

}  // namespace mw::data
