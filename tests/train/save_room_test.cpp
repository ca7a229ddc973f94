// Note [Room for the saves]: how many checkpoints a run writes, what --keep leaves of them, and the
// refusal when a file system cannot hold the saves.
#include "train/save_room.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "../data/temp_dir.h"
#include "core/error.h"

namespace mw::train {
namespace {

using data::testing::TempDir;

TEST(SaveRoom, CheckpointsAreEveryNStepsAndTheLast) {
  EXPECT_EQ(checkpoints_to_write(0, 10, 3), 4);  // 3, 6, 9 and 10
  EXPECT_EQ(checkpoints_to_write(0, 9, 3), 3);   // 3, 6, 9 (the last among them)
  EXPECT_EQ(checkpoints_to_write(3, 10, 3), 3);  // resumed at 3: 6, 9, 10
  EXPECT_EQ(checkpoints_to_write(0, 10, 0), 1);  // the last only
  EXPECT_EQ(checkpoints_to_write(10, 10, 3), 0);
}

// Ten checkpoints of tiny, or with --keep 2 and one already there at most two beyond it; the model
// and optimizer files from the parameter count (29,600 f32: 4 and 8 bytes each, plus headers).
TEST(SaveRoom, KeepBoundsTheCheckpointsThatCoexist) {
  TempDir tmp;
  TrainOptions o;
  o.steps = 10;
  o.checkpoint_every = 1;
  o.checkpoint_dir = tmp.file("ck");
  const gpt2::Config c = gpt2::Config::preset("tiny");
  const int64_t one = saved_model_bytes(c) + saved_optimizer_bytes(c) + 16 * 1024;
  EXPECT_GE(saved_model_bytes(c), 4 * 29600);
  EXPECT_GE(saved_optimizer_bytes(c), 8 * 29600);
  std::vector<SaveNeed> needs = save_needs(o, c);
  ASSERT_EQ(needs.size(), 1u);
  EXPECT_EQ(needs[0].bytes, 10 * one);
  std::filesystem::create_directories(tmp.file("ck/step_000001"));
  o.keep = 2;
  needs = save_needs(o, c);
  ASSERT_EQ(needs.size(), 1u);
  EXPECT_EQ(needs[0].bytes, 2 * one) << needs[0].what;
  o.eval_only = true;  // saves nothing
  EXPECT_TRUE(save_needs(o, c).empty());
  // --save-best writes each new best beside the one it replaces.
  TrainOptions b;
  b.save_best = tmp.file("best");
  needs = save_needs(b, c);
  ASSERT_EQ(needs.size(), 1u);
  const int64_t model = needs[0].bytes / 2;
  EXPECT_GE(model, saved_model_bytes(c)) << needs[0].what;
  std::filesystem::create_directories(tmp.file("best"));
  std::ofstream(tmp.file("best/model.safetensors")) << "an earlier best";
  EXPECT_EQ(save_needs(b, c).at(0).bytes, model) << save_needs(b, c).at(0).what;
}

TEST(SaveRoom, AFileSystemTooSmallForTheSavesIsRefusedNamingThem) {
  TempDir tmp;
  const int64_t huge = std::numeric_limits<int64_t>::max() / 4;
  EXPECT_NO_THROW(check_save_room({{"--save 'm'", tmp.file("m"), 1 << 20}}, tmp.path(), 0));
  try {
    check_save_room({{"--save 'm'", tmp.file("new/m"), 1 << 20},
                     {"--checkpoint-dir 'ck'", tmp.file("ck"), huge}},
                    tmp.path(), 1 << 20);
    FAIL() << "a need of " << huge << " bytes fit";
  } catch (const OutOfMemory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the disk at '" + tmp.path() + "' needs"), std::string::npos) << what;
    for (const char* name : {"--save 'm'", "--checkpoint-dir 'ck'", "the NVMe files"})
      EXPECT_NE(what.find(name), std::string::npos) << name << ": " << what;
    EXPECT_EQ(e.requested_bytes, huge + 2 * (1 << 20));
  }
}

}  // namespace
}  // namespace mw::train
