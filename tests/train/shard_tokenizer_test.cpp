// Note [Shard tokenizer stamp]: gpt2_train refuses shards whose stamps name different tokenizers,
// or another tokenizer than the run's, before the model is built; and warns when a tokenizer given
// by option replaces the one saved with the --init-from weights.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "../data/temp_dir.h"
#include "core/error.h"
#include "data/bpe.h"
#include "data/token_shard.h"
#include "train/trainer.h"
#include "trainer_fixtures.h"

namespace mw::train {
namespace {

using data::testing::expect_throw_with;
using data::testing::TempDir;

const std::string kFixture = std::string(MW_SOURCE_DIR) + "/tests/fixtures/bpe/";

// A shard of ids below 97 stamped with `fingerprint`, vocabulary `vocab`.
std::string stamped_shard(const TempDir& tmp, const std::string& name, int64_t vocab,
                          uint64_t fingerprint) {
  std::vector<uint16_t> tokens(512);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i * 31 % 97);
  data::write_token_shard(tmp.file(name), tokens, data::ShardTokenizer{vocab, fingerprint});
  return tmp.file(name);
}

uint64_t fixture_fingerprint() {
  return data::BpeTokenizer(
             data::load_vocab_and_merges(kFixture + "vocab.json", kFixture + "merges.txt"), "f")
      .fingerprint();
}

TEST(ShardTokenizer, ShardsOfTwoTokenizersAreRefused) {
  TempDir tmp;
  TrainOptions o = testing::tiny(stamped_shard(tmp, "train.bin", 97, 1), 1);
  o.val_data = stamped_shard(tmp, "val.bin", 96, 2);
  expect_throw_with<InvalidArgument>([&] { Trainer t(o, nullptr); },
                                     {"'" + o.data + "' and the --val-data shard '" + o.val_data,
                                      "different tokenizers", "97 and 96 tokens"});
  o.val_data = stamped_shard(tmp, "val2.bin", 97, 1);  // the same tokenizer: trains
  Trainer t(o, nullptr);
  EXPECT_TRUE(std::isfinite(t.train_step().loss));
}

TEST(ShardTokenizer, ShardsOfAnotherTokenizerThanTheRunsAreRefused) {
  TempDir tmp;
  TrainOptions o =
      testing::tiny(stamped_shard(tmp, "train.bin", 588, fixture_fingerprint() + 1), 1);
  o.vocab_size = 600;  // room for the fixture's 588 tokens
  o.vocab = kFixture + "vocab.json";
  o.merges = kFixture + "merges.txt";
  expect_throw_with<InvalidArgument>(
      [&] { Trainer t(o, nullptr); },
      {"was tokenized with another tokenizer", "than this run's '" + o.vocab + "'",
       "gpt2_tokenize --vocab " + o.vocab});
  o.data = stamped_shard(tmp, "ok.bin", 588, fixture_fingerprint());
  Trainer t(o, nullptr);
  EXPECT_TRUE(std::isfinite(t.train_step().loss));
  o.vocab.clear(), o.merges.clear();  // no tokenizer: nothing to compare with
  o.data = stamped_shard(tmp, "any.bin", 123, 7);
  Trainer without(o, nullptr);
}

TEST(ShardTokenizer, ATokenizerOtherThanTheModelsWarns) {
  TempDir tmp;
  TrainOptions o = testing::tiny(testing::write_shard(tmp, "train.bin", 1), 1);
  o.vocab_size = 600;
  o.vocab = kFixture + "vocab.json";
  o.merges = kFixture + "merges.txt";
  o.save = tmp.file("model");
  {
    Trainer t(o, nullptr);
    t.train_step();
    t.save_model(o.save);
  }
  TrainOptions next = testing::tiny(o.data, 1);
  next.init_from = o.save;
  std::string printed;
  {
    Trainer same(next, [&](const std::string& s) { printed += s; });
  }
  EXPECT_EQ(printed.find("is not the one saved with the model"), std::string::npos) << printed;
  next.tokenizer = kFixture + "tokenizer.json";  // the same vocabulary in another file: silent
  {
    Trainer same(next, [&](const std::string& s) { printed += s; });
  }
  EXPECT_EQ(printed.find("is not the one saved with the model"), std::string::npos) << printed;
  data::BpeModel other =
      data::load_vocab_and_merges(kFixture + "vocab.json", kFixture + "merges.txt");
  std::swap(other.vocab[0].second, other.vocab[1].second);
  data::save_vocab_and_merges(other, tmp.file("vocab.json"), tmp.file("merges.txt"));
  next.tokenizer.clear();
  next.vocab = tmp.file("vocab.json");
  next.merges = tmp.file("merges.txt");
  {
    Trainer other_run(next, [&](const std::string& s) { printed += s; });
  }
  EXPECT_NE(printed.find("is not the one saved with the model in '" + o.save + "'"),
            std::string::npos)
      << printed;
}

// Note [Tokenizer beside the shards]: a new model given no tokenizer takes the one gpt2_tokenize
// wrote beside its shards, and saves it with the model; one there of another fingerprint is not
// taken, and the run says what its save will lack.
TEST(ShardTokenizer, ANewModelTakesTheTokenizerBesideItsShards) {
  TempDir tmp;
  std::filesystem::create_directories(tmp.file("tok"));
  for (const char* name : {"vocab.json", "merges.txt"})
    std::filesystem::copy_file(kFixture + name, tmp.file("tok/") + name);
  TrainOptions o =
      testing::tiny(stamped_shard(tmp, "tok/train.bin", 588, fixture_fingerprint()), 1);
  o.vocab_size = 600;
  o.save = tmp.file("model");
  std::string printed;
  {
    Trainer t(o, [&](const std::string& s) { printed += s; });
    EXPECT_EQ(t.tokenizer_files().vocab_json, tmp.file("tok/vocab.json"));
    t.train_step();
    t.save_model(o.save);
  }
  EXPECT_NE(printed.find("Tokenizer: " + tmp.file("tok/vocab.json")), std::string::npos) << printed;
  for (const char* name : {"vocab.json", "merges.txt"})
    EXPECT_EQ(data::testing::read_bytes(tmp.file("model/") + name),
              data::testing::read_bytes(kFixture + name))
        << name;
  // Another tokenizer's files beside the shards (ids swapped): not taken, and said.
  data::BpeModel other =
      data::load_vocab_and_merges(kFixture + "vocab.json", kFixture + "merges.txt");
  std::swap(other.vocab[0].second, other.vocab[1].second);
  std::filesystem::remove(tmp.file("tok/vocab.json"));
  std::filesystem::remove(tmp.file("tok/merges.txt"));
  data::save_vocab_and_merges(other, tmp.file("tok/vocab.json"), tmp.file("tok/merges.txt"));
  printed.clear();
  Trainer t(o, [&](const std::string& s) { printed += s; });
  EXPECT_FALSE(t.tokenizer_files().known());
  EXPECT_NE(printed.find("was made by a tokenizer of 588 tokens that this run does not know"),
            std::string::npos)
      << printed;
}

}  // namespace
}  // namespace mw::train
