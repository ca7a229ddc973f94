// Tests of llm.c token shards (src/data/token_shard.h): batches against a plain reference of the
// wrapping rule, the byte layout llm.c writes, and FormatError/IoError for every bad file.
#include "data/token_shard.h"

#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "temp_dir.h"

namespace mw::data {
namespace {

using testing::expect_throw_with;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

// The rule of issue 2, written as plainly as possible: row r of step s takes tokens
// [(s*B + r)*T, (s*B + r + 1)*T), each index modulo the token count.
std::vector<int32_t> reference_batch(const std::vector<uint16_t>& tokens, int64_t s, int64_t B,
                                     int64_t T) {
  std::vector<int32_t> out;
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t t = (s * B + r) * T; t < (s * B + r + 1) * T; ++t) out.push_back(tokens[t % n]);
  }
  return out;
}

void expect_tokens_equal(const std::vector<int32_t>& expected, const std::vector<int32_t>& got,
                         const std::string& label) {
  ASSERT_EQ(expected.size(), got.size()) << label;
  int shown = 0;
  for (size_t i = 0; i < expected.size() && shown < 5; ++i) {
    if (expected[i] != got[i]) {
      ADD_FAILURE() << label << " [" << i << "]: expected " << expected[i] << ", got " << got[i];
      ++shown;
    }
  }
}

std::vector<uint16_t> make_tokens(int64_t n) {
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<uint16_t>((i * 7919 + 13) % 50257);
  return tokens;
}

TEST(TokenShard, ByteLayoutMatchesLlmC) {
  TempDir dir;
  const std::string path = dir.file("tiny.bin");
  write_token_shard(path, {50256, 1, 65535});
  const std::string bytes = read_bytes(path);
  ASSERT_EQ(bytes.size(), 1024u + 6u);
  int32_t header[256];
  std::memcpy(header, bytes.data(), 1024);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 3);
  for (int i = 3; i < 256; ++i) ASSERT_EQ(header[i], 0) << "header[" << i << "]";
  uint16_t tokens[3];
  std::memcpy(tokens, bytes.data() + 1024, 6);
  EXPECT_EQ(tokens[0], 50256);
  EXPECT_EQ(tokens[1], 1);
  EXPECT_EQ(tokens[2], 65535);
}

// Note [Shard tokenizer stamp]: words 3-6 of the header name the tokenizer; llm.c's words 0-2 and
// the file's size are as without it, and a shard without the stamp reads as none.
TEST(TokenShard, TheTokenizerStampRoundTripsBesideLlmCsHeader) {
  TempDir dir;
  const ShardTokenizer stamp{50257, 0xF00DCAFE12345678ULL};
  write_token_shard(dir.file("a.bin"), {50256, 1, 65535}, stamp);
  const std::string bytes = read_bytes(dir.file("a.bin"));
  ASSERT_EQ(bytes.size(), 1024u + 6u);
  int32_t header[256];
  std::memcpy(header, bytes.data(), 1024);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 3);
  EXPECT_EQ(header[3], kShardTokenizerTag);
  for (int i = 7; i < 256; ++i) ASSERT_EQ(header[i], 0) << "header[" << i << "]";
  const TokenShard stamped(dir.file("a.bin"));
  ASSERT_TRUE(stamped.tokenizer().has_value());
  EXPECT_EQ(*stamped.tokenizer(), stamp);
  EXPECT_EQ(stamped.num_tokens(), 3);
  write_token_shard(dir.file("b.bin"), {1, 2});
  EXPECT_FALSE(TokenShard(dir.file("b.bin")).tokenizer().has_value());
}

TEST(TokenShard, BatchesMatchTheWrappingReference) {
  TempDir dir;
  for (int64_t n : {1, 7, 64, 1000, 1 << 20}) {  // 1 << 20 exceeds the 1 MiB read chunk
    const auto tokens = make_tokens(n);
    const std::string path = dir.file("shard.bin");
    write_token_shard(path, tokens);
    TokenShard shard(path);
    ASSERT_EQ(shard.num_tokens(), n);
    struct BT {
      int64_t B, T;
    };
    for (BT bt : {BT{1, 1}, BT{4, 16}, BT{3, 5}, BT{2, 1000}, BT{8, 128 * 1024}}) {
      for (int64_t step : {0, 1, 2, 5, 99, 12345}) {
        std::vector<int32_t> got(static_cast<size_t>(bt.B * bt.T), -1);
        shard.batch(step, bt.B, bt.T, got.data());
        expect_tokens_equal(reference_batch(tokens, step, bt.B, bt.T), got,
                            "n=" + std::to_string(n) + " B=" + std::to_string(bt.B) +
                                " T=" + std::to_string(bt.T) + " step=" + std::to_string(step));
      }
    }
  }
}

TEST(TokenShard, HugeStepsDoNotOverflow) {
  // step * B * T exceeds int64 here; the start index must still be (step*B*T) mod n, computed
  // exactly. n = 7: 2^3 = 1 (mod 7), so 2^62 = 2^(62 mod 3) = 4 (mod 7): step 2^60 with B*T = 4
  // starts at token 4 and wraps after token 6.
  TempDir dir;
  const auto tokens = make_tokens(7);
  const std::string path = dir.file("shard.bin");
  write_token_shard(path, tokens);
  TokenShard shard(path);
  std::vector<int32_t> got(4);
  shard.batch(int64_t{1} << 60, 2, 2, got.data());
  expect_tokens_equal({tokens[4], tokens[5], tokens[6], tokens[0]}, got, "step 2^60");
  shard.batch(INT64_MAX, 4, 1 << 20, std::vector<int32_t>(4 << 20).data());  // no UB, no throw
}

TEST(TokenShard, VocabCheckAndMaxToken) {
  TempDir dir;
  const std::string path = dir.file("shard.bin");
  std::vector<uint16_t> tokens = make_tokens(3000);
  tokens[2500] = 50300;
  write_token_shard(path, tokens);
  TokenShard shard(path);
  EXPECT_EQ(shard.max_token(), 50300);
  EXPECT_NO_THROW(shard.check_vocab(50301));
  expect_throw_with<FormatError>([&] { shard.check_vocab(50257); },
                                 {path, "token 50300 at index 2500", "vocab_size 50257"});
  // A stamped shard says which vocabulary a new model needs (was: "another vocabulary" alone).
  write_token_shard(path, tokens, ShardTokenizer{50304, 7});
  expect_throw_with<FormatError>([&] { TokenShard(path).check_vocab(97); },
                                 {"vocab_size 97", "a new model needs --vocab-size 50304"});
}

TEST(TokenShard, BadFilesAreNamedErrors) {
  TempDir dir;
  const std::string path = dir.file("bad.bin");
  auto header_bytes = [](int32_t magic, int32_t version, int32_t count) {
    int32_t h[256] = {magic, version, count};
    return std::string(reinterpret_cast<const char*>(h), 1024);
  };
  struct Case {
    const char* label;
    std::string bytes;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {"empty", "", {"is 0 bytes, shorter than the 1024-byte header"}},
      {"short header", std::string(1000, '\0'), {"is 1000 bytes"}},
      {"wrong magic",
       header_bytes(20240521, 1, 1) + "ab",
       {"magic number is 20240521, expected 20240520"}},
      {"version 2", header_bytes(20240520, 2, 1) + "abcd", {"version is 2, expected 1", "llama-3"}},
      {"zero tokens", header_bytes(20240520, 1, 0), {"holds 0 tokens"}},
      {"negative count", header_bytes(20240520, 1, -5), {"holds -5 tokens"}},
      {"truncated",
       header_bytes(20240520, 1, 10) + std::string(15, 'x'),
       {"header says 10 tokens", "should be 1044 bytes, but it is 1039", "truncated",
        "7 tokens present"}},
      {"too long",
       header_bytes(20240520, 1, 2) + std::string(6, 'x'),
       {"should be 1028 bytes, but it is 1030", "2 bytes too many"}},
      // The corpus passed before tokenizing it: named as text, with what to run.
      {"text",
       std::string(2000, 'a'),
       {"not an llm.c token shard; it looks like text", "gpt2_tokenize"}},
      {"short text",
       "In the beginning\n",
       {"shorter than the 1024-byte header", "looks like text"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    write_bytes(path, c.bytes);
    std::vector<std::string> needles = c.needles;
    needles.push_back(path);
    expect_throw_with<FormatError>([&] { TokenShard shard(path); }, needles);
  }

  const std::string missing = dir.file("missing.bin");
  try {
    TokenShard shard(missing);
    ADD_FAILURE() << "opened a missing file";
  } catch (const IoError& e) {
    EXPECT_EQ(e.err, ENOENT);
    EXPECT_EQ(e.path, missing);
    for (const char* n : {"ENOENT", "pass --data a path to an llm.c .bin shard"}) {
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  }
  expect_throw_with<IoError>([&] { TokenShard shard(dir.path()); }, {"is a directory"});
}

TEST(TokenShard, ArgumentChecks) {
  TempDir dir;
  const std::string path = dir.file("shard.bin");
  expect_throw_with<InvalidArgument>([&] { write_token_shard(path, {}); }, {"no tokens"});
  write_token_shard(path, {1, 2, 3});
  TokenShard shard(path);
  int32_t out[4];
  expect_throw_with<InvalidArgument>([&] { shard.batch(-1, 1, 1, out); }, {"step -1"});
  expect_throw_with<InvalidArgument>([&] { shard.batch(0, 0, 1, out); }, {"B 0"});
  expect_throw_with<InvalidArgument>([&] { shard.batch(0, 1, 0, out); }, {"T 0"});
}

}  // namespace
}  // namespace mw::data
