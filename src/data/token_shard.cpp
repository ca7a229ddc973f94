// llm.c token shard reader and writer. See token_shard.h for the layout and invariants.
#include "data/token_shard.h"

#include <algorithm>
#include <bit>
#include <cstdio>

#include "core/error.h"

namespace mw::data {

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian; a big-endian host would need byte swaps");

namespace {
constexpr int64_t kScanChunkTokens = int64_t{1} << 19;  // 1 MiB of uint16 per read

// What to do with a file that is not a shard: text (no NUL byte where a shard's header and uint16
// ids have many) is the corpus itself, passed before tokenizing it.
std::string not_a_shard_hint(const ReadOnlyFile& file) {
  std::string head(static_cast<size_t>(std::min(file.size_bytes(), kTokenShardHeaderBytes)), '\0');
  file.read_exact(head.data(), static_cast<int64_t>(head.size()), 0);
  if (head.empty() || head.find('\0') != std::string::npos) return "";
  return "; it looks like text: tokenize it into shards first, e.g. gpt2_tokenize --train-bpe 8192 "
         "--out DIR FILE (or with GPT-2's --vocab/--merges), then pass --data DIR";
}
}  // namespace

TokenShard::TokenShard(const std::string& path, const std::string& open_hint)
    : file_(path, "token shard", open_hint) {
  auto fail = [&](const std::string& problem) {
    return FormatError(str("token shard '", path, "': ", problem));
  };
  const int64_t file_bytes = file_.size_bytes();
  if (file_bytes < kTokenShardHeaderBytes) {
    throw fail(str("the file is ", file_bytes, " bytes, shorter than the ", kTokenShardHeaderBytes,
                   "-byte header of an llm.c shard (truncated, or not a shard)",
                   not_a_shard_hint(file_)));
  }
  int32_t header[256];
  file_.read_exact(header, kTokenShardHeaderBytes, 0);
  if (header[0] != kTokenShardMagic) {
    throw fail(str("magic number is ", header[0], ", expected ", kTokenShardMagic,
                   ": not an llm.c token shard", not_a_shard_hint(file_)));
  }
  if (header[1] != kTokenShardVersion) {
    throw fail(str("version is ", header[1], ", expected ", kTokenShardVersion,
                   " (uint16 GPT-2 tokens)",
                   header[1] == 2 ? "; version 2 shards hold uint32 llama-3 tokens" : ""));
  }
  const int64_t count = header[2];
  if (count <= 0) {
    throw fail(str("header says it holds ", count, " tokens; a shard needs at least one"));
  }
  const int64_t expected_bytes = kTokenShardHeaderBytes + 2 * count;
  if (file_bytes < expected_bytes) {
    throw fail(str("header says ", count, " tokens, so the file should be ", expected_bytes,
                   " bytes, but it is ", file_bytes, " bytes: the file is truncated (",
                   (file_bytes - kTokenShardHeaderBytes) / 2, " tokens present)"));
  }
  if (file_bytes > expected_bytes) {
    throw fail(str("header says ", count, " tokens, so the file should be ", expected_bytes,
                   " bytes, but it is ", file_bytes, " bytes (", file_bytes - expected_bytes,
                   " bytes too many): the header or the file is corrupt"));
  }
  num_tokens_ = count;
  if (header[3] == kShardTokenizerTag && header[4] > 0)
    tokenizer_ = ShardTokenizer{header[4],
                                static_cast<uint64_t>(static_cast<uint32_t>(header[5])) |
                                    static_cast<uint64_t>(static_cast<uint32_t>(header[6])) << 32};
}

void TokenShard::batch(int64_t step, int64_t B, int64_t T, int32_t* out) const {
  MW_CHECK_T(InvalidArgument, step >= 0 && B >= 1 && T >= 1, "token batch needs step >= 0, B >= 1",
             " and T >= 1; got step ", step, ", B ", B, ", T ", T);
  const int64_t total = B * T;  // callers allocate B*T int32, so this fits
  const unsigned __int128 first = static_cast<unsigned __int128>(step) *
                                  static_cast<unsigned __int128>(B) *
                                  static_cast<unsigned __int128>(T);
  int64_t pos = static_cast<int64_t>(first % static_cast<unsigned __int128>(num_tokens_));
  std::vector<uint16_t> scratch(static_cast<size_t>(std::min(total, kScanChunkTokens)));
  int64_t filled = 0;
  while (filled < total) {
    const int64_t n =
        std::min({total - filled, num_tokens_ - pos, static_cast<int64_t>(scratch.size())});
    file_.read_exact(scratch.data(), 2 * n, kTokenShardHeaderBytes + 2 * pos);
    for (int64_t i = 0; i < n; ++i) out[filled + i] = scratch[i];
    filled += n;
    pos += n;
    if (pos == num_tokens_) pos = 0;
  }
}

void TokenShard::read(int64_t first, int64_t count, int32_t* out) const {
  MW_CHECK_T(InvalidArgument, first >= 0 && count >= 0 && count <= num_tokens_ - first,
             "token shard '", path(), "': tokens [", first, ", ", first + count,
             ") requested; the shard holds ", num_tokens_);
  std::vector<uint16_t> scratch(static_cast<size_t>(std::min(count, kScanChunkTokens)));
  for (int64_t done = 0; done < count;) {
    const int64_t n = std::min(count - done, static_cast<int64_t>(scratch.size()));
    file_.read_exact(scratch.data(), 2 * n, kTokenShardHeaderBytes + 2 * (first + done));
    for (int64_t i = 0; i < n; ++i) out[done + i] = scratch[i];
    done += n;
  }
}

int32_t TokenShard::max_token() const {
  std::vector<uint16_t> chunk(static_cast<size_t>(std::min(num_tokens_, kScanChunkTokens)));
  uint16_t max_id = 0;
  for (int64_t pos = 0; pos < num_tokens_; pos += kScanChunkTokens) {
    const int64_t n = std::min(num_tokens_ - pos, kScanChunkTokens);
    file_.read_exact(chunk.data(), 2 * n, kTokenShardHeaderBytes + 2 * pos);
    max_id = std::max(max_id, *std::max_element(chunk.begin(), chunk.begin() + n));
  }
  return max_id;
}

void TokenShard::check_vocab(int64_t vocab_size) const {
  MW_CHECK_T(InvalidArgument, vocab_size >= 1, "check_vocab needs vocab_size >= 1, got ",
             vocab_size);
  std::vector<uint16_t> chunk(static_cast<size_t>(std::min(num_tokens_, kScanChunkTokens)));
  for (int64_t pos = 0; pos < num_tokens_; pos += kScanChunkTokens) {
    const int64_t n = std::min(num_tokens_ - pos, kScanChunkTokens);
    file_.read_exact(chunk.data(), 2 * n, kTokenShardHeaderBytes + 2 * pos);
    for (int64_t i = 0; i < n; ++i) {
      if (chunk[i] >= vocab_size) {
        // A stamped shard names its vocabulary (Note [Shard tokenizer stamp]): a new model sized
        // for it trains on the shard.
        const std::string sized =
            tokenizer_ && tokenizer_->vocab_size > vocab_size
                ? str("; its header names a tokenizer of ", tokenizer_->vocab_size,
                      " tokens: a new model needs --vocab-size ", tokenizer_->vocab_size)
                : "";
        throw FormatError(str("token shard '", path(), "': token ", chunk[i], " at index ", pos + i,
                              " is >= the model's vocab_size ", vocab_size,
                              ": the shard was tokenized for another vocabulary", sized));
      }
    }
  }
}

void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens,
                       const std::optional<ShardTokenizer>& tokenizer) {
  MW_CHECK_T(InvalidArgument, !tokens.empty(), "write_token_shard: '", path,
             "' would hold no tokens; a shard needs at least one");
  MW_CHECK_T(InvalidArgument, tokens.size() <= static_cast<size_t>(INT32_MAX),
             "write_token_shard: ", tokens.size(),
             " tokens do not fit the int32 count of the llm.c header; split them into shards");
  int32_t header[256] = {};
  header[0] = kTokenShardMagic;
  header[1] = kTokenShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  if (tokenizer) {  // Note [Shard tokenizer stamp]
    header[3] = kShardTokenizerTag;
    header[4] = static_cast<int32_t>(tokenizer->vocab_size);
    header[5] = static_cast<int32_t>(static_cast<uint32_t>(tokenizer->fingerprint));
    header[6] = static_cast<int32_t>(static_cast<uint32_t>(tokenizer->fingerprint >> 32));
  }
  write_file_atomically(
      path,
      {{header, kTokenShardHeaderBytes}, {tokens.data(), static_cast<int64_t>(2 * tokens.size())}},
      "pass a writable path for the token shard");
}

TokenShardWriter::TokenShardWriter(std::string dir, std::string split, int64_t max_tokens_per_shard,
                                   std::optional<ShardTokenizer> tokenizer)
    : dir_(std::move(dir)),
      split_(std::move(split)),
      max_tokens_per_shard_(max_tokens_per_shard),
      tokenizer_(tokenizer) {
  MW_CHECK_T(InvalidArgument, max_tokens_per_shard >= 1 && max_tokens_per_shard <= INT32_MAX,
             "TokenShardWriter: max_tokens_per_shard ", max_tokens_per_shard,
             " must be in [1, 2^31 - 1] (the llm.c header's int32 count)");
}

void TokenShardWriter::add(const int32_t* ids, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    MW_CHECK_T(InvalidArgument, ids[i] >= 0 && ids[i] <= UINT16_MAX, "token id ", ids[i],
               " does not fit an llm.c shard (uint16 tokens, ids 0..65535); use a vocabulary of "
               "at most 65536 tokens");
    pending_.push_back(static_cast<uint16_t>(ids[i]));
    if (static_cast<int64_t>(pending_.size()) == max_tokens_per_shard_) flush();
  }
  num_tokens_ += count;
}

void TokenShardWriter::flush() {
  if (pending_.empty()) return;
  char name[32];
  std::snprintf(name, sizeof name, "_%06zu.bin", paths_.size());
  paths_.push_back(dir_ + "/" + split_ + name);
  write_token_shard(paths_.back(), pending_, tokenizer_);
  pending_.clear();
}

void TokenShardWriter::finish() { flush(); }

}  // namespace mw::data
