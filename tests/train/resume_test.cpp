// Exact resume (Note [Exact resume]) against the uninterrupted run, bit for bit, with dropout, NVMe
// offload, shuffling, accumulation, a schedule and another memory layout; what a resume refuses or
// warns about; and optimizer files moved between Gemini and plain runs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../data/temp_dir.h"
#include "data/token_shard.h"
#include "train/trainer.h"
#include "trainer_fixtures.h"

namespace mw::train {
namespace {

using data::testing::TempDir;
using testing::on_gemini_auto;
using testing::tiny;
using testing::weights;
using testing::write_shard;

struct ResumeCase {
  const char* name;
  bool nvme, shuffle, clip;
  int64_t grad_accum;
  bool gemini = false;  // Gemini auto on a sim device
  bool adamw = false;   // --optimizer adamw: the same checkpoint file (adam_state_file.h)
  // Note [Optimizer layouts]: the resumed run lays its optimizer out otherwise: 'p' plain
  // HybridAdam, 'g' Gemini auto with small chunks (several per block, padding between members).
  char resume_as = 0;
  // fp16 from this loss scale (2^20 in the cases): a scale that overflows skips the first steps
  // (before the checkpoint), so the optimizer's step count trails the run's. 0: fp32.
  double fp16_scale = 0;
};

class ExactResume : public ::testing::TestWithParam<ResumeCase> {};

// Stopped after step 3 of 6 (checkpoints every 2 steps), resumed from step 2's checkpoint: the
// losses of steps 2..5 and the final weights equal the uninterrupted run's bit for bit.
TEST_P(ExactResume, ResumedRunEqualsTheUninterruptedOneBitForBit) {
  const ResumeCase c = GetParam();
  TempDir tmp;
  TrainOptions o = tiny(write_shard(tmp, "train.bin", 4), 6);
  o.val_data = write_shard(tmp, "val.bin", 5);
  o.eval_every = 2;
  o.eval_batches = 2;
  o.dropout = 0.1;
  o.shuffle = c.shuffle;
  o.grad_accum = c.grad_accum;
  o.grad_clip = c.clip ? 1.0 : 0;
  o.lr_schedule = LrScheduleKind::kCosine;
  o.warmup_steps = 1;
  if (c.nvme) {
    o.nvme.fraction = 1.0;
    o.nvme.dir = tmp.file("nvme");
  }
  if (c.adamw) o.optimizer = "adamw";
  if (c.gemini) {
    on_gemini_auto(o);
  }
  if (c.fp16_scale > 0) {
    o.precision = DType::F16;
    o.loss_scaler.initial_scale = c.fp16_scale;
  }
  std::string printed;
  int64_t skipped_before_checkpoint = 0;
  auto run = [&](TrainOptions opts, int64_t stop_after, std::vector<double>* losses) {
    Trainer t(opts, [&](const std::string& line) { printed += line; });
    for (int64_t i = 0; i < stop_after && !t.done(); ++i) {
      const StepResult r = t.train_step();
      if (r.skipped && r.step < 2) ++skipped_before_checkpoint;
      losses->push_back(r.loss);
      if (t.eval_due()) t.evaluate();
      if (t.checkpoint_due()) t.save_checkpoint();
    }
    t.flush();
    return weights(t);
  };
  std::vector<double> full_losses, first_losses, resumed_losses;
  const auto full = run(o, 6, &full_losses);
  if (c.fp16_scale > 0) {
    ASSERT_GE(skipped_before_checkpoint, 1) << "no step was skipped";
  }
  TrainOptions first = o;
  first.checkpoint_dir = tmp.file("ckpt");
  first.checkpoint_every = 2;
  run(first, 3, &first_losses);  // "killed" after step 3: the newest checkpoint is step_000002
  ASSERT_EQ(list_checkpoints(first.checkpoint_dir).size(), 1u);
  TrainOptions resumed = first;
  resumed.resume = first.checkpoint_dir;
  if (c.resume_as == 'p') {
    resumed.gemini.clear();
    resumed.device = Device::cpu();
  } else if (c.resume_as == 'g') {
    on_gemini_auto(resumed);
    resumed.gemini_options.chunk_numel = 3000;  // not a divisor of any block's parameters
  }
  printed.clear();
  const auto after = run(resumed, 6, &resumed_losses);
  // Another memory layout (Gemini on or off, other chunks) keeps the uninterrupted run, and the
  // resume says nothing else (it warned that the optimizer had changed from "gemini").
  EXPECT_EQ(printed.find("warning"), std::string::npos) << printed;
  ASSERT_EQ(resumed_losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(resumed_losses[i], full_losses[i + 2]) << i;
  EXPECT_EQ(after, full);
  EXPECT_EQ(list_checkpoints(first.checkpoint_dir).size(), 3u);  // steps 2, 4, 6
}

INSTANTIATE_TEST_SUITE_P(
    Modes, ExactResume,
    ::testing::Values(
        ResumeCase{"dropout", false, false, false, 1},
        ResumeCase{"nvme_dropout", true, false, false, 1},
        ResumeCase{"shuffle_accum_clip_nvme", true, true, true, 2},
        // Note [Updates in the last backward]: accumulation alone
        ResumeCase{"accum_nvme", true, false, false, 2},
        ResumeCase{"gemini_auto_accum_nvme", true, false, false, 2, true},
        ResumeCase{"gemini_auto_dropout", false, false, false, 1, true},
        ResumeCase{"gemini_auto_shuffle_accum_clip", false, true, true, 2, true},
        ResumeCase{"gemini_auto_accum_clip_nvme", true, false, true, 2, true},
        ResumeCase{"adamw_accum_clip_dropout", false, false, true, 2, false, true},
        ResumeCase{"gemini_resumed_plain_accum_clip", false, false, true, 2, true, false, 'p'},
        ResumeCase{"plain_nvme_resumed_gemini_small_chunks", true, false, false, 1, false, false,
                   'g'},
        ResumeCase{"gemini_resumed_gemini_small_chunks_nvme", true, false, false, 1, true, false,
                   'g'},
        // Steps the loss scaler skipped before the checkpoint: it was refused
        // ("optimizer.bin is at step 0 but trainer.json at step 2") until session 38.
        ResumeCase{"fp16_skipped_steps_dropout", false, false, false, 1, false, false, 0, 1048576},
        ResumeCase{"fp16_skipped_steps_gemini_auto_accum", false, false, false, 2, true, false, 0,
                   1048576}),
    [](const auto& info) { return std::string(info.param.name); });

// --load-optimizer of a file written without Gemini (the model's own layout, recognised by its
// tensor sizes) under Gemini with small chunks: the run goes on as the plain run that loads it
// does, from the same step (the learning-rate schedule and the data position follow the step), with
// bitwise the same losses and weights. Before, Gemini refused the file, and a loaded Gemini run
// restarted its step count at 0.
TEST(Trainer, LoadOptimizerOfAPlainRunUnderGeminiGoesOnAsThePlainRun) {
  TempDir tmp;
  TrainOptions o = tiny(write_shard(tmp, "train.bin", 6), 2);
  o.lr_schedule = LrScheduleKind::kCosine;
  o.warmup_steps = 1;
  o.save_optimizer = tmp.file("opt.bin");
  {
    Trainer t(o, nullptr);
    while (!t.done()) t.train_step();
    t.flush();
    t.save_model(tmp.file("model"));
    t.save_optimizer_output();
  }
  TrainOptions plain = o;
  plain.save_optimizer.clear();
  plain.init_from = tmp.file("model");
  plain.load_optimizer = tmp.file("opt.bin");
  TrainOptions chunked = plain;
  on_gemini_auto(chunked);
  chunked.gemini_options.chunk_numel = 3000;
  auto run = [](const TrainOptions& opts, std::vector<double>* losses) {
    Trainer t(opts, nullptr);
    while (!t.done()) losses->push_back(t.train_step().loss);
    t.flush();
    EXPECT_EQ(t.step(), 4);
    return weights(t);
  };
  std::vector<double> plain_losses, chunked_losses;
  const auto plain_weights = run(plain, &plain_losses);
  const auto chunked_weights = run(chunked, &chunked_losses);
  EXPECT_EQ(chunked_losses, plain_losses);
  EXPECT_EQ(chunked_weights, plain_weights);
}

// Note [Saving in the model's layout]: --save-optimizer under Gemini writes the model's parameters,
// not its chunks, so the file is the one a run without Gemini writes: byte for byte, with the
// states in memory and with them on disk (one slice per parameter either way here). Before, the
// file held one tensor per chunk and loaded only into the same chunk layout.
TEST(Trainer, SaveOptimizerUnderGeminiWritesTheFileOfAPlainRun) {
  for (const bool nvme : {false, true}) {
    SCOPED_TRACE(nvme ? "states on disk" : "states in memory");
    TempDir tmp;
    TrainOptions plain = tiny(write_shard(tmp, "train.bin", 6), 2);
    if (nvme) {
      plain.nvme.fraction = 1.0;
      plain.nvme.dir = tmp.file("nvme");
    }
    TrainOptions chunked = plain;
    on_gemini_auto(chunked);
    chunked.gemini_options.chunk_numel = 3000;  // several chunks, padding between members
    auto save = [](TrainOptions o, const std::string& file) {
      o.save_optimizer = file;
      Trainer t(o, nullptr);
      while (!t.done()) t.train_step();
      t.flush();
      t.save_optimizer_output();
      return data::testing::read_bytes(file);
    };
    const std::string a = save(plain, tmp.file("plain.bin"));
    const std::string b = save(chunked, tmp.file("gemini.bin"));
    EXPECT_GT(a.size(), 29600u * 8);
    EXPECT_TRUE(a == b) << "the Gemini run's file differs from the plain run's (" << b.size()
                        << " vs " << a.size() << " bytes)";
  }
}

// The options of a 2-step run checkpointed after its first step, set to resume from there.
TrainOptions checkpointed_after_one_step(const TempDir& tmp) {
  TrainOptions o = tiny(write_shard(tmp, "train.bin", 6), 2);
  o.checkpoint_dir = tmp.file("ckpt");
  Trainer t(o, nullptr);
  t.train_step();
  t.save_checkpoint();
  o.resume = o.checkpoint_dir;
  return o;
}

TEST(Trainer, ResumeRefusesADifferentBatchNamingTheOption) {
  TempDir tmp;
  TrainOptions o = checkpointed_after_one_step(tmp);
  o.batch = 3;
  try {
    Trainer t(o, nullptr);
    FAIL() << "resumed with another batch";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--batch"), std::string::npos) << e.what();
  }
}

// A changed hyperparameter is a warning that names the values as typed: the fingerprint keeps the
// floats widened to double, and the warning printed "lr = 0.0020000000949949026 (the checkpoint's
// run had 0.0010000000474974513)".
TEST(Trainer, ResumeWithAnotherLearningRateWarnsWithTheValuesAsTyped) {
  TempDir tmp;
  TrainOptions o = checkpointed_after_one_step(tmp);
  o.hyper.lr = 2e-3f;
  o.hyper.beta2 = 0.95f;
  std::string printed;
  Trainer t(o, [&](const std::string& line) { printed += line; });
  EXPECT_NE(printed.find("with lr = 0.002 (the checkpoint's run had 0.001)"), std::string::npos)
      << printed;
  EXPECT_NE(printed.find("with beta2 = 0.95 (the checkpoint's run had 0.999)"), std::string::npos)
      << printed;
}

// A --data glob that takes the val_ shards too trains on the validation tokens: the run says so.
TEST(Trainer, ValidationShardsAmongTheTrainingShardsDrawAWarning) {
  TempDir tmp;
  write_shard(tmp, "train_000000.bin", 1);
  TrainOptions o = tiny(tmp.file("*.bin"), 1);
  o.val_data = write_shard(tmp, "val_000000.bin", 2);
  for (const bool overlap : {true, false}) {
    if (!overlap) o.data = tmp.path();  // a directory reads its train_*.bin only
    std::string printed;
    Trainer t(o, [&](const std::string& line) { printed += line; });
    EXPECT_EQ(printed.find("is also a --data shard: the validation loss is measured on training "
                           "tokens") != std::string::npos,
              overlap)
        << printed;
  }
}

// The shard behind the checkpoint's --data path grew (a user added text and re-tokenized): the run
// reads other tokens from the same batch index, and said nothing.
TEST(Trainer, ResumeOnDataThatChangedSinceTheCheckpointWarns) {
  TempDir tmp;
  TrainOptions o = checkpointed_after_one_step(tmp);
  std::vector<uint16_t> more(5000, 1);
  data::write_token_shard(o.data, more);
  std::string printed;
  Trainer t(o, [&](const std::string& line) { printed += line; });
  EXPECT_NE(printed.find("with --data holding 5000 tokens (the checkpoint's run read 4096)"),
            std::string::npos)
      << printed;
}

// Training on with more --steps is the uninterrupted run of the new total when every update before
// the checkpoint had the learning rate it has under the new total: under a constant schedule, or
// within a decaying schedule's warmup. Such a resume is silent and its losses are the longer
// straight run's bit for bit; it warned "no longer the uninterrupted run's" for the most common
// resume there is. Past a decay's warmup the earlier rates depended on the old total: it warns.
TEST(Trainer, MoreStepsResumeSilentlyAsTheLongerRunWhenNoEarlierRateChanges) {
  struct Case {
    LrScheduleKind kind;
    int64_t warmup;
    bool same;
  };
  for (const Case c :
       {Case{LrScheduleKind::kConstant, 0, true}, Case{LrScheduleKind::kCosine, 2, true},
        Case{LrScheduleKind::kCosine, 0, false}, Case{LrScheduleKind::kLinear, 0, false}}) {
    TempDir tmp;
    TrainOptions o = tiny(write_shard(tmp, "train.bin", 6), 3);
    o.lr_schedule = c.kind;
    o.warmup_steps = c.warmup;
    o.checkpoint_dir = tmp.file("ckpt");
    {
      Trainer t(o, nullptr);
      t.train_step(), t.train_step();
      t.save_checkpoint();  // at step 2 of 3
    }
    o.steps = 5;
    std::vector<double> resumed, straight;
    std::string printed;
    {
      TrainOptions r = o;
      r.resume = o.checkpoint_dir;
      Trainer t(r, [&](const std::string& line) { printed += line; });
      while (!t.done()) resumed.push_back(t.train_step().loss);
    }
    o.checkpoint_dir.clear();
    Trainer t(o, nullptr);
    while (!t.done()) straight.push_back(t.train_step().loss);
    ASSERT_EQ(resumed.size(), 3u);
    const std::string name = lr_schedule_name(c.kind);
    EXPECT_EQ(printed.find("warning") == std::string::npos, c.same) << name << ": " << printed;
    if (!c.same) {
      EXPECT_NE(printed.find("with steps = 5 (the checkpoint's run had 3)"), std::string::npos)
          << printed;
    }
    EXPECT_EQ(resumed == std::vector<double>(straight.begin() + 2, straight.end()), c.same) << name;
  }
}

}  // namespace
}  // namespace mw::train
