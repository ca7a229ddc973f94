// Note [Epochs]: --epochs E sets the run's steps to cover E passes over --data, in order and
// shuffled, with --grad-accum; the pass a step ends in is the one the data position says.
#include <gtest/gtest.h>

#include <cmath>

#include "../data/temp_dir.h"
#include "core/error.h"
#include "train/trainer.h"
#include "trainer_fixtures.h"

namespace mw::train {
namespace {

using data::testing::expect_throw_with;
using data::testing::TempDir;

TEST(Epochs, TheStepsCoverThePassesAskedFor) {
  TempDir tmp;
  // 4096 tokens in order: 256 sequences of 16 per pass, 2 per step.
  TrainOptions o = testing::tiny(testing::write_shard(tmp, "train.bin", 1), 0);
  o.epochs = 1.5;
  std::string printed;
  Trainer t(o, [&](const std::string& s) { printed += s; });
  EXPECT_EQ(t.total_steps(), 192);  // ceil(1.5 x 256 / 2)
  EXPECT_NE(printed.find("Steps: 192 (1.5 epochs of --data's 4,096 tokens: 256.0 sequences of 16 "
                         "per epoch, 2 per step)"),
            std::string::npos)
      << printed;
  std::vector<int64_t> epoch_of_step;
  while (!t.done()) epoch_of_step.push_back(t.train_step().epoch);
  ASSERT_EQ(epoch_of_step.size(), 192u);
  EXPECT_EQ(epoch_of_step[127], 0);  // step 128 reads the first pass's last sequences
  EXPECT_EQ(epoch_of_step[128], 1);
  EXPECT_EQ(epoch_of_step.back(), 1);  // and the run ends halfway through the second
  // Shuffled: floor(4096 / 16) = 256 windows per pass, 2 x 2 per step with --grad-accum 2.
  o.shuffle = true, o.grad_accum = 2, o.epochs = 1;
  EXPECT_EQ(Trainer(o, nullptr).total_steps(), 64);
  o.epochs = 1e-6;  // at least one step
  EXPECT_EQ(Trainer(o, nullptr).total_steps(), 1);
  o.epochs = 1e15;  // a count of steps no int64 cast may overflow
  expect_throw_with<InvalidArgument>([&] { Trainer huge(o, nullptr); },
                                     {"more than the 2^40 a run may take"});
  o.data.clear();
  expect_throw_with<InvalidArgument>([&] { Trainer none(o, nullptr); }, {"pass --data"});
}

}  // namespace
}  // namespace mw::train
