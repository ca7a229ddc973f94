// llm.c token shards (the .bin files of llm.c's dev/data scripts) and the batches read from them.
//
// Layout: a header of 256 little-endian int32 {20240520 (magic), 1 (version), token count, 0...},
// then token count x uint16 tokens. The file is exactly 1024 + 2 * count bytes.
//
// Note [Shard tokenizer stamp]: llm.c reads header words 0-2 only; gpt2_tokenize writes its
// tokenizer into words 3-6: {kShardTokenizerTag, vocab size, fingerprint low, fingerprint high}
// (BpeTokenizer::fingerprint: what every id means). Ids are meaningless without the tokenizer
// that made them, and nothing else tells shards of a learned 8192-token vocabulary from GPT-2's:
// fine-tuning GPT-2 on them (every id < 50257, so no range check fails) trained it on noise.
// gpt2_train compares the stamps of its shards with each other and with its tokenizer
// (train/token_stream.h). Shards without the stamp (llm.c's, older ones) are read as before.
//
// Invariants:
// - The header is validated on open: magic, version, a positive count, and the file size; each
//   failure is a FormatError naming the file, what was expected and what was found.
// - batch(step, B, T) fills row r with tokens [(step*B + r)*T, (step*B + r + 1)*T), each index
// taken
//   modulo num_tokens(), so the stream wraps at the end. The rows of one step are contiguous, so a
//   batch is one range of B*T tokens that wraps as often as needed (a shard shorter than B*T is
//   legal). Index arithmetic is done in 128 bits, so no step can overflow.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/file_io.h"

namespace mw::data {

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int32_t kTokenShardVersion = 1;
inline constexpr int64_t kTokenShardHeaderBytes = 256 * 4;
inline constexpr int32_t kShardTokenizerTag = 0x6B6F546D;  // "mTok" (Note [Shard tokenizer stamp])

// The tokenizer a shard's ids come from (Note [Shard tokenizer stamp]).
struct ShardTokenizer {
  int64_t vocab_size = 0;
  uint64_t fingerprint = 0;
  bool operator==(const ShardTokenizer&) const = default;
};

class TokenShard {
 public:
  // `open_hint` ends the message when the file cannot be opened (which option to correct).
  explicit TokenShard(const std::string& path,
                      const std::string& open_hint = "pass --data a path to an llm.c .bin shard");

  int64_t num_tokens() const { return num_tokens_; }
  const std::string& path() const { return file_.path(); }
  // The stamp of the tokenizer that wrote it; nullopt for shards without one.
  const std::optional<ShardTokenizer>& tokenizer() const { return tokenizer_; }
  // out holds B*T int32, row-major [B, T]. InvalidArgument for step < 0, B < 1 or T < 1.
  void batch(int64_t step, int64_t B, int64_t T, int32_t* out) const;
  // Tokens [first, first + count) into out; InvalidArgument unless 0 <= first and
  // first + count <= num_tokens() (callers wrap; train/token_stream.h spans several shards).
  void read(int64_t first, int64_t count, int32_t* out) const;
  // Largest token id in the shard (reads the whole file once, 1 MiB at a time).
  int32_t max_token() const;
  // FormatError naming the file, the first offending token and its index when any token is
  // >= vocab_size ("the shard was tokenized for another vocabulary").
  void check_vocab(int64_t vocab_size) const;

 private:
  ReadOnlyFile file_;
  int64_t num_tokens_ = 0;
  std::optional<ShardTokenizer> tokenizer_;
};

// Writes a version-1 shard (atomically, file_io.h), stamped with `tokenizer` when given.
// InvalidArgument for an empty token list.
void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens,
                       const std::optional<ShardTokenizer>& tokenizer = std::nullopt);

// Streams tokens into shards DIR/SPLIT_000000.bin, DIR/SPLIT_000001.bin, ... of at most
// max_tokens_per_shard tokens each (llm.c's naming). Holds at most one shard's tokens in memory; a
// shard is written (atomically) when full, and the last, partial one by finish(). A split that
// received no token writes no file.
// Note [Unfinished corpus]: gpt2_tokenize writes this file into --out before the first shard and
// removes it after the last (and the tokenizer's files): shards beside it are a run still writing
// or one killed (kill -9, out of memory) half-way, which trained without a word until session 39.
// gpt2_train refuses a --data or --val-data directory that holds it.
inline constexpr const char* kUnfinishedMarker = ".gpt2_tokenize-unfinished";

class TokenShardWriter {
 public:
  TokenShardWriter(std::string dir, std::string split, int64_t max_tokens_per_shard,
                   std::optional<ShardTokenizer> tokenizer = std::nullopt);
  // InvalidArgument for an id outside [0, 65535]: llm.c shards hold uint16 tokens.
  void add(const int32_t* ids, int64_t count);
  void finish();

  int64_t num_tokens() const { return num_tokens_; }
  const std::vector<std::string>& paths() const { return paths_; }  // the shards written so far

 private:
  void flush();

  std::string dir_, split_;
  int64_t max_tokens_per_shard_;
  std::vector<uint16_t> pending_;
  std::vector<std::string> paths_;
  int64_t num_tokens_ = 0;
  std::optional<ShardTokenizer> tokenizer_;
};

}  // namespace mw::data
