// Learning-rate schedules against values computed by hand from HF transformers' definitions (Note
// [LR schedule]), and the token streams over several shards (Note [Data position]).
#include "train/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <set>

#include "../data/temp_dir.h"
#include "core/error.h"
#include "data/token_shard.h"
#include "train/token_stream.h"

namespace mw::train {
namespace {

using data::testing::TempDir;

// The schedule is double arithmetic on a few terms; 1e-15 relative covers its rounding.
constexpr double kTol = 1e-15;

TEST(LrSchedule, ConstantWarmsUpLinearlyFromZero) {
  LrSchedule s{LrScheduleKind::kConstant, 0.1, 0, 4, 10};
  EXPECT_EQ(s.lr_at(0), 0.0);  // HF: the first update has lr_lambda(0) = 0
  EXPECT_NEAR(s.lr_at(1), 0.025, kTol);
  EXPECT_NEAR(s.lr_at(3), 0.075, kTol);
  EXPECT_EQ(s.lr_at(4), 0.1);
  EXPECT_EQ(s.lr_at(9), 0.1);
  LrSchedule none{LrScheduleKind::kConstant, 0.1, 0, 0, 10};
  EXPECT_EQ(none.lr_at(0), 0.1);  // no warmup: the first update has the full lr
}

TEST(LrSchedule, LinearDecaysToMinLrAtTheLastStep) {
  // W = 2, N = 10: after warmup lr = min + (base - min) * (10 - step) / 8.
  LrSchedule s{LrScheduleKind::kLinear, 1.0, 0.0, 2, 10};
  EXPECT_NEAR(s.lr_at(1), 0.5, kTol);
  EXPECT_NEAR(s.lr_at(2), 1.0, kTol);
  EXPECT_NEAR(s.lr_at(6), 0.5, kTol);
  EXPECT_NEAR(s.lr_at(9), 0.125, kTol);
  EXPECT_EQ(s.lr_at(10), 0.0);
  EXPECT_EQ(s.lr_at(20), 0.0);  // past the end: clamped, never negative
  LrSchedule floor{LrScheduleKind::kLinear, 1.0, 0.2, 2, 10};
  EXPECT_NEAR(floor.lr_at(6), 0.2 + 0.8 * 0.5, kTol);
  EXPECT_NEAR(floor.lr_at(10), 0.2, kTol);
}

TEST(LrSchedule, CosineFollowsHalfACosineToMinLr) {
  LrSchedule s{LrScheduleKind::kCosine, 1.0, 0.1, 0, 8};
  for (int64_t step = 0; step <= 10; ++step) {
    const double p = std::min(1.0, step / 8.0);
    const double expected = 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * p));
    EXPECT_NEAR(s.lr_at(step), expected, kTol) << step;
  }
  EXPECT_NEAR(s.lr_at(4), 0.55, 1e-15);  // the midpoint: half way between base and min
  EXPECT_NEAR(s.lr_at(8), 0.1, 1e-15);
  EXPECT_EQ(s.lr_at(0), 1.0);
}

TEST(LrSchedule, NamesParseAndBadOnesAreRefused) {
  EXPECT_EQ(parse_lr_schedule("cosine"), LrScheduleKind::kCosine);
  EXPECT_STREQ(lr_schedule_name(parse_lr_schedule("linear")), "linear");
  EXPECT_THROW(parse_lr_schedule("exp"), InvalidArgument);
}

std::vector<uint16_t> iota_tokens(int64_t n, uint16_t first) {
  std::vector<uint16_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(first + i);
  return t;
}

TEST(TokenStream, SeveralShardsReadAsOneStreamThatWraps) {
  TempDir tmp;
  data::write_token_shard(tmp.file("train_000000.bin"), iota_tokens(10, 0));
  data::write_token_shard(tmp.file("train_000001.bin"), iota_tokens(7, 10));
  data::write_token_shard(tmp.file("val_000000.bin"), iota_tokens(5, 100));
  const auto paths = resolve_shards(tmp.path(), "train", "--data");
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_EQ(resolve_shards(tmp.file("train_*.bin"), "train", "--data"), paths);
  EXPECT_EQ(resolve_shards(tmp.path(), "val", "--val-data").size(), 1u);
  TokenStream s(paths, false, 0);
  EXPECT_EQ(s.num_tokens(), 17);
  // Batch 3 of B=2, T=3 starts at token 18 = 1 (mod 17), and crosses the shard boundary at 10.
  std::vector<int32_t> out(6);
  s.batch(3, 2, 3, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  s.batch(1, 2, 3, out.data());  // tokens 6..11
  EXPECT_EQ(out, (std::vector<int32_t>{6, 7, 8, 9, 10, 11}));
  s.batch(2, 2, 3, out.data());  // tokens 12..16, then 0: the second epoch
  EXPECT_EQ(out, (std::vector<int32_t>{12, 13, 14, 15, 16, 0}));
  EXPECT_EQ(s.epoch_of(2, 2, 3), 1);
  EXPECT_EQ(s.epoch_of(1, 2, 3), 0);
  // One shard gives TokenShard::batch's tokens (the behaviour of --data before shards).
  data::TokenShard one(paths[0]);
  TokenStream single({paths[0]}, false, 0);
  std::vector<int32_t> a(8), b(8);
  for (int64_t i = 0; i < 5; ++i) {
    one.batch(i, 2, 4, a.data());
    single.batch(i, 2, 4, b.data());
    EXPECT_EQ(a, b) << i;
  }
  EXPECT_THROW(resolve_shards(tmp.file("nothing_*.bin"), "train", "--data"), InvalidArgument);
}

TEST(TokenStream, ShuffledReadsEveryWindowOncePerEpochInASeededOrder) {
  TempDir tmp;
  data::write_token_shard(tmp.file("a.bin"), iota_tokens(40, 0));
  data::write_token_shard(tmp.file("b.bin"), iota_tokens(23, 40));  // 63 tokens: 15 windows of 4
  const std::vector<std::string> paths = {tmp.file("a.bin"), tmp.file("b.bin")};
  TokenStream s(paths, true, 7), same(paths, true, 7), other(paths, true, 8);
  std::vector<int32_t> row(4), row2(4);
  std::vector<int32_t> first_epoch, second_epoch, other_seed;
  for (int64_t i = 0; i < 30; ++i) {  // B = 1: sequence i
    s.batch(i, 1, 4, row.data());
    EXPECT_EQ(row[1], row[0] + 1);  // a window is 4 consecutive tokens
    EXPECT_EQ(row[0] % 4, 0);
    (i < 15 ? first_epoch : second_epoch).push_back(row[0]);
    same.batch(i, 1, 4, row2.data());
    EXPECT_EQ(row, row2);  // the order is a function of the seed alone
    if (i < 15) {
      other.batch(i, 1, 4, row2.data());
      other_seed.push_back(row2[0]);
    }
  }
  EXPECT_EQ(std::set<int32_t>(first_epoch.begin(), first_epoch.end()).size(), 15u);
  EXPECT_EQ(std::set<int32_t>(second_epoch.begin(), second_epoch.end()).size(), 15u);
  EXPECT_NE(first_epoch, second_epoch);  // a new order each epoch (1/15! chance to fail)
  EXPECT_NE(first_epoch, other_seed);
  // Random access gives what sequential reading gave (resume reads from any index).
  TokenStream fresh(paths, true, 7);
  fresh.batch(22, 1, 4, row.data());
  EXPECT_EQ(row[0], second_epoch[7]);
}

}  // namespace
}  // namespace mw::train
