// Checkpoints and optimizer files under ZeRO (Note [ZeRO checkpoints], train/zero_state_file.h),
// end to end with gpt2_train: a 2-rank --zero 1|2 run killed after its step-3 checkpoint resumes
// bit for bit; its checkpoint is the one-process format and resumes in one process without
// --zero, and a one-process checkpoint resumes at 2 ranks under --zero 2; --save-optimizer and
// --load-optimizer round-trip the same bytes. Tiny model, --dropout 0 (Note [Global batch]).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <vector>

#include "../data/temp_dir.h"
#include "dist_train.h"

namespace mw {
namespace {

using data::testing::TempDir;
using testing::AppResult;
using namespace testing::dist_train;

const std::string kSixSteps = kTiny + "--steps 6 ";

std::string checkpoints(const std::string& dir) {  // every 3 steps
  return " --checkpoint-every 3 --checkpoint-dir " + dir + "/ckpt ";
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The header of an optimizer file (Note [Optimizer checkpoint format]): everything before m, v.
std::string state_header(const std::string& path) {
  const std::string b = file_bytes(path);
  auto i64 = [&](size_t at) {
    int64_t x = 0;
    if (at + 8 <= b.size()) std::memcpy(&x, b.data() + at, 8);
    return x;
  };
  size_t at = 24;
  for (int64_t p = 0, n = i64(16); p < n && at < b.size(); ++p) at += 16 + 24 * i64(at + 8);
  return b.substr(0, std::min(at, b.size()));
}

// Losses k.. of a log, from its step `first` (1-based) on.
std::vector<double> losses_from(const std::string& log, size_t first) {
  const std::vector<double> all = losses(log);
  return first - 1 <= all.size() ? std::vector<double>(all.begin() + first - 1, all.end())
                                 : std::vector<double>{};
}

void expect_near_losses(const std::vector<double>& a, const std::vector<double>& b,
                        const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], kLossTol) << what << " " << i;
}

void expect_near_weights(const std::string& a_dir, const std::string& b_dir,
                         const std::string& what) {
  const auto wa = weights(a_dir), wb = weights(b_dir);
  ASSERT_EQ(wa.size(), wb.size()) << what;
  for (const auto& [name, v] : wa)
    for (size_t i = 0; i < v.size(); ++i)
      ASSERT_NEAR(v[i], wb.at(name)[i], kWeightTol) << what << " " << name << "[" << i << "]";
}

struct Stop {
  const char* options;  // beyond kSixSteps
  bool sigterm;         // rank 1 gets SIGTERM at step 4 (else it dies there)
};

// The ctest name shows the options (not the struct's bytes, which hold a pointer).
void PrintTo(const Stop& s, std::ostream* os) {
  *os << s.options << (s.sigterm ? ", SIGTERM" : ", killed");
}

// The one-process run of 6 steps with a checkpoint at step 3: the reference of every comparison
// across rank counts, made once per test process (ctest runs each test in its own: 0.4 s each).
class ZeroCheckpoint : public ::testing::TestWithParam<Stop> {
 protected:
  static void SetUpTestSuite() {
    if (::mw::testing::is_mpi_worker() || !::mw::testing::mpi_unavailable().empty()) return;
    dir_ = new TempDir;
    const std::string one = dir_->path() + "/one";
    AppResult r = train(0, kSixSteps + outputs(one) + checkpoints(one));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string one() { return dir_->path() + "/one"; }
  static TempDir* dir_;
};
TempDir* ZeroCheckpoint::dir_ = nullptr;

// (a) killed after the step-3 checkpoint (rank 1 dies at step 4, mpirun stops the job), or
// stopped by a SIGTERM that rank 1 alone gets at step 4 (the ranks agree to write the step-4
// checkpoint together and exit 143), then resumed at 2 ranks: the same rank count and order, so
// the steps after the checkpoint are bit for bit those of the uninterrupted run, as are the final
// weights and the step-6 optimizer file. (b) the same
// checkpoint resumed by one process without --zero equals the one-process run within the
// tolerances of dist_train.h (the all-reduce sums in another order), and it is in the one-process
// format: the same files, the same optimizer header (segments and step counts).
TEST_P(ZeroCheckpoint, ResumesExactlyAndInOneProcess) {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  const Stop stop = GetParam();
  const std::string options = kSixSteps + stop.options + " ";
  const std::string full = tmp.path() + "/full", cut = tmp.path() + "/cut";
  AppResult a = train(2, options + outputs(full) + checkpoints(full));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  AppResult k = train(2, options + outputs(cut) + checkpoints(cut), 60,
                      std::string("MW_TEST_EXIT_RANK=1 MW_TEST_EXIT_STEP=3") +  // 0-based
                          (stop.sigterm ? " MW_TEST_EXIT_HOW=sigterm" : ""));
  ASSERT_NE(k.exit_code, 0) << k.output;
  ASSERT_TRUE(std::filesystem::exists(cut + "/ckpt/step_000003")) << k.output;
  EXPECT_EQ(std::filesystem::exists(cut + "/ckpt/step_000004"), stop.sigterm) << k.output;
  if (stop.sigterm) {
    EXPECT_NE(k.output.find("rank 0: interrupted by SIGTERM"), std::string::npos) << k.output;
  }
  ASSERT_FALSE(std::filesystem::exists(cut + "/ckpt/step_000005")) << k.output;
  std::filesystem::remove(cut + "/log.jsonl");
  AppResult b = train(2, options + outputs(cut) + checkpoints(cut) + "--resume " + cut + "/ckpt");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(losses(cut + "/log.jsonl"), losses_from(full + "/log.jsonl", stop.sigterm ? 5 : 4));
  EXPECT_TRUE(file_bytes(cut + "/model/model.safetensors") ==
              file_bytes(full + "/model/model.safetensors"))
      << "final weights differ";
  EXPECT_TRUE(file_bytes(cut + "/ckpt/step_000006/optimizer.bin") ==
              file_bytes(full + "/ckpt/step_000006/optimizer.bin"))
      << "final optimizer states differ";

  const std::string ckpt = full + "/ckpt/step_000003", ref = one() + "/ckpt/step_000003";
  for (const char* f : {"manifest.json", "trainer.json", "optimizer.bin", "model"})
    EXPECT_TRUE(std::filesystem::exists(ckpt + "/" + f)) << f;
  EXPECT_EQ(std::filesystem::file_size(ckpt + "/optimizer.bin"),
            std::filesystem::file_size(ref + "/optimizer.bin"));
  EXPECT_TRUE(state_header(ckpt + "/optimizer.bin") == state_header(ref + "/optimizer.bin"));
  const std::string alone = tmp.path() + "/alone";
  AppResult c = train(0, kSixSteps + outputs(alone) + "--resume " + ckpt);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  expect_near_losses(losses(alone + "/log.jsonl"), losses_from(one() + "/log.jsonl", 4),
                     "2 ranks -> 1 process");
  expect_near_weights(alone + "/model", one() + "/model", "2 ranks -> 1 process");
}

// (c) with this rank's half of m and v on NVMe, the same. (d) plain data parallel (stage 0): the
// ranks agree on a stop there too (before session 25 rank 1 exited alone after step 4 and mpirun
// killed rank 0 before it wrote step_000004; Gemini at stage 0, whose checkpoints are in its
// chunks' layout, is swept by tools/auto_sweep.py signal --ranks 2).
INSTANTIATE_TEST_SUITE_P(Zero, ZeroCheckpoint,
                         ::testing::Values(Stop{"--zero 1", false}, Stop{"--zero 2", true},
                                           Stop{"--zero 2 --offload nvme --nvme-window 1MiB",
                                                false},
                                           Stop{"--zero 0", true}));

// (b) the other way: the one-process checkpoint resumed at 2 ranks under --zero 2.
TEST_F(ZeroCheckpoint, OneProcessCheckpointResumesUnderZero) {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  const std::string two = tmp.path() + "/two";
  AppResult r =
      train(2, kSixSteps + "--zero 2 " + outputs(two) + "--resume " + one() + "/ckpt/step_000003");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_near_losses(losses(two + "/log.jsonl"), losses_from(one() + "/log.jsonl", 4),
                     "1 process -> 2 ranks");
  expect_near_weights(two + "/model", one() + "/model", "1 process -> 2 ranks");
}

// (e) Note [Optimizer layouts]: the same one-process checkpoint (the model's parameters) resumed
// at 2 ranks by Gemini --zero 3, whose optimizer steps pieces of small chunks (several model
// parameters each, padding between them): every piece reads its runs of the model's parameters.
TEST_F(ZeroCheckpoint, OneProcessCheckpointResumesUnderGeminiZero3WithSmallChunks) {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  const std::string two = tmp.path() + "/two";
  AppResult r =
      train(2, kSixSteps + "--device sim:256MiB --gemini auto --zero 3 --chunk-size 3000 " +
                   outputs(two) + "--resume " + one() + "/ckpt/step_000003");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_near_losses(losses(two + "/log.jsonl"), losses_from(one() + "/log.jsonl", 4),
                     "1 process -> Gemini, 2 ranks");
  expect_near_weights(two + "/model", one() + "/model", "1 process -> Gemini, 2 ranks");
}

// (d) --save-optimizer under --zero 1 writes the file that one process loads and writes back
// byte for byte, and so do --zero 2 and Gemini --zero 3 at 2 ranks; --load-optimizer under --zero
// 2 (with the weights of step 3) goes on as the one-process run does, and so does one process
// loading what Gemini --zero 3 saved after 3 steps.
TEST_F(ZeroCheckpoint, SaveAndLoadOptimizer) {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  const std::string d = tmp.path(), three = kTiny + "--steps 3 ";
  AppResult r = train(2, three + "--zero 1 --save " + d + "/m --save-optimizer " + d + "/x.bin");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = train(0,
            kTiny + "--steps 0 --load-optimizer " + d + "/x.bin --save-optimizer " + d + "/y.bin");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(file_bytes(d + "/x.bin") == file_bytes(d + "/y.bin")) << "one process rewrote it";
  r = train(2, kTiny + "--steps 0 --zero 2 --load-optimizer " + d + "/y.bin --save-optimizer " + d +
                   "/z.bin");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(file_bytes(d + "/y.bin") == file_bytes(d + "/z.bin")) << "ZeRO 2 rewrote it";
  // Gemini under ZeRO steps pieces of its chunks (several parameters each, padding between them)
  // and saves them as the model's parameters (Note [Saving in the model's layout]).
  const std::string gemini = "--device sim:256MiB --gemini auto --zero 3 --chunk-size 3000 ";
  r = train(2, kTiny + "--steps 0 " + gemini + "--load-optimizer " + d +
                   "/y.bin --save-optimizer " + d + "/g.bin");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(file_bytes(d + "/y.bin") == file_bytes(d + "/g.bin")) << "Gemini ZeRO 3 rewrote it";
  const std::string on = d + "/on";
  r = train(
      2, three + "--zero 2 --init-from " + d + "/m --load-optimizer " + d + "/x.bin" + outputs(on));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Loaded optimizer state (step 3)"), std::string::npos) << r.output;
  expect_near_losses(losses(on + "/log.jsonl"), losses_from(one() + "/log.jsonl", 4),
                     "--load-optimizer under --zero 2");
  expect_near_weights(on + "/model", one() + "/model", "--load-optimizer under --zero 2");
  // What Gemini under ZeRO saves after training, its chunks and states on disk, loads into one
  // process without Gemini.
  r = train(2, three + gemini + "--host-capacity 120KiB --nvme-window 16KiB --nvme-dir " + d +
                   "/nv --save " + d + "/gm --save-optimizer " + d + "/g3.bin");
  EXPECT_NE(r.output.find("Adam states on disk"), std::string::npos) << r.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string plain = d + "/plain";
  r = train(0,
            three + "--init-from " + d + "/gm --load-optimizer " + d + "/g3.bin" + outputs(plain));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Loaded optimizer state (step 3)"), std::string::npos) << r.output;
  expect_near_losses(losses(plain + "/log.jsonl"), losses_from(one() + "/log.jsonl", 4),
                     "Gemini ZeRO 3's --save-optimizer in one process");
  expect_near_weights(plain + "/model", one() + "/model",
                      "Gemini ZeRO 3's --save-optimizer in one process");
}

// SIGTERM to rank 1 alone after the last step (Note [Stop signals]): every rank finishes the saves
// (--save-optimizer gathers the ZeRO 2 pieces), rank 1 waits for rank 0's writes before it exits
// 143, and the saved model and optimizer file are the uninterrupted run's. Rank 1 used to throw the
// saves away; leaving at once, it would have had mpirun kill rank 0 mid-write.
TEST(ZeroSaves, ASignalToOneRankAfterTheLastStepLetsRankZeroFinishTheSaves) {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  const std::string options = kSixSteps + "--zero 2 ";
  const std::string full = tmp.path() + "/full", cut = tmp.path() + "/cut";
  AppResult a = train(2, options + outputs(full) + "--save-optimizer " + full + "/opt.bin");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  AppResult k = train(2, options + outputs(cut) + "--save-optimizer " + cut + "/opt.bin", 60,
                      "MW_TEST_EXIT_RANK=1 MW_TEST_EXIT_STEP=5 MW_TEST_EXIT_HOW=sigterm");
  EXPECT_NE(k.exit_code, 0) << k.output;
  EXPECT_NE(k.output.find("rank 1: interrupted by SIGTERM after the last step: finished its saves "
                          "first"),
            std::string::npos)
      << k.output;
  EXPECT_TRUE(file_bytes(cut + "/model/model.safetensors") ==
              file_bytes(full + "/model/model.safetensors"))
      << "the saved weights differ";
  EXPECT_TRUE(file_bytes(cut + "/opt.bin") == file_bytes(full + "/opt.bin"))
      << "the saved optimizer states differ";
}

// SIGTERM to rank 1 alone in step 4 (index 3) of a run evaluated after every step with
// --save-best: the ranks agree to skip that step's evaluation, whose verdict is a collective, and
// write the step-4 checkpoint. Until session 38 rank 1 skipped it alone: its agreement on the
// signal was paired with rank 0's verdict (rank 0 then saved a worse model as the best, "[4] ...
// best so far"), and the collectives after were off by one (step_000004 was never written; at
// --zero 2 the save read garbage step counts). Found by a read-only review.
TEST(ZeroSaves, ASignalToOneRankSkipsTheEvaluationOnEveryRank) {
  SKIP_WITHOUT_MPI();
  for (const char* zero : {"--zero 0 ", "--zero 2 "}) {
    SCOPED_TRACE(zero);
    TempDir tmp;
    std::vector<uint16_t> tokens(4000);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 31) % 97);
    data::write_token_shard(tmp.file("val.bin"), tokens);
    const std::string options = kSixSteps + zero + "--val-data " + tmp.file("val.bin") +
                                " --eval-every 1 --eval-batches 2 --save-best " + tmp.file("best") +
                                " --checkpoint-every 2 --checkpoint-dir " + tmp.file("ckpt") + " ";
    AppResult k =
        train(2, options, 60, "MW_TEST_EXIT_RANK=1 MW_TEST_EXIT_STEP=3 MW_TEST_EXIT_HOW=sigterm");
    EXPECT_NE(k.exit_code, 0) << k.output;
    EXPECT_TRUE(std::filesystem::exists(tmp.file("ckpt/step_000004"))) << k.output;
    EXPECT_NE(k.output.find("rank 0: interrupted by SIGTERM during step 3"), std::string::npos)
        << k.output;
    EXPECT_EQ(k.output.find("[4] val loss"), std::string::npos) << k.output;
    AppResult b = train(2, options + "--resume " + tmp.file("ckpt"));
    EXPECT_EQ(b.exit_code, 0) << b.output;
  }
}

// Each rank reads --resume itself: ranks that see different newest checkpoints (node-local
// folders, a copy out of date; here two step folders, one per rank, through mpirun's MPMD form)
// are refused before the model is built, every rank naming what it took. Until session 38 they
// trained on mixed data positions and states (found by a read-only review).
TEST(ZeroSaves, RanksThatResumeDifferentStepsAreRefused) {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  const std::string options = kSixSteps + "--zero 2 ";
  ASSERT_EQ(train(2, options + checkpoints(tmp.path())).exit_code, 0);
  const std::string app = std::string(MW_BINARY_DIR) + "/apps/gpt2_train ";
  const AppResult r =
      ::mw::testing::run_command(::mw::testing::mpirun_prefix(1, 60) + app + options + "--resume " +
                                 tmp.file("ckpt/step_000003") + " : -np 1 " + app + options +
                                 "--resume " + tmp.file("ckpt/step_000006") + " </dev/null");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1: error: --resume '" + tmp.file("ckpt/step_000006") +
                          "': this rank took"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("1 of the 2 ranks see another newest checkpoint than rank 0"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("Model numel"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace mw
