// The training and validation token streams: one or many llm.c shards (data/token_shard.h) read as
// one concatenated stream, in order or shuffled by a seed, for as many epochs as the run needs.
//
// Note [Data position]: a batch is addressed by its micro-batch index i (0, 1, 2, ... over the
// whole run, K per optimizer step with --grad-accum K), never by hidden reader state, so a resumed
// run reads exactly what an uninterrupted one would from (seed, i) alone.
//  - In order: row r of batch i holds stream tokens [(i*B + r)*T, (i*B + r + 1)*T), each index
//    taken modulo the stream's length (a single shard gives TokenShard::batch's tokens).
//  - Shuffled: the stream is cut into W = floor(N / T) windows of T tokens; sequence s = i*B + r
//    belongs to epoch e = s / W and reads window perm_e[s % W], where perm_e is a Fisher-Yates
//    permutation drawn from the counter-based generator (core/random.h) with (seed, e). Every
//    window is seen once per epoch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/token_shard.h"

namespace mw::train {

// The shard files named by `spec`: a file; a directory (its `split`_*.bin, sorted, e.g. train_*);
// or a glob pattern ("data/train_*.bin"). InvalidArgument naming `option` when nothing matches.
std::vector<std::string> resolve_shards(const std::string& spec, const std::string& split,
                                        const std::string& option);

// Note [A new model's vocabulary]: a new model (no --init-from, --config or --vocab-size) takes
// the vocabulary size of the tokenizer stamped in its first --data shard (Note [Shard tokenizer
// stamp]), with <|endoftext|> its last id: gpt2_tokenize --train-bpe 8192 then gpt2_train --data
// DIR built a 50257-token model whose eos (50256) no id reached, and gpt2_generate printed ids past
// the tokenizer's as no text. A --resume with the same options does the same (its checkpoint's
// model has that vocabulary). nullopt when `spec` is empty, names
// no readable shard, or its first shard has no stamp (open_inputs reports what is wrong).
std::optional<int64_t> stamped_vocab_size(const std::string& spec);

class TokenStream {
 public:
  // shuffle_seed is used only when `shuffle`. `option` ("--val-data") is named when a shard
  // cannot be opened.
  TokenStream(const std::vector<std::string>& paths, bool shuffle, uint64_t shuffle_seed,
              const std::string& option = "--data");

  int64_t num_tokens() const { return total_tokens_; }
  int64_t num_shards() const { return static_cast<int64_t>(shards_.size()); }
  const std::vector<data::TokenShard>& shards() const { return shards_; }
  bool shuffled() const { return shuffle_; }
  // Batch i as [B, T] row-major int32 (Note [Data position]).
  void batch(int64_t index, int64_t B, int64_t T, int32_t* out);
  // The epoch (0-based) that batch `index` ends in.
  int64_t epoch_of(int64_t index, int64_t B, int64_t T) const;
  // FormatError naming the shard holding a token >= vocab_size.
  void check_vocab(int64_t vocab_size) const;
  // InvalidArgument naming `option` when the stream holds fewer than `seq` tokens: every row
  // would wrap around inside itself, training on a short text repeated.
  void check_length(int64_t seq, const std::string& option) const;

 private:
  // Stream tokens [first, first + count) with indices modulo num_tokens().
  void read_wrapped(int64_t first, int64_t count, int32_t* out) const;
  const std::vector<int64_t>& permutation(int64_t epoch, int64_t windows);

  std::vector<data::TokenShard> shards_;
  std::vector<int64_t> shard_start_;  // first stream index of each shard
  int64_t total_tokens_ = 0;
  bool shuffle_ = false;
  uint64_t seed_ = 0;
  int64_t perm_epoch_ = -1;
  std::vector<int64_t> perm_;
};

}  // namespace mw::train
