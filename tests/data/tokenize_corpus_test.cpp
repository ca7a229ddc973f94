// data/tokenize_corpus.h without a tokenizer: the rule that assigns whole documents to train or
// val (the first to train, then val whenever it holds less than its share), the end-of-text token
// before each document, the summary line, and the refusal of a directory that already holds
// shards.
#include "data/tokenize_corpus.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "temp_dir.h"

namespace mw::data {
namespace {

using testing::TempDir;

TEST(ShardSplits, WholeDocumentsGoToValWhileItHoldsLessThanItsShare) {
  TempDir tmp;
  ShardSplits s(tmp.path(), 1000, 0.25, 7);
  const std::vector<int32_t> four = {1, 2, 3, 4};  // a document of 5 tokens with its <eot>
  s.add(true, four);                               // 0 < 0.25 * 0: no, train
  EXPECT_EQ(s.train.num_tokens(), 5);
  s.add(true, four);  // 0 < 0.25 * 5: val
  EXPECT_EQ(s.val.num_tokens(), 5);
  s.add(false, four);  // the same document continues in val
  EXPECT_EQ(s.val.num_tokens(), 9);
  s.add(true, four);  // 9 < 0.25 * 14 is false: train
  EXPECT_EQ(s.train.num_tokens(), 10);
  s.train.finish();
  s.val.finish();
  const std::string line = split_summary("val", s.val);
  EXPECT_EQ(line.rfind("val: 9 tokens in 1 shard(s) ", 0), 0u) << line;
  EXPECT_NE(line.find("val_000000.bin ("), std::string::npos) << line;
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
