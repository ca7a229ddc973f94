// data/tokenize_corpus.h without a tokenizer: the rule that assigns whole documents to train or
// val (the split that brings val's share nearer --val-fraction), the end-of-text token before each
// document, the summary line, and the refusal of a directory that already holds shards.
#include "data/tokenize_corpus.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/corpus.h"
#include "temp_dir.h"

namespace mw::data {
namespace {

using testing::TempDir;

TEST(ShardSplits, WholeDocumentsGoWhereValsShareComesNearestItsFraction) {
  TempDir tmp;
  ShardSplits s(tmp.path(), 1000, 0.25, 7);
  const std::vector<int32_t> four = {1, 2, 3, 4};  // a document of d = 5 tokens with its <eot>
  s.add(true, four);  // to val if v + d/2 < f (t + d): 2.5 < 1.25 is false, train
  EXPECT_EQ(s.train.num_tokens(), 5);
  s.add(true, four);  // 2.5 < 2.5: train
  EXPECT_EQ(s.train.num_tokens(), 10);
  s.add(true, four);  // 2.5 < 3.75: val
  EXPECT_EQ(s.val.num_tokens(), 5);
  s.add(false, four);  // the same document continues in val
  EXPECT_EQ(s.val.num_tokens(), 9);
  s.add(true, four);  // 11.5 < 6 is false: train
  EXPECT_EQ(s.train.num_tokens(), 15);
  s.train.finish();
  s.val.finish();
  const std::string line = split_summary("val", s.val);
  EXPECT_EQ(line.rfind("val: 9 tokens in 1 shard(s) ", 0), 0u) << line;
  EXPECT_NE(line.find("val_000000.bin ("), std::string::npos) << line;
}

// A long second document stays in train: the old rule (val whenever it held less than its share
// before the document) made it val, 98.9% of a corpus at --val-fraction 0.05.
TEST(ShardSplits, ALongDocumentDoesNotMakeValOfMostOfTheCorpus) {
  TempDir tmp;
  ShardSplits s(tmp.path(), 1 << 20, 0.05, 7);
  s.add(true, std::vector<int32_t>(99, 1));
  s.add(true, std::vector<int32_t>(9999, 1));  // 5000 < 0.05 x 10100 is false: train
  for (int i = 0; i < 200; ++i) s.add(true, std::vector<int32_t>(49, 1));
  const double share = double(s.val.num_tokens()) / double(s.num_tokens());
  EXPECT_NEAR(share, 0.05, 0.005) << s.val.num_tokens() << " of " << s.num_tokens();
}

// Note [One document]: after the cut, the documents that markers start in the one text file go to
// val with their <|endoftext|> (it went to train before).
TEST(ShardSplits, TheOneFilesMarkedDocumentsAfterTheCutTakeTheirEndOfTextToVal) {
  TempDir tmp;
  ShardSplits s(tmp.path(), 1000, 0.5, 7);
  s.val_from_byte = 10;
  const std::vector<int32_t> four = {1, 2, 3, 4};
  s.add(true, four);  // the file's first document: train
  s.add(true, four);  // a marked document before the cut: train
  s.add(false, four, /*starts_val=*/true);
  s.add(true, four);  // after the cut
  EXPECT_EQ(s.train.num_tokens(), 10);
  EXPECT_EQ(s.val.num_tokens(), 10);
}

// Note [Chunk boundaries]: a cut between a whole non-space character and ASCII whitespace. Until
// session 39 only printable ASCII counted before it, so Devanagari or Chinese text had no cut at
// all (one worker per 64 MiB, and a forced cut inside a character there).
TEST(ChunkBoundaries, ACutFollowsAnyWholeCharacterThatIsNotWhitespace) {
  EXPECT_EQ(first_safe_cut("\u0915\u0915 \u0915", 0), 6u);  // after two Devanagari letters
  EXPECT_EQ(first_safe_cut("\u3002\n", 0), 3u);             // after a CJK full stop
  EXPECT_EQ(first_safe_cut("\u00e9 x", 0), 2u);
  EXPECT_EQ(first_safe_cut("ab cd", 3), std::string_view::npos);  // none at or after byte 3
  // Not after \s (U+3000 is one: the whitespace run would go on past the cut), an invalid byte or a
  // character cut short.
  EXPECT_EQ(first_safe_cut("a\u3000 b", 1), std::string_view::npos);
  EXPECT_EQ(first_safe_cut("\xe0 x", 0), std::string_view::npos);
  EXPECT_EQ(first_safe_cut("\xa4 x", 0), std::string_view::npos);
  EXPECT_EQ(first_safe_cut("\xe0\xa4 x", 0), std::string_view::npos);
}

// --shard-tokens 1 writes a shard per token: the summary names the first two and the last, not
// every one (203 paths on one line before).
TEST(ShardSplits, TheSummaryOfManyShardsNamesTheFirstTwoAndTheLast) {
  TempDir tmp;
  ShardSplits s(tmp.path(), 1, 0, 7);
  s.add(true, std::vector<int32_t>{1, 2, 3, 4, 5});  // 6 tokens with the <eot>: 6 shards
  s.train.finish();
  const std::string line = split_summary("train", s.train);
  EXPECT_EQ(line.rfind("train: 6 tokens in 6 shard(s) ", 0), 0u) << line;
  for (const char* shown :
       {"train_000000.bin (", "train_000001.bin (", "... (3 more)", "train_000005.bin ("})
    EXPECT_NE(line.find(shown), std::string::npos) << shown << " in " << line;
  for (const char* hidden : {"train_000002.bin", "train_000003.bin", "train_000004.bin"})
    EXPECT_EQ(line.find(hidden), std::string::npos) << hidden << " in " << line;
}

TEST(ShardSplits, ADirectoryHoldingShardsIsRefusedAndAMissingOneIsMade) {
  TempDir tmp;
  const std::string dir = tmp.file("out/nested");
  prepare_shard_dir(dir);
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  std::ofstream(dir + "/train_000000.bin") << "x";
  try {
    prepare_shard_dir(dir);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("already holds token shards"), std::string::npos);
  }
}

}  // namespace
}  // namespace mw::data
