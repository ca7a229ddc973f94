// What a resume carries besides weights, states and the data position (Note [Skipped steps],
// resume.cpp; Note [Best model and early stopping], best_model.cpp): the steps fp16's loss scaler
// skipped, across a change of precision; the loss scale only from an fp16 run; an early stop; and
// the evaluation the checkpoint's step already had. Each was wrong until session 38 (found by a
// read-only review of the resume code).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../data/temp_dir.h"
#include "train/trainer.h"
#include "trainer_fixtures.h"

namespace mw::train {
namespace {

using data::testing::TempDir;
using testing::tiny;
using testing::write_shard;

// fp16 from 2^20: the first steps overflow and are skipped (asserted below).
TrainOptions overflowing_fp16(const TempDir& tmp, int64_t steps) {
  TrainOptions o = tiny(write_shard(tmp, "train.bin", 7), steps);
  o.precision = DType::F16;
  o.loss_scaler.initial_scale = 1048576;
  o.checkpoint_dir = tmp.file("ckpt");
  return o;
}

// Runs `steps` steps of `o` (at most), checkpointing after the last of them.
StepResult run_and_checkpoint(const TrainOptions& o, int64_t steps, int64_t* skipped = nullptr) {
  Trainer t(o, nullptr);
  StepResult r;
  for (int64_t i = 0; i < steps && !t.done(); ++i) {
    r = t.train_step();
    if (skipped && r.skipped) ++*skipped;
  }
  t.save_checkpoint();
  return r;
}

// An fp16 run that skipped steps, resumed in bf16, checkpointed, and resumed again: the bf16
// run's checkpoint wrote skipped_steps 0 and was refused ("optimizer.bin is at step 2 but
// trainer.json at step 4").
TEST(ResumeBookkeeping, SkippedStepsSurviveAChangeOfPrecision) {
  TempDir tmp;
  TrainOptions o = overflowing_fp16(tmp, 8);
  int64_t skipped = 0;
  run_and_checkpoint(o, 3, &skipped);
  ASSERT_GE(skipped, 1) << "no step overflowed at 2^20";
  TrainOptions bf16 = o;
  bf16.precision = DType::BF16;
  bf16.resume = o.checkpoint_dir;
  run_and_checkpoint(bf16, 1);
  EXPECT_EQ(Trainer(bf16, nullptr).step(), 4);  // from the bf16 run's checkpoint
  TrainOptions fp16 = o;                        // and back in fp16
  fp16.resume = o.checkpoint_dir;
  EXPECT_EQ(Trainer(fp16, nullptr).step(), 4);
}

// An fp32 checkpoint resumed in fp16 starts from --initial-loss-scale: it took the defaults the
// fp32 run wrote (65536) in its place.
TEST(ResumeBookkeeping, AnFp32CheckpointResumedInFp16StartsFromTheGivenScale) {
  TempDir tmp;
  TrainOptions o = tiny(write_shard(tmp, "train.bin", 7), 4);
  o.checkpoint_dir = tmp.file("ckpt");
  run_and_checkpoint(o, 1);
  o.resume = o.checkpoint_dir;
  o.precision = DType::F16;
  o.loss_scaler.initial_scale = 1024;
  Trainer t(o, nullptr);
  const StepResult r = t.train_step();
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.loss_scale, 1024);
}

// The options of a 6-step run evaluated after every step with --save-best and a learning rate of
// 0: the weights never change, so no evaluation after the first is below the best (strictly).
TrainOptions evaluated_without_progress(const TempDir& tmp) {
  TrainOptions o = tiny(write_shard(tmp, "train.bin", 7), 6);
  o.val_data = write_shard(tmp, "val.bin", 8);
  o.eval_every = 1;
  o.eval_batches = 1;
  o.hyper.lr = 0;
  o.save_best = tmp.file("best");
  o.checkpoint_dir = tmp.file("ckpt");
  return o;
}

// A run that stopped early stays stopped when its checkpoint is resumed (a requeued job trained
// on and wrote over --save); a larger --early-stop goes on.
TEST(ResumeBookkeeping, AnEarlyStoppedRunStaysStoppedOnResume) {
  TempDir tmp;
  TrainOptions o = evaluated_without_progress(tmp);
  {
    Trainer t(o, nullptr);
    for (int i = 0; i < 3; ++i) {
      t.train_step();
      t.keep_best(t.evaluate());
    }
    ASSERT_EQ(t.best_validation().evals_since, 2) << "the val loss changed at a learning rate of 0";
    t.save_checkpoint();
  }
  o.resume = o.checkpoint_dir;
  o.early_stop = 2;  // reached at step 3: the run that stopped there
  std::string printed;
  EXPECT_TRUE(Trainer(o, [&](const std::string& line) { printed += line; }).done());
  EXPECT_NE(printed.find("had stopped early"), std::string::npos) << printed;
  o.early_stop = 3;
  Trainer goes_on(o, nullptr);
  EXPECT_FALSE(goes_on.done());
  EXPECT_EQ(goes_on.total_steps(), 6);
}

// A checkpoint at the last step had its evaluation: resuming it (a requeued job) does not
// evaluate again (a second line in --log, and one more evaluation without progress).
TEST(ResumeBookkeeping, TheLastStepsEvaluationIsNotRepeatedOnResume) {
  TempDir tmp;
  TrainOptions o = evaluated_without_progress(tmp);
  o.steps = 2;
  {
    Trainer t(o, nullptr);
    while (!t.done()) {
      t.train_step();
      if (t.eval_due()) t.keep_best(t.evaluate());
    }
    EXPECT_FALSE(t.eval_due()) << "evaluated once at this step already";
    t.save_checkpoint();
  }
  o.resume = o.checkpoint_dir;
  Trainer t(o, nullptr);
  EXPECT_TRUE(t.done());
  EXPECT_FALSE(t.eval_due());
  EXPECT_EQ(t.best_validation().evals_since, 1);
}

// The options of a 4-step run on --data checkpointed after step 2, set to resume from there;
// `printed` collects what the resumed run prints.
TrainOptions checkpointed_on_data(const TempDir& tmp) {
  TrainOptions o = tiny(write_shard(tmp, "train.bin", 7), 4);
  o.checkpoint_dir = tmp.file("ckpt");
  run_and_checkpoint(o, 2);
  o.resume = o.checkpoint_dir;
  return o;
}

std::vector<double> resumed_losses(const TrainOptions& o, std::string* printed) {
  Trainer t(o, [&](const std::string& line) { *printed += line; });
  std::vector<double> losses;
  while (!t.done()) losses.push_back(t.train_step().loss);
  return losses;
}

// With --data and without --shuffle the seeds decide nothing a resume has not restored: another
// --seed resumes as the same run, silently (it was refused, asking for a --data-seed that
// --shuffle needs).
TEST(ResumeBookkeeping, AnotherSeedResumesARunOnDataAsTheSameRun) {
  TempDir tmp;
  TrainOptions o = checkpointed_on_data(tmp);
  std::string printed;
  const std::vector<double> same = resumed_losses(o, &printed);
  o.seed = 11;
  o.data_seed = 11;
  const std::vector<double> other = resumed_losses(o, &printed);
  EXPECT_EQ(other, same);
  EXPECT_EQ(printed.find("warning"), std::string::npos) << printed;
}

// The same shard by another spelling (a link, a trailing "/.") resumes silently; a copy elsewhere
// (a node's scratch) with a warning: it was refused ("pass the same --data").
TEST(ResumeBookkeeping, TheSameDataByAnotherPathResumes) {
  TempDir tmp;
  TrainOptions o = checkpointed_on_data(tmp);
  std::string printed;
  const std::vector<double> first = resumed_losses(o, &printed);
  std::filesystem::create_directory_symlink(tmp.path(), tmp.file("link"));
  o.data = tmp.file("link/train.bin");
  EXPECT_EQ(resumed_losses(o, &printed), first);
  EXPECT_EQ(printed.find("warning"), std::string::npos) << printed;
  std::filesystem::create_directory(tmp.file("scratch"));
  std::filesystem::copy_file(tmp.file("train.bin"), tmp.file("scratch/train.bin"));
  o.data = tmp.file("scratch/train.bin");
  EXPECT_EQ(resumed_losses(o, &printed), first);
  EXPECT_NE(printed.find("with data = \"" + o.data + "\" (the checkpoint's run had"),
            std::string::npos)
      << printed;
}

// A --config whose layer_norm_epsilon differs from the checkpoint's run changes every update: it
// passed silently (only resid_pdrop was recorded); now it is warned about by name.
TEST(ResumeBookkeeping, AnotherLayerNormEpsilonIsWarnedAbout) {
  TempDir tmp;
  TrainOptions o = checkpointed_on_data(tmp);
  std::ifstream in(std::string(MW_SOURCE_DIR) + "/tests/fixtures/gpt2_tiny/config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.find("\"layer_norm_epsilon\"");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, text.find_first_of(",}", at) - at, "\"layer_norm_epsilon\": 0.5");
  data::testing::write_bytes(tmp.file("config.json"), text);
  o.config_path = tmp.file("config.json");
  o.model.clear();
  std::string printed;
  resumed_losses(o, &printed);
  EXPECT_NE(printed.find("with layer_norm_epsilon = 0.5"), std::string::npos) << printed;
}

std::string refusal(const TrainOptions& o) {
  try {
    Trainer t(o, nullptr);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(resumed)";
}

// Another model shape is refused before the weights are read, naming the option: another --n-head
// (no tensor changes shape) resumed silently into another model, and another --n-embd was blamed
// on config.json ("tensor 'transformer.wte.weight' has shape ..."). Found by a new user's
// walkthrough.
TEST(ResumeBookkeeping, AnotherModelShapeIsRefusedNamingTheOption) {
  TempDir tmp;
  TrainOptions o = checkpointed_on_data(tmp);
  TrainOptions heads = o;
  heads.n_head = 2;  // tiny has 4
  EXPECT_NE(refusal(heads).find("n_head = 4 and this run has 2; pass the same --n-head"),
            std::string::npos)
      << refusal(heads);
  TrainOptions width = o;
  width.n_embd = 64;
  EXPECT_NE(refusal(width).find("pass the same --n-embd to resume (the checkpoint's model"),
            std::string::npos)
      << refusal(width);
}

// A run on --data resumed without it (random tokens) was refused naming a --seed no value could
// match ("seed = (absent)"); it names --data.
TEST(ResumeBookkeeping, RandomTokensForARunOnDataAreRefusedNamingData) {
  TempDir tmp;
  TrainOptions o = checkpointed_on_data(tmp);
  o.data.clear();
  EXPECT_NE(refusal(o).find("and this one on \"random tokens\"; pass the same --data"),
            std::string::npos)
      << refusal(o);
}

}  // namespace
}  // namespace mw::train
