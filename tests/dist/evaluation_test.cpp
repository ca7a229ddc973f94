// Note [Evaluation windows] (train/sample.cpp) under data parallel: each rank scores its own rows
// of every validation batch and the ranks add their sums, so the mean is one process's and no
// rank ever holds the logits of the global batch.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "dist_train.h"

namespace mw::testing::dist_train {
namespace {

using data::testing::TempDir;

// The validation loss of the log's evaluation lines.
std::vector<double> val_losses(const std::string& log_path) {
  std::vector<double> out;
  std::ifstream in(log_path);
  for (std::string line; std::getline(in, line);) {
    const json::Value v = json::parse(line, log_path);
    if (v.contains("val_loss")) out.push_back(v.at("val_loss").as_double());
  }
  return out;
}

struct EvalCase {
  const char* name;
  const char* options;
};

class DataParallelEvaluation : public ::testing::TestWithParam<EvalCase> {};

// A vocabulary of 4096 makes the logits most of the memory: 8 rows x 64 x 4096 x 4 B = 8 MiB for
// the global batch, 4 MiB for a rank's half. Training at 2 ranks peaks at 6 MiB of the sim device;
// scoring the global batch on every rank (as before session 39) needed more than the 8 MiB given
// and stopped with "out of memory" at the first evaluation. The 9 windows make a last batch of
// one row: rank 1 has none and still joins the forward's gathers under ZeRO 3 and Gemini's
// sharded chunks (a rank that skipped that forward failed these two cases, as it should).
TEST_P(DataParallelEvaluation, EachRankScoresItsOwnRowsAndTheMeanIsOneProcesss) {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  std::vector<uint16_t> tokens(64 * 9 + 7);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 131) % 4096);
  data::write_token_shard(tmp.path() + "/val_000000.bin", tokens);
  const std::string args =
      "--n-layer 1 --n-embd 32 --n-head 2 --vocab-size 4096 --seq 64 --batch 8 --steps 2 "
      "--dropout 0 --threads 1 --bucket-mb 0.05 --val-data " +
      tmp.path() + " --eval-every 1 --eval-batches 2 " + GetParam().options;
  AppResult one = train(0, args + " --device sim:64MiB --log " + tmp.path() + "/one.jsonl");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  AppResult two = train(2, args + " --device sim:8MiB --log " + tmp.path() + "/two.jsonl");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const auto a = val_losses(tmp.path() + "/one.jsonl"), b = val_losses(tmp.path() + "/two.jsonl");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  // The same windows summed in another order (two halves of each batch, then the ranks' sums):
  // a few f32 ulps of a loss of ~8.3; kLossTol is 1e-5.
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], kLossTol) << "evaluation " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Stages, DataParallelEvaluation,
    ::testing::Values(EvalCase{"Zero0", "--zero 0"}, EvalCase{"Zero3", "--zero 3"},
                      EvalCase{"GeminiZero3", "--zero 3 --gemini auto --chunk-size 4096"}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace mw::testing::dist_train
