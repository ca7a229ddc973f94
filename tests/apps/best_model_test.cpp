// gpt2_train --save-best and --early-stop (Note [Best model and early stopping],
// src/train/best_model.cpp): the model at the lowest val loss is the one saved, the run ends after
// the evaluations without a lower one, and a resumed run keeps the same best and count.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "../data/temp_dir.h"
#include "data/token_shard.h"
#include "run_app.h"

namespace mw {
namespace {

using data::testing::TempDir;
using testing::AppResult;

AppResult train(const std::string& args) { return testing::run_built_app("gpt2_train", args); }

struct Eval {
  int64_t step;
  std::string loss;  // as printed, "%.3f"
};

// The "[S] val loss: L ..." lines of a run.
std::vector<Eval> evals(const std::string& out) {
  std::vector<Eval> v;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);) {
    const size_t at = l.find("] val loss: ");
    if (l.empty() || l[0] != '[' || at == std::string::npos) continue;
    v.push_back(
        {std::stoll(l.substr(1, at - 1)), l.substr(at + 12, l.find(' ', at + 12) - at - 12)});
  }
  return v;
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Train on a fixed cycle of 97 tokens, validate on uniform random ones: as the model learns the
// cycle its predictions sharpen and the val loss rises after the first evaluations (overfitting,
// as a small fine-tuning set does), so the run stops early.
class BestModel : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<uint16_t> train(2000), val(2000);
    std::mt19937 gen(1);
    for (size_t i = 0; i < train.size(); ++i) train[i] = static_cast<uint16_t>((i * 7) % 97);
    for (uint16_t& t : val) t = static_cast<uint16_t>(gen() % 97);
    data::write_token_shard(tmp_.file("train_000000.bin"), train);
    data::write_token_shard(tmp_.file("val_000000.bin"), val);
  }
  std::string args(const std::string& run) const {
    return "--model tiny --seq 16 --batch 2 --threads 2 --steps 60 --lr 1e-2 --eval-every 2 "
           "--eval-batches 2 --early-stop 3 --data " +
           tmp_.path() + " --val-data " + tmp_.path() + " --save-best " + tmp_.file(run + "_best") +
           " --save " + tmp_.file(run + "_last") + " --checkpoint-dir " + tmp_.file(run + "_ck") +
           " --checkpoint-every 2 ";
  }
  TempDir tmp_;
};

TEST_F(BestModel, TheLowestValLossIsSavedAndEarlyStopEndsTheRunAcrossAResume) {
  const AppResult a = train(args("a"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::vector<Eval> e = evals(a.output);
  ASSERT_GE(e.size(), 4u) << a.output;
  // What the rules say, from the printed losses: the first lowest, then three evaluations
  // without a lower one end the run.
  size_t best = 0, since = 0, stop = e.size();
  for (size_t i = 1; i < e.size() && stop == e.size(); ++i) {
    if (std::stod(e[i].loss) < std::stod(e[best].loss))
      best = i, since = 0;
    else if (++since == 3)
      stop = i;
  }
  ASSERT_LT(stop, e.size()) << "the val loss kept falling: no early stop to check\n" << a.output;
  EXPECT_EQ(stop, e.size() - 1) << a.output;  // no evaluation after the stop
  EXPECT_NE(a.output.find("Stopped early after step " + std::to_string(e[stop].step) +
                          " (--early-stop 3): 3 evaluations without a val loss below " +
                          e[best].loss + " (step " + std::to_string(e[best].step) + ")"),
            std::string::npos)
      << a.output;
  EXPECT_NE(a.output.find("Best model: val loss " + e[best].loss + " at step " +
                          std::to_string(e[best].step)),
            std::string::npos)
      << a.output;
  EXPECT_EQ(a.output.find("step 60/60"), std::string::npos) << a.output;
  // The saved best is that model, --save the last one, and the stop step was checkpointed.
  const auto val_loss_of = [&](const std::string& model) {
    const AppResult r = train(
        "--model tiny --seq 16 --batch 2 --threads 2 --eval-only "
        "--eval-batches 2 --init-from " +
        model + " --val-data " + tmp_.path());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const std::vector<Eval> v = evals(r.output);
    return v.size() == 1 ? v[0].loss : "(none)";
  };
  EXPECT_EQ(val_loss_of(tmp_.file("a_best")), e[best].loss);
  EXPECT_EQ(val_loss_of(tmp_.file("a_last")), e[stop].loss);
  char last_ck[32];
  std::snprintf(last_ck, sizeof last_ck, "/step_%06lld", static_cast<long long>(e[stop].step));
  EXPECT_TRUE(std::filesystem::exists(tmp_.file("a_ck") + last_ck)) << last_ck;

  // A run whose last step is the stop's ends there anyway: nothing "stopped early".
  std::string to_stop = args("c");
  to_stop.replace(to_stop.find("--steps 60"), 10, "--steps " + std::to_string(e[stop].step));
  const AppResult c = train(to_stop);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(c.output.find("Stopped early"), std::string::npos) << c.output;
  EXPECT_EQ(evals(c.output).back().loss, e[stop].loss) << c.output;

  // Crash right after the step of the last evaluation before the stop (its checkpoint not yet
  // written), then resume: the checkpoint before it holds the best and the count since, so the
  // resumed run stops at the same step with the same best model. (Forgetting them, it saved its
  // first evaluation as a new best and ran three more.)
  const int64_t crash_after = e[stop - 1].step;
  ::setenv("MW_TEST_EXIT_RANK", "0", 1);
  ::setenv("MW_TEST_EXIT_STEP", std::to_string(crash_after - 1).c_str(), 1);
  const AppResult crashed = train(args("b"));
  ::unsetenv("MW_TEST_EXIT_RANK");
  ::unsetenv("MW_TEST_EXIT_STEP");
  ASSERT_EQ(crashed.exit_code, 3) << crashed.output;
  const AppResult b = train(args("b") + "--resume " + tmp_.file("b_ck"));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const std::vector<Eval> eb = evals(b.output);
  ASSERT_FALSE(eb.empty()) << b.output;
  EXPECT_EQ(eb.back().step, e[stop].step) << b.output;
  EXPECT_NE(b.output.find("Best model: val loss " + e[best].loss + " at step " +
                          std::to_string(e[best].step)),
            std::string::npos)
      << b.output;
  EXPECT_TRUE(read_bytes(tmp_.file("b_best/model.safetensors")) ==
              read_bytes(tmp_.file("a_best/model.safetensors")))
      << "the resumed run saved another best model";
}

// A stop signal after a step due an evaluation skips it (Note [Stop signals]); the resumed run
// makes it up before its first step, so its evaluations, best model and stop are the
// uninterrupted run's. (It did not: --save-best kept another model, --early-stop stopped later.)
TEST_F(BestModel, AnEvaluationASignalSkippedIsMadeUpOnResume) {
  const AppResult a = train(args("a"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::vector<Eval> e = evals(a.output);
  ASSERT_GE(e.size(), 3u) << a.output;
  const int64_t at = e[1].step;  // the signal lands after this step, its evaluation due
  ::setenv("MW_TEST_EXIT_RANK", "0", 1);
  ::setenv("MW_TEST_EXIT_STEP", std::to_string(at - 1).c_str(), 1);
  ::setenv("MW_TEST_EXIT_HOW", "sigterm", 1);
  const AppResult s = train(args("s"));
  for (const char* v : {"MW_TEST_EXIT_RANK", "MW_TEST_EXIT_STEP", "MW_TEST_EXIT_HOW"})
    ::unsetenv(v);
  ASSERT_EQ(s.exit_code, 143) << s.output;
  std::vector<Eval> both = evals(s.output);
  ASSERT_EQ(both.size(), 1u) << s.output;  // e[0]'s; e[1]'s skipped
  const AppResult r = train(args("s") + "--resume " + tmp_.file("s_ck"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const Eval& v : evals(r.output)) both.push_back(v);
  ASSERT_EQ(both.size(), e.size()) << r.output;
  for (size_t i = 0; i < e.size(); ++i) {
    EXPECT_EQ(both[i].step, e[i].step) << i;
    EXPECT_EQ(both[i].loss, e[i].loss) << i;
  }
  EXPECT_TRUE(read_bytes(tmp_.file("s_best/model.safetensors")) ==
              read_bytes(tmp_.file("a_best/model.safetensors")));
}

// The log marks the evaluations --save-best saved, and tools/loss_curve_svg.py plots the run from
// it: a line per loss, a dot per evaluation, a ring per saved best.
TEST_F(BestModel, TheLogMarksTheBestAndTheCurveToolPlotsIt) {
  if (std::system("command -v python3 > /dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  const AppResult a = train(args("a") + "--log " + tmp_.file("log.jsonl"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::vector<Eval> e = evals(a.output);
  std::ifstream log(tmp_.file("log.jsonl"));
  size_t marked = 0, printed = 0;
  for (std::string line; std::getline(log, line);)
    marked += line.find("\"best\":true") != std::string::npos;
  std::istringstream out(a.output);
  for (std::string line; std::getline(out, line);)
    printed += line.find("| best so far") != std::string::npos;
  EXPECT_GT(marked, 0u);
  EXPECT_EQ(marked, printed);
  const std::string tool = std::string(MW_SOURCE_DIR) + "/tools/loss_curve_svg.py ";
  const AppResult plot = testing::run_command("python3 " + tool + tmp_.file("log.jsonl") + " " +
                                              tmp_.file("curve.svg"));
  ASSERT_EQ(plot.exit_code, 0) << plot.output;
  EXPECT_NE(plot.output.find(std::to_string(e.size()) + " evaluations"), std::string::npos)
      << plot.output;
  const std::string svg = read_bytes(tmp_.file("curve.svg"));
  size_t circles = 0;
  for (size_t at = svg.find("<circle"); at != std::string::npos; at = svg.find("<circle", at + 1))
    ++circles;
  EXPECT_EQ(circles, e.size() + marked) << svg;
  EXPECT_NE(svg.find("ringed: saved by --save-best"), std::string::npos);
  const AppResult bad = testing::run_command("python3 " + tool + tmp_.file("train_000000.bin") +
                                             " " + tmp_.file("x.svg"));
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("is not a record of gpt2_train --log"), std::string::npos)
      << bad.output;
}

TEST_F(BestModel, OptionsThatCannotWorkAreRefusedBeforeTraining) {
  const auto refused = [&](const std::string& args, const std::string& message) {
    const AppResult r = train("--model tiny --seq 16 --batch 2 --steps 2 " + args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
  };
  refused("--save-best " + tmp_.file("m"), "--save-best and --early-stop compare evaluations");
  refused("--val-data " + tmp_.path() + " --early-stop 2", "pass --eval-every N");
  refused(
      "--val-data " + tmp_.path() + " --save-best " + tmp_.file("m") + " --save " + tmp_.file("m"),
      "--save and --save-best both name");
  refused("--val-data " + tmp_.path() + " --save-best " + tmp_.file("m") + " --log " +
              tmp_.file("m/log.jsonl"),
          "lies inside --save-best");
  EXPECT_FALSE(std::filesystem::exists(tmp_.file("m")));
}

}  // namespace
}  // namespace mw
