// The Trainer against plain references: gradient accumulation against one larger batch, clipping
// against a hand-written loop, clipping with NVMe-offloaded states, the schedule, and non-finite
// values. Resuming and optimizer files: resume_test.cpp.
#include "train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "../data/temp_dir.h"
#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "data/token_shard.h"
#include "optim/optimizer.h"
#include "trainer_fixtures.h"

namespace mw::train {
namespace {

using data::testing::TempDir;
using testing::on_gemini_auto;
using testing::tiny;
using testing::weights;
using testing::write_shard;

double max_abs_diff(const std::vector<std::vector<float>>& a,
                    const std::vector<std::vector<float>>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j)
      d = std::max(d, std::abs(static_cast<double>(a[i][j]) - b[i][j]));
  return d;
}

TEST(Trainer, TwoMicroBatchesEqualOneBatchTwiceAsLarge) {
  TempDir tmp;
  const std::string shard = write_shard(tmp, "train.bin", 1);
  TrainOptions accum = tiny(shard, 3), big = tiny(shard, 3);
  accum.grad_accum = 2;  // rows [2sB, 2sB + B) and [2sB + B, 2sB + 2B): the big batch's rows
  big.batch = 4;
  Trainer a(accum, nullptr), b(big, nullptr);
  for (int i = 0; i < 3; ++i) {
    const StepResult ra = a.train_step(), rb = b.train_step();
    // The mean of two means of 32 token losses vs one mean of 64, in float: a few ulps.
    EXPECT_NEAR(ra.loss, rb.loss, 1e-5) << i;
  }
  // Summed gradients / 2 (div_scale) vs one backward over both halves: fp32 reassociation, ~1e-7
  // relative in each gradient; after 3 Adam steps of lr 1e-3 the weights differ by far less than
  // one step (1e-3). 1e-5 leaves room for elements whose v is near zero.
  const double d = max_abs_diff(weights(a), weights(b));
  EXPECT_LT(d, 1e-5);
  EXPECT_GT(d, 0);  // genuinely two different computations
}

// Note [Updates in the last backward]: with accumulation alone, HybridAdam steps each parameter
// in the last micro-batch's backward (in memory, or on the NVMe updater, overlapped), with the
// summed gradient and 1/K set before it: bitwise the updates at step() (--update-in-backward off),
// the same logged norm, and the gradients are spent in backward (released), where deferred
// updates keep them.
TEST(Trainer, AccumulationUpdatesInTheLastBackwardAsAtTheStep) {
  TempDir tmp;
  TrainOptions o = tiny(write_shard(tmp, "train.bin", 1), 3);
  o.grad_accum = 2;
  o.dropout = 0.1;
  struct Run {
    std::vector<double> losses, norms;
    std::vector<std::vector<float>> weights;
    bool grads_kept = true;  // after every step, every parameter's gradient
  };
  auto run = [](const TrainOptions& opts) {  // one after the other: dropout draws from one stream
    Trainer t(opts, nullptr);
    Run r;
    for (int i = 0; i < 3; ++i) {
      const StepResult step = t.train_step();
      r.losses.push_back(step.loss);
      r.norms.push_back(step.grad_norm);
      for (const Tensor& p : t.model().parameters()) r.grads_kept &= grad(p).defined();
    }
    t.flush();
    r.weights = weights(t);
    return r;
  };
  TrainOptions deferred = o, nvme = o;
  deferred.update_in_backward = false;
  nvme.nvme.fraction = 1.0;
  nvme.nvme.dir = tmp.file("nvme");
  TrainOptions nvme_deferred = nvme;
  nvme_deferred.update_in_backward = false;
  const Run ref = run(deferred);
  EXPECT_TRUE(ref.grads_kept);
  for (const TrainOptions& opts : {o, nvme, nvme_deferred}) {
    const Run r = run(opts);
    EXPECT_EQ(r.losses, ref.losses);
    EXPECT_EQ(r.norms, ref.norms) << "the norm's parts taken before each update in backward";
    EXPECT_EQ(r.weights, ref.weights);
    EXPECT_EQ(r.grads_kept, !opts.update_in_backward) << "spent in the last backward";
  }
}

// --update-in-backward off, without accumulation: every parameter is stepped at step(), with its
// states in memory or on NVMe (all of them, or some), so every gradient is still held after the
// step and the logged norm is the in-memory run's. The NVMe updater used to step its parameters
// in backward anyway and release their gradients: the norm came out 0 (fraction 1) or partial.
TEST(Trainer, UpdateInBackwardOffKeepsEveryGradientWithStatesOnNvme) {
  TempDir tmp;
  TrainOptions o = tiny(write_shard(tmp, "train.bin", 1), 2);
  o.update_in_backward = false;
  std::vector<double> ref_norms;
  std::vector<std::vector<float>> ref_weights;
  for (double fraction : {0.0, 1.0, 0.4}) {
    TrainOptions opts = o;
    opts.nvme.fraction = fraction;
    opts.nvme.dir = tmp.file("nvme");
    Trainer t(opts, nullptr);
    std::vector<double> norms;
    for (int i = 0; i < 2; ++i) {
      norms.push_back(t.train_step().grad_norm);
      for (const Tensor& p : t.model().parameters())
        EXPECT_TRUE(grad(p).defined()) << "fraction " << fraction << ", step " << i;
    }
    t.flush();
    if (fraction == 0.0) {
      ref_norms = norms, ref_weights = weights(t);
      EXPECT_GT(norms[0], 0);
      continue;
    }
    EXPECT_EQ(norms, ref_norms) << "fraction " << fraction;
    EXPECT_EQ(weights(t), ref_weights) << "fraction " << fraction;
  }
}

// The log's adam_nvme_read_bytes / adam_nvme_write_bytes: the states' disk traffic per step, as
// the engine completes it. A step's last write-backs and the next step's read-ahead fall in
// whichever record comes after they complete (the read-ahead may even fetch a step that never
// comes: the window does not know the last step), so only the sums are exact: every step writes
// each slice once (the file's bytes), steps 1 and 2 read them back, and the records add up to
// the engine's counts (reads: up to a read-ahead still in flight). (A per-step equality held in
// Release and failed under ASan's timing.)
TEST(Trainer, TheLogCountsTheNvmeStatesTrafficOfEachStep) {
  TempDir tmp;
  TrainOptions o = tiny(write_shard(tmp, "train.bin", 1), 3);
  o.nvme.fraction = 1.0;
  o.nvme.dir = tmp.file("nvme");
  Trainer t(o, nullptr);
  int64_t read = 0, written = 0;
  for (int i = 0; i < 3; ++i) {
    t.train_step();
    const json::Value rec = t.take_offload_step_stats();
    read += rec.get_int("adam_nvme_read_bytes");
    written += rec.get_int("adam_nvme_write_bytes");
  }
  t.flush();
  const json::Value rest = t.take_offload_step_stats();
  read += rest.get_int("adam_nvme_read_bytes");
  written += rest.get_int("adam_nvme_write_bytes");
  const optim::NvmeStats st = t.hybrid()->nvme()->stats();
  ASSERT_GT(st.file_bytes, 0);
  EXPECT_EQ(written, 3 * st.file_bytes);
  EXPECT_GE(read, 2 * st.file_bytes);
  EXPECT_LE(read, st.bytes_read);  // a read-ahead may still complete after flush()
  EXPECT_EQ(written, st.bytes_written);
}

// The plain loop of torch: backward, clip_grad_norm_, AdamW.step().
std::vector<std::vector<float>> reference_clipped(const std::string& shard, int64_t steps,
                                                  double max_norm, std::vector<double>* norms) {
  const gpt2::Config config = gpt2::Config::preset("tiny");
  gpt2::Config c = config;
  c.set_dropout(0);
  default_generator().manual_seed(3);
  gpt2::GPT2 model(c, 3);
  optim::AdamW opt(model.parameters(), optim::AdamHyper{});
  TokenStream data({shard}, false, 0);
  std::vector<int32_t> tokens(32);
  model.train();
  for (int64_t s = 0; s < steps; ++s) {
    opt.zero_grad();
    data.batch(s, 2, 16, tokens.data());
    Tensor ids = Tensor::from_vector(tokens, {2, 16});
    backward(shifted_cross_entropy(model(ids), ids));
    double sum_sq = 0;
    for (const Tensor& p : model.parameters())
      for (float g : grad(p).to_vector<float>()) sum_sq += static_cast<double>(g) * g;
    const double norm = std::sqrt(sum_sq);
    norms->push_back(norm);
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1)
      for (const Tensor& p : model.parameters()) {
        float* g = grad(p).data<float>();
        for (int64_t i = 0; i < p.numel(); ++i) g[i] = static_cast<float>(g[i] * coef);
      }
    opt.step();
  }
  std::vector<std::vector<float>> w;
  for (const Tensor& p : model.parameters()) w.push_back(p.contiguous().to_vector<float>());
  return w;
}

TEST(Trainer, ClippingMatchesAPlainLoopAndIsTheSameWithStatesOnNvme) {
  TempDir tmp;
  const std::string shard = write_shard(tmp, "train.bin", 2);
  const double max_norm = 0.5;  // tiny's gradient norm is ~2-3: every step is clipped
  std::vector<double> ref_norms;
  const auto ref = reference_clipped(shard, 3, max_norm, &ref_norms);

  TrainOptions o = tiny(shard, 3);
  o.grad_clip = max_norm;
  o.optimizer = "adamw";
  Trainer adamw(o, nullptr);
  for (int i = 0; i < 3; ++i) {
    const StepResult r = adamw.train_step();
    EXPECT_TRUE(r.clipped);
    // Step 0: the same floats summed in double, in fixed blocks vs one pass: 1e-12 relative.
    // Later steps start from weights one rounding of the clip apart (below): 1e-6 relative.
    EXPECT_NEAR(r.grad_norm, ref_norms[i], (i == 0 ? 1e-12 : 1e-6) * ref_norms[i]);
  }
  // Gradients divided by norm/max_norm (div_scale) vs multiplied by its reciprocal: one rounding
  // apart per gradient (6e-8 relative), far below a step of lr 1e-3.
  EXPECT_LT(max_abs_diff(weights(adamw), ref), 1e-6);

  // HybridAdam in memory and with every state on NVMe: bit for bit AdamW's (Note [Adam math]),
  // since the clip reaches both as the same divisor.
  o.optimizer = "hybridadam";
  Trainer in_memory(o, nullptr);
  o.nvme.fraction = 1.0;
  o.nvme.dir = tmp.file("nvme");
  Trainer on_nvme(o, nullptr);
  ASSERT_NE(on_nvme.hybrid()->nvme(), nullptr);
  for (int i = 0; i < 3; ++i) {
    in_memory.train_step();
    on_nvme.train_step();
  }
  on_nvme.flush();
  EXPECT_EQ(weights(in_memory), weights(adamw));
  EXPECT_EQ(weights(on_nvme), weights(adamw));
}

TEST(Trainer, TheLearningRateFollowsTheSchedule) {
  TempDir tmp;
  TrainOptions o = tiny(write_shard(tmp, "train.bin", 3), 6);
  o.lr_schedule = LrScheduleKind::kCosine;
  o.warmup_steps = 2;
  o.min_lr = 1e-4;
  Trainer t(o, nullptr);
  // Note [LR schedule] with W = 2, N = 6, base = the float nearest 1e-3 (what --lr holds).
  const double base = static_cast<double>(1e-3f), min = 1e-4;
  const double expected[] = {0,
                             base / 2,
                             base,
                             min + (base - min) * 0.5 * (1 + std::cos(M_PI / 4)),
                             min + (base - min) * 0.5 * (1 + std::cos(M_PI / 2)),
                             min + (base - min) * 0.5 * (1 + std::cos(3 * M_PI / 4))};
  for (double lr : expected) EXPECT_NEAR(t.train_step().lr, lr, 1e-18);
  EXPECT_TRUE(t.done());
}

// Note [Non-finite values]: an infinite gradient under a finite loss (a grad-ready hook writes it)
// stops the run at that step, naming the norm, before the update: the weights are unchanged.
TEST(Trainer, ANonFiniteGradientNormStopsTheStepBeforeTheUpdate) {
  TempDir tmp;
  for (const char* optimizer : {"adamw", "hybridadam"}) {
    SCOPED_TRACE(optimizer);
    TrainOptions o = tiny(write_shard(tmp, "train.bin", 5), 2);
    o.optimizer = optimizer;
    o.grad_clip = std::string(optimizer) == "hybridadam" ? 1.0 : 0.0;  // a norm is measured
    Trainer t(o, nullptr);
    t.train_step();
    const auto before = weights(t);
    const Tensor poisoned = t.model().parameters().back();  // a copy: the vector is a temporary
    add_grad_ready_hook(poisoned, [](const Tensor& leaf) {
      grad(leaf).data<float>()[0] = std::numeric_limits<float>::infinity();
    });
    try {
      t.train_step();
      ADD_FAILURE() << "expected the step to stop";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the gradient norm is inf at step 1"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(weights(t), before);
  }
  // --grad-accum alone: the last micro-batch's backward stepped before the norm was known, and
  // the message says so (it said "before the update" until session 38).
  TrainOptions o = tiny(write_shard(tmp, "train.bin", 5), 2);
  o.grad_accum = 2;
  Trainer t(o, nullptr);
  ASSERT_TRUE(o.updates_in_last_backward());
  // The first micro-batch's gradient is kept (accumulated); the last one's is stepped and let go
  // before this hook runs.
  add_grad_ready_hook(t.model().parameters().back(), [](const Tensor& leaf) {
    if (grad(leaf).defined()) grad(leaf).data<float>()[0] = std::numeric_limits<float>::infinity();
  });
  try {
    t.train_step();
    ADD_FAILURE() << "expected the step to stop";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stopped after the update in backward"), std::string::npos)
        << e.what();
  }
}

// Note [Non-finite values]: where parameters are stepped during backward, with nothing measured
// first (HybridAdam in memory and on NVMe, Gemini's chunks), the CPU kernels check what they
// write. An infinite learning rate makes every update non-finite from finite gradients (a test
// hook cannot reach a gradient there before its update, which runs first and frees it); the step
// stops naming what its update broke.
TEST(Trainer, ANonFiniteUpdateInBackwardStopsTheStep) {
  TempDir tmp;
  for (const char* mode : {"in memory", "nvme", "gemini"}) {
    SCOPED_TRACE(mode);
    TrainOptions o = tiny(write_shard(tmp, "train.bin", 6), 2);
    const std::string m = mode;
    if (m == "nvme") {
      o.nvme.fraction = 1.0;
      o.nvme.dir = tmp.file("nvme");
    }
    if (m == "gemini") {
      on_gemini_auto(o);
    }
    Trainer t(o, nullptr);
    t.train_step();
    t.set_learning_rate_for_testing(std::numeric_limits<float>::infinity());
    try {
      t.train_step();
      ADD_FAILURE() << "expected the step to stop";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(" at step 1 left a NaN or Inf in it"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(m == "gemini" ? "chunk " : "transformer."),
                std::string::npos)
          << e.what();
    }
  }
}

// Note [Evaluation windows]: an evaluation reads whole --seq windows, each at most once: 4096
// tokens are 256 windows of 16, so --eval-batches 200 of 2 rows evaluates those 256 in 128 batches
// (the same loss as asking for 128) and says so. A --val-data of 100 tokens is 6 windows (4 tokens
// unread): in batches of 4, one of 4 rows and one of 2, with the loss of batches of 2. Until
// session 38 it wrapped around (a batch of 4 read 128 of the 100 tokens, the first 28 twice).
TEST(Trainer, AnEvaluationReadsTheValidationTokensAtMostOnce) {
  TempDir tmp;
  TrainOptions o = tiny(write_shard(tmp, "train.bin", 1), 1);
  o.val_data = write_shard(tmp, "val.bin", 2);
  o.eval_batches = 200;
  std::string printed;
  Trainer capped(o, [&](const std::string& line) { printed += line; });
  EXPECT_NE(printed.find("Evaluation: all 256 windows of --seq 16 in --val-data's 4096 tokens (the "
                         "last 0 unread), in 128 batches (--eval-batches 200 would read past its "
                         "end)"),
            std::string::npos)
      << printed;
  const EvalResult a = capped.evaluate();
  o.eval_batches = 128;
  Trainer exact(o, nullptr);
  const EvalResult b = exact.evaluate();
  EXPECT_EQ(a.batches, 128);
  EXPECT_EQ(a.loss, b.loss);

  std::vector<uint16_t> small(100);
  for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<uint16_t>((i * 7 + 3) % 97);
  data::write_token_shard(tmp.file("small.bin"), small);
  o.val_data = tmp.file("small.bin");
  o.eval_batches = 20;
  auto evaluated = [&](int64_t batch) {
    TrainOptions x = o;
    x.batch = batch;
    return Trainer(x, nullptr).evaluate();
  };
  const EvalResult by_two = evaluated(2), by_four = evaluated(4), by_one = evaluated(1);
  EXPECT_EQ(by_two.batches, 3);
  EXPECT_EQ(by_four.batches, 2);
  EXPECT_EQ(by_one.batches, 6);
  // The same 6 windows in other batch shapes: the GEMMs round otherwise (a few f32 ulps).
  EXPECT_NEAR(by_four.loss, by_two.loss, 1e-6);
  EXPECT_NEAR(by_one.loss, by_two.loss, 1e-6);
}

}  // namespace
}  // namespace mw::train
