// Data parallel training end to end: gpt2_train under `mpirun -np 2` against one process on the
// same global batch (plain data parallel and ZeRO 1, 2 and 3), checkpoints moving between rank
// counts, a rank that dies or stalls, and the options a multi-rank run refuses. Tiny models (29,600
// parameters), --dropout 0 except where dropout is what is tested (Note [Dropout under data
// parallel]).
#include <gtest/gtest.h>

#include <filesystem>
#include <ostream>
#include <regex>

#include "../data/temp_dir.h"
#include "dist_train.h"

namespace mw {
namespace {

using data::testing::TempDir;
using testing::AppResult;
using namespace testing::dist_train;

struct Case {
  int zero;
  const char* options;             // beyond kTiny
  const char* ranks_options = "";  // for the data-parallel run only
};

// The ctest name shows the options (not the struct's bytes, which hold a pointer).
void PrintTo(const Case& c, std::ostream* os) {
  *os << "--zero " << c.zero << " " << c.options << (*c.ranks_options ? " " : "")
      << c.ranks_options;
}

class DataParallelMatchesOneProcess : public ::testing::TestWithParam<Case> {};

// Three tiers on the tiny model: 13 chunks of 16 KiB, a host budget that homes most on disk.
constexpr const char* kThreeTiersNoAccum =
    "--device sim:64MiB --gemini auto --chunk-size 4096 --host-capacity 180KiB --nvme-window 64KiB";
// Accumulating, the budget also counts the gradients kept until the step and step()'s second RAM
// copy (Note [Three tiers]): 9 of 13 chunks on disk at stages 0 and 2.
constexpr const char* kThreeTiers =
    "--device sim:64MiB --gemini auto --chunk-size 4096 --host-capacity 220KiB --nvme-window 64KiB "
    "--grad-accum 2 --grad-clip 0.5";
// (Under sharded states the reserve covers step()'s all_gathers beside two chunks' RAM copies,
// Note [Three tiers]: 216 KiB keeps every piece in RAM.)
constexpr const char* kThreeTiersZero3 =
    "--device sim:64MiB --gemini auto --chunk-size 4096 --host-capacity 216KiB --nvme-window 64KiB";
// Note [Pieces on disk]: at --zero 3 a budget too small for this rank's pieces homes some on disk.
constexpr const char* kPiecesOnDisk =
    "--device sim:64MiB --gemini auto --chunk-size 4096 --host-capacity 120KiB --nvme-window 16KiB";
// The same accumulating, with this rank's pieces of the gradients kept until the step: 9 of 13
// pieces on disk.
constexpr const char* kPiecesOnDiskAccumOnly =
    "--device sim:64MiB --gemini auto --chunk-size 4096 --host-capacity 192KiB --nvme-window 16KiB "
    "--grad-accum 2";
constexpr const char* kPiecesOnDiskAccum =
    "--device sim:64MiB --gemini auto --chunk-size 4096 --host-capacity 192KiB --nvme-window 16KiB "
    "--grad-accum 2 --grad-clip 0.5 --dropout 0.1";

TEST_P(DataParallelMatchesOneProcess, LossesAndWeights) {
  SKIP_WITHOUT_MPI();
  const Case c = GetParam();
  TempDir tmp;
  const std::string one = tmp.path() + "/one", two = tmp.path() + "/two";
  // The reference is one plain process (--zero 0: no DataParallel at all), so that a fault shared
  // by one and two ranks of the data-parallel path cannot cancel out.
  const std::string args = kTiny + "--steps 4 " + c.options;
  AppResult a = train(0, args + " --zero 0" + outputs(one));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  AppResult b =
      train(2, args + " --zero " + std::to_string(c.zero) + " " + c.ranks_options + outputs(two));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("Data parallel: 2 ranks (mpi), ZeRO stage " + std::to_string(c.zero)),
            std::string::npos)
      << b.output;
  // Note [Split embedding reduction]: wte's dense part went out during backward (not when its
  // gradient accumulates over micro-batches: the rows-ready hook needs a first contribution).
  const std::string options = c.options;
  const bool split = options.find("--grad-accum") == std::string::npos &&
                     options.find("--gemini") == std::string::npos;  // Gemini reduces chunks
  EXPECT_EQ(b.output.find("1.0 embedding gradient(s) per step reduced during backward") !=
                std::string::npos,
            split)
      << b.output;
  // Note [Sharded parameters]: Gemini's chunks keep pieces at --zero 3 or with a share given.
  const bool shards =
      options.find("--gemini") != std::string::npos && (c.zero == 3 || *c.ranks_options != '\0');
  EXPECT_EQ(b.output.find("sharded across 2 ranks: this rank homes its") != std::string::npos,
            shards)
      << b.output;
  // Note [Updates as reductions complete]: without clipping or accumulation, chunks are updated
  // in backward, one behind their reductions: all but the last (with more than one chunk).
  // --update-in-backward off keeps them for the step.
  if (!split && options.find("--grad-") == std::string::npos) {
    std::smatch m;
    const std::regex updated("Gemini updated ([0-9.]+) of ([0-9]+) chunks per step in backward");
    const bool eager = options.find("--update-in-backward off") == std::string::npos;
    ASSERT_EQ(std::regex_search(b.output, m, updated), eager) << b.output;
    if (!eager) return expect_same_run(one, two);
    EXPECT_EQ(std::stod(m[1]) > 0, std::stod(m[2]) > 1) << m[0];
    EXPECT_LT(std::stod(m[1]), std::stod(m[2])) << m[0];
  }
  // Note [Three tiers under data parallel]: each rank's own budget homed chunks (replicated
  // ones) or Adam states on disk.
  if (options.find("--host-capacity") != std::string::npos) {
    EXPECT_NE(b.output.find(c.zero == 3 ? "beyond --host-capacity (three tiers)" : "homed on disk"),
              std::string::npos)
        << b.output;
    // Note [Pieces on disk]: only where the budget is too small for the pieces.
    const bool pieces = options == kPiecesOnDisk || options == kPiecesOnDiskAccumOnly ||
                        options == kPiecesOnDiskAccum;
    EXPECT_EQ(
        b.output.find("this rank's pieces of sharded chunks) homed on disk") != std::string::npos,
        pieces)
        << b.output;
  }
  // Note [Pieces on disk]: updated in backward, a piece is read once in forward and once in
  // backward (kept for its update), and written once (here no replicated chunk is on disk).
  if (options == kPiecesOnDisk) {
    const std::vector<double> read = per_step(two + "/log.jsonl", "nvme_read_bytes"),
                              written = per_step(two + "/log.jsonl", "nvme_write_bytes");
    ASSERT_EQ(read.size(), written.size());
    ASSERT_GE(read.size(), 2u);
    for (size_t s = 1; s < read.size(); ++s) {  // step 0 also writes every piece as it is filled
      EXPECT_GT(written[s], 0) << "step " << s;
      EXPECT_EQ(read[s], 2 * written[s]) << "step " << s;
    }
  }
  expect_same_run(one, two);
}

// Accumulation keeps gradients local until the last micro-batch; clipping needs the norm over
// every rank's piece (stages 1-2); sim tensors, the AdamW reference and HybridAdam with this
// rank's piece of m and v on NVMe take the same path.
INSTANTIATE_TEST_SUITE_P(Zero, DataParallelMatchesOneProcess,
                         ::testing::Values(Case{0, ""}, Case{1, ""}, Case{2, ""},
                                           Case{0, "--grad-accum 2 --grad-clip 0.5"},
                                           Case{2, "--grad-accum 2 --grad-clip 0.5"},
                                           Case{1, "--device sim:1GiB --optimizer adamw"},
                                           Case{2, "--offload nvme --nvme-window 1MiB"},
                                           // Note [Dropout under data parallel]: the same masks
                                           Case{0, "--dropout 0.1"},
                                           Case{2, "--dropout 0.1 --checkpoint-activations"},
                                           // Note [ZeRO stage 3]: the same paths with the
                                           // parameters gathered around each use; recomputation
                                           // gathers again inside backward
                                           Case{3, ""}, Case{3, "--grad-accum 2 --grad-clip 0.5"},
                                           Case{3, "--device sim:1GiB --optimizer adamw"},
                                           Case{3, "--offload nvme --nvme-window 1MiB"},
                                           // Note [Weight decay by ranges]: pieces of the
                                           // parameters left alone whole; ranges inside pieces
                                           // of chunks
                                           Case{1, "--weight-decay 0.5"},
                                           Case{3,
                                                "--weight-decay 0.5 --offload nvme "
                                                "--nvme-window 1MiB"},
                                           Case{2,
                                                "--weight-decay 0.5 --device sim:64MiB "
                                                "--gemini auto --chunk-size 4096"},
                                           Case{3,
                                                "--weight-decay 0.5 --device sim:64MiB "
                                                "--gemini static --offload-param-frac 0.5 "
                                                "--offload-optim-frac 1 --chunk-size 4096"},
                                           Case{3, "--dropout 0.1 --checkpoint-activations"},
                                           // Note [Gemini under data parallel]: replicated chunks,
                                           // each chunk's gradient all_reduced; every policy
                                           Case{0, "--device sim:64MiB --gemini auto"},
                                           Case{0,
                                                "--device sim:64MiB --gemini static "
                                                "--offload-param-frac 1 --offload-optim-frac 1 "
                                                "--grad-accum 2 --grad-clip 0.5"},
                                           Case{0,
                                                "--device sim:64MiB --gemini const "
                                                "--const-budget 1MiB --dropout 0.1 "
                                                "--checkpoint-activations"},
                                           // Note [Sharded optimizer states]: each rank steps
                                           // its piece of every chunk; clipping sums the
                                           // pieces' squares over the ranks
                                           Case{2, "--device sim:64MiB --gemini auto"},
                                           Case{2,
                                                "--device sim:64MiB --gemini static "
                                                "--offload-param-frac 0.5 --offload-optim-frac 1 "
                                                "--grad-accum 2 --grad-clip 0.5"},
                                           Case{2,
                                                "--device sim:64MiB --gemini const "
                                                "--const-budget 1MiB --dropout 0.1 "
                                                "--checkpoint-activations"},
                                           // Note [Sharded parameters]: chunks keep their
                                           // pieces, gathered around their ops (small chunks:
                                           // several per block); pieces homed on the device;
                                           // half the chunks sharded
                                           Case{3,
                                                "--device sim:64MiB --gemini auto "
                                                "--chunk-size 4096"},
                                           Case{3,
                                                "--device sim:64MiB --gemini static "
                                                "--offload-param-frac 0.5 --offload-optim-frac 1 "
                                                "--chunk-size 4096 --grad-accum 2 --grad-clip 0.5"},
                                           Case{3,
                                                "--device sim:64MiB --gemini const "
                                                "--const-budget 1MiB --chunk-size 4096 "
                                                "--dropout 0.1 --checkpoint-activations"},
                                           Case{2,
                                                "--device sim:64MiB --gemini auto "
                                                "--chunk-size 4096",
                                                "--shard-param-frac 0.5"},
                                           // Note [Three tiers under data parallel]: chunks
                                           // homed on disk (their gradient buffers spilled
                                           // after their reductions), Adam states on disk;
                                           // at --zero 3 with room for the pieces, states only
                                           Case{0, kThreeTiers}, Case{2, kThreeTiers},
                                           Case{2, kThreeTiersNoAccum, "--shard-param-frac 0.5"},
                                           Case{3, kThreeTiersZero3},
                                           // Note [Pieces on disk]: sharded chunks' pieces
                                           // homed on disk too, updated in backward or at the
                                           // step
                                           Case{3, kPiecesOnDisk}, Case{3, kPiecesOnDiskAccum},
                                           // Note [Updates in the last backward]:
                                           // accumulation alone, chunks updated in the last
                                           // micro-batch's backward (pieces on disk too)
                                           Case{0,
                                                "--device sim:64MiB --gemini auto --chunk-size "
                                                "4096 --grad-accum 2"},
                                           Case{2,
                                                "--device sim:64MiB --gemini auto --chunk-size "
                                                "4096 --grad-accum 2 --dropout 0.1"},
                                           Case{3, kPiecesOnDiskAccumOnly},
                                           // Note [Updates as reductions complete]: off
                                           Case{2,
                                                "--device sim:64MiB --gemini auto --chunk-size "
                                                "4096 --update-in-backward off"}));

// Four ranks (oversubscribed: one row of the global batch each) at every stage against one plain
// process; then stage 2's checkpoint, written by 4 ranks, resumed by 2 (Note [ZeRO checkpoints]).
TEST(DataParallelFourRanks, MatchOneProcessAndMoveTheirCheckpointToTwo) {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  const std::string args = kTiny + "--steps 4 ";
  const std::string one = tmp.path() + "/one";
  ASSERT_EQ(train(0, args + "--zero 0" + outputs(one)).exit_code, 0);
  for (int zero : {0, 1, 2, 3}) {
    SCOPED_TRACE("--zero " + std::to_string(zero));
    const std::string four = tmp.path() + "/four" + std::to_string(zero);
    AppResult r = train(4,
                        args + "--zero " + std::to_string(zero) + outputs(four) +
                            "--checkpoint-every 2 --checkpoint-dir " + four + "/ckpt",
                        120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("Data parallel: 4 ranks (mpi)"), std::string::npos) << r.output;
    expect_same_run(one, four);
  }
  for (int zero : {2, 3}) {
    SCOPED_TRACE("resumed at --zero " + std::to_string(zero));
    const std::string resumed = tmp.path() + "/resumed" + std::to_string(zero);
    AppResult b =
        train(2, args + "--zero " + std::to_string(zero) + outputs(resumed) + "--resume " +
                     tmp.path() + "/four" + std::to_string(zero) + "/ckpt/step_000002");
    ASSERT_EQ(b.exit_code, 0) << b.output;
    expect_same_run(one, resumed, 2);
  }
}

// The checkpoint `two` wrote at step 2, resumed at 4 ranks (with `ranks_args`) and in one process,
// gives what one process `one` gave from the start.
void expect_resumes_across_rank_counts(const TempDir& tmp, const std::string& args,
                                       const std::string& ranks_args, const std::string& one,
                                       const std::string& two) {
  for (int ranks : {4, 0}) {
    SCOPED_TRACE(str(ranks, " ranks"));
    const std::string resumed = tmp.path() + "/resumed" + std::to_string(ranks);
    AppResult r = train(ranks,
                        args + (ranks > 0 ? ranks_args : "") + outputs(resumed) + "--resume " +
                            two + "/ckpt/step_000002",
                        120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    expect_same_run(one, resumed, 2);
  }
}

// Note [Sharded optimizer states]: Gemini's pieces of the Adam states go into one process's file,
// so a checkpoint written by 2 ranks at --zero 2 resumes at 4 ranks and in one process, each
// giving what one process gives from the start.
TEST(DataParallelGeminiZero2, CheckpointsMoveBetweenRankCounts) {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  const std::string args = kTiny + "--steps 4 --device sim:64MiB --gemini auto ";
  const std::string one = tmp.path() + "/one", two = tmp.path() + "/two";
  ASSERT_EQ(train(0, args + outputs(one)).exit_code, 0);
  AppResult r = train(
      2, args + "--zero 2 --checkpoint-every 2 --checkpoint-dir " + two + "/ckpt" + outputs(two));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Adam states 0.1 MiB in memory for this rank's pieces, 14,800 of 29,600"),
            std::string::npos)
      << r.output;
  expect_same_run(one, two);
  expect_resumes_across_rank_counts(tmp, args, "--zero 2 ", one, two);
}

// Note [Sharded parameters]: with Gemini's chunks sharded (13 chunks here), evaluation and
// sampling are collective forwards, saving gathers each chunk on every rank while rank 0 writes,
// and a checkpoint written by 2 ranks resumes at 4 ranks and in one process; every run gives what
// one process gives from the start.
TEST(DataParallelGeminiZero3, EvaluatesSamplesSavesAndMovesCheckpoints) {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  const std::string args = kTiny + "--steps 4 --device sim:64MiB --gemini auto --chunk-size 4096 " +
                           eval_and_sample(tmp);
  const std::string one = tmp.path() + "/one", two = tmp.path() + "/two";
  AppResult a = train(0, args + outputs(one));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  AppResult b = train(
      2, args + "--zero 3 --checkpoint-every 2 --checkpoint-dir " + two + "/ckpt" + outputs(two));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("13 chunks (0.1 MiB) sharded across 2 ranks"), std::string::npos)
      << b.output;
  // Note [Shard prefetch]: the ranks agreed to gather the next op's chunks ahead.
  EXPECT_NE(b.output.find("gemini: sharded chunks gathered one op ahead"), std::string::npos)
      << b.output;
  expect_same_run(one, two);
  expect_same_evals_and_samples(a, b);
  expect_resumes_across_rank_counts(tmp, args, "--zero 3 ", one, two);
}

// Note [Three tiers under data parallel]: half the chunks sharded, most of the others homed on
// disk under each rank's host budget; evaluation, sampling, saving (rank 0 reads its disk-homed
// chunks while the sharded ones are gathered collectively) and a checkpoint resumed at 4 ranks and
// in one process give what one process gives, and no file stays in the shared --nvme-dir.
void expect_three_tiers_like_one_process(const std::string& tiers, const std::string& ranks_args,
                                         const std::string& on_disk) {
  TempDir tmp;
  const std::string nvme = tmp.path() + "/nvme";
  std::filesystem::create_directories(nvme);
  const std::string args =
      kTiny + "--steps 4 " + tiers + " --nvme-dir " + nvme + " " + eval_and_sample(tmp);
  const std::string one = tmp.path() + "/one", two = tmp.path() + "/two";
  AppResult a = train(0, args + outputs(one));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  AppResult b = train(2, args + ranks_args + "--checkpoint-every 2 --checkpoint-dir " + two +
                             "/ckpt" + outputs(two));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find(on_disk), std::string::npos) << b.output;
  EXPECT_NE(b.output.find("sharded across 2 ranks"), std::string::npos) << b.output;
  expect_same_run(one, two);
  expect_same_evals_and_samples(a, b);
  expect_resumes_across_rank_counts(tmp, args, ranks_args, one, two);
  EXPECT_TRUE(std::filesystem::is_empty(nvme)) << "files left in " << nvme;
}

TEST(DataParallelGeminiThreeTiers, EvaluatesSamplesSavesAndMovesCheckpoints) {
  SKIP_WITHOUT_MPI();
  expect_three_tiers_like_one_process(kThreeTiersNoAccum, "--zero 2 --shard-param-frac 0.5 ",
                                      "chunks (0 MiB) homed on disk");
}

// Note [Pieces on disk]: the same with this rank's pieces of sharded chunks homed on disk, which
// evaluation, sampling and saving gather from there.
TEST(DataParallelGeminiThreeTiers, PiecesOnDiskEvaluateSampleSaveAndMoveCheckpoints) {
  SKIP_WITHOUT_MPI();
  expect_three_tiers_like_one_process(kPiecesOnDisk, "--zero 3 ",
                                      "this rank's pieces of sharded chunks) homed on disk");
}

// Note [Pieces on disk], Note [Abandoning a step]: a failed read of a rank's piece (its first disk
// read, or one in the second step) stops every rank with the error naming the file, saves nothing,
// and leaves no file in --nvme-dir (the pieces' and the Adam states' files both live there).
TEST(DataParallelGeminiThreeTiers, PieceReadErrorStopsEveryRankAndLeavesNoFiles) {
  SKIP_WITHOUT_MPI();
  for (const char* fault : {"read-eio@1", "read-eio@5"}) {
    TempDir tmp;
    const std::string nvme = tmp.path() + "/nvme", model = tmp.path() + "/model";
    std::filesystem::create_directories(nvme);
    const AppResult r = train(
        2,
        kTiny + "--steps 4 --zero 3 " + kPiecesOnDisk + " --nvme-dir " + nvme + " --save " + model,
        60, std::string("MW_IO_FAULT=") + fault);
    EXPECT_EQ(r.exit_code, 1) << fault << "\n" << r.output;
    EXPECT_NE(r.output.find("of '" + nvme + "/memwall-chunks-"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("Input/output error (EIO)"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("Adam states in '" + nvme + "'"), std::string::npos) << r.output;
    EXPECT_TRUE(std::filesystem::is_empty(nvme)) << fault;
    EXPECT_FALSE(std::filesystem::exists(model + "/model.safetensors")) << fault;
  }
}

// Note [ZeRO stage 3]: evaluation and sampling between steps (collective: every bucket gathered)
// give what one process gives; after the recorded first step each bucket is gathered exactly twice
// per step (forward, backward), and the steps never hold the whole model's parameters at once.
TEST(DataParallelZero3, EvaluatesSamplesAndGathersEachBucketTwicePerStep) {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  const std::string args = kTiny + "--steps 4 " + eval_and_sample(tmp);
  const std::string one = tmp.path() + "/one", three = tmp.path() + "/three";
  AppResult a = train(0, args + outputs(one));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  AppResult b = train(2, args + "--zero 3" + outputs(three));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  expect_same_run(one, three);
  // One process under --zero 3 (the local communicator: one bucket piece, the whole) too.
  const std::string alone = tmp.path() + "/alone";
  AppResult c = train(0, args + "--zero 3" + outputs(alone));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  expect_same_run(one, alone);
  expect_same_evals_and_samples(a, b);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(b.output, m, std::regex("; ([0-9]+) buckets of "))) << b.output;
  const int buckets = std::stoi(m[1]);
  EXPECT_GT(buckets, 3);  // --bucket-mb 0.02: several, so that sharding shows
  ASSERT_TRUE(
      std::regex_search(b.output, m, std::regex("gathered parameter buckets ([0-9.]+) times")))
      << b.output;
  EXPECT_DOUBLE_EQ(std::stod(m[1]), 2.0 * buckets) << b.output;
  ASSERT_TRUE(std::regex_search(
      b.output, m,
      std::regex("full parameters at most ([0-9.]+) MiB at once in the steps, of ([0-9.]+)")))
      << b.output;
  EXPECT_LT(std::stod(m[1]), 0.75 * std::stod(m[2])) << b.output;
}

// Note [Global batch]: the data position is the same micro-batch index at any number of ranks, so
// a checkpoint resumes at another count: 2 ranks -> 1 process, and 1 process -> 2 ranks.
TEST(DataParallelCheckpoint, MovesBetweenRankCounts) {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  const std::string args = kTiny + "--steps 4 ";
  for (const auto& [first, second] : {std::pair<int, int>{2, 0}, {0, 2}}) {
    const std::string tag = std::to_string(first) + "to" + std::to_string(second);
    const std::string full = tmp.path() + "/full" + tag, ckpt = tmp.path() + "/ckpt" + tag;
    const std::string resumed = tmp.path() + "/resumed" + tag;
    AppResult a =
        train(first, args + outputs(full) + "--checkpoint-every 2 --checkpoint-dir " + ckpt);
    ASSERT_EQ(a.exit_code, 0) << a.output;
    ASSERT_TRUE(std::filesystem::exists(ckpt + "/step_000002")) << a.output;
    AppResult b = train(second, args + outputs(resumed) + "--resume " + ckpt + "/step_000002");
    ASSERT_EQ(b.exit_code, 0) << b.output;
    const auto lf = losses(full + "/log.jsonl"), lr = losses(resumed + "/log.jsonl");
    ASSERT_EQ(lf.size(), 4u);
    ASSERT_EQ(lr.size(), 2u) << b.output;  // steps 2 and 3
    for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(lr[i], lf[i + 2], kLossTol) << tag << " step " << i;
    const auto wf = weights(full + "/model"), wr = weights(resumed + "/model");
    for (const auto& [name, v] : wf)
      for (size_t i = 0; i < v.size(); ++i)
        ASSERT_NEAR(v[i], wr.at(name)[i], kWeightTol) << tag << " " << name << "[" << i << "]";
  }
}

// A rank that dies stops the job (mpirun sees its exit); one that stalls makes the others time
// out with the collective named (Note [Collective timeouts]). Neither hangs.
TEST(DataParallelFailure, DeadRankStopsTheJob) {
  SKIP_WITHOUT_MPI();
  const auto t0 = std::chrono::steady_clock::now();
  AppResult r = train(2, kTiny + "--steps 50 --dist-timeout 20", 60,
                      "MW_TEST_EXIT_RANK=1 MW_TEST_EXIT_STEP=1");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "timed out: the job hung\n" << r.output;
  EXPECT_NE(r.output.find("Exit code:    3"), std::string::npos) << r.output;
  EXPECT_LT(s, 30) << r.output;
}

TEST(DataParallelFailure, StalledRankTimesOut) {
  SKIP_WITHOUT_MPI();
  AppResult r = train(2, kTiny + "--steps 50 --dist-timeout 2", 60,
                      "MW_TEST_EXIT_RANK=1 MW_TEST_EXIT_STEP=1 MW_TEST_EXIT_HOW=stall");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "timed out: the job hung\n" << r.output;
  EXPECT_NE(r.output.find("gpt2_train: rank 0: error: all_reduce #"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("did not complete within 2.0 s"), std::string::npos) << r.output;
  // Under ZeRO 3 the wait is in a forward op's parameter gather (a module hook): the same error.
  r = train(2, kTiny + "--steps 50 --dist-timeout 2 --zero 3", 60,
            "MW_TEST_EXIT_RANK=1 MW_TEST_EXIT_STEP=1 MW_TEST_EXIT_HOW=stall");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "timed out: the job hung\n" << r.output;
  EXPECT_NE(r.output.find("gpt2_train: rank 0: error: all_gather #"), std::string::npos)
      << r.output;
  // Gemini's sharded chunks (Note [Sharded parameters]): the wait is in a chunk's all_gather.
  r = train(2, kTiny + "--steps 50 --dist-timeout 2 --device sim:64MiB --gemini auto --zero 3", 60,
            "MW_TEST_EXIT_RANK=1 MW_TEST_EXIT_STEP=1 MW_TEST_EXIT_HOW=stall");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "timed out: the job hung\n" << r.output;
  EXPECT_NE(r.output.find("gpt2_train: rank 0: error: all_gather #"), std::string::npos)
      << r.output;
}

// --precision fp16 under data parallel. Note [Loss scale over ranks]: each rank seeds its backward
// with scale / N, so its activation gradients are one process's and overflow where they do: at a
// start scale of 2^24, one process and two ranks skip steps 0-4 and update at step 5 (the seed at
// the scale skipped all six at two ranks). The ranks' weight-gradient sums are 1/N of one
// process's, so where those overflow the schedules may still differ (2^22: one process also skips
// step 4). Under ZeRO each rank checks only its shard of the gradients, so the ranks must agree
// to skip together: ZeRO 1, 2 and 3 skip plain data parallel's steps and end with its weights
// (the reference is data parallel at the same rank count: one process's fp16 products over all
// rows round differently). ZeRO 3 gathers its weights for the autocast casts of each op.
TEST(DataParallelFp16, RanksSkipOverflowingStepsAsOneProcessAndTogetherUnderZero) {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  const std::string args = kTiny + "--steps 6 --precision fp16 --initial-loss-scale 16777216 ";
  auto skipped = [](const std::string& out) {
    std::string steps;
    for (size_t at = out.find("] skipped: inf/nan"); at != std::string::npos;
         at = out.find("] skipped: inf/nan", at + 1))
      steps += out.substr(out.rfind('[', at), at - out.rfind('[', at) + 1);
    return steps;
  };
  AppResult one = train(0, args);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(skipped(one.output), "[0][1][2][3][4]") << one.output;
  const std::string plain = tmp.path() + "/zero0";
  AppResult a = train(2, args + "--zero 0" + outputs(plain));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  // Each rank prints its skips: rank 0's are the first five.
  EXPECT_EQ(skipped(a.output).substr(0, 15), skipped(one.output)) << a.output;
  for (int zero : {1, 2, 3}) {
    const std::string dir = tmp.path() + "/zero" + std::to_string(zero);
    AppResult b = train(2, args + "--zero " + std::to_string(zero) + outputs(dir));
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_EQ(skipped(b.output), skipped(a.output)) << b.output;
    expect_same_run(plain, dir);
  }
}

// Note [Backend module]: one process needs no MPI library to start; only the module links it.
TEST(DataParallelOptions, TheAppDoesNotLinkMpi) {
  AppResult r = testing::run_command("ldd " + std::string(MW_BINARY_DIR) + "/apps/gpt2_train");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("libc.so"), std::string::npos) << r.output;  // ldd did list libraries
  EXPECT_EQ(r.output.find("libmpi"), std::string::npos) << r.output;
}

TEST(DataParallelOptions, RefusedWithAReason) {
  SKIP_WITHOUT_MPI();
  AppResult r = train(2, kTiny + "--steps 1 --batch 3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--batch 3 is the global batch, split across the 2 ranks"),
            std::string::npos)
      << r.output;
  // Before the memory plan and the model are built (xl: half a minute per rank).
  EXPECT_EQ(r.output.find("Model numel"), std::string::npos) << r.output;
  r = train(2, kTiny + "--steps 1 --device sim:64MiB --gemini auto --zero 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--zero 1 with --gemini: pass --zero 2"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Model numel"), std::string::npos) << r.output;
  // Every rank's own budget: too small for its share is refused before the first step.
  r = train(2, kTiny + "--steps 1 --device sim:64MiB --gemini auto --zero 3 --host-capacity 64KiB");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--host-capacity 65536 bytes (0.06 MiB) cannot hold Gemini's host data"),
            std::string::npos)
      << r.output;
  r = train(0, kTiny + "--steps 1 --zero 3 --shard-param-frac 0.5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(
      r.output.find("--shard-param-frac shards Gemini's chunk parameters across ranks (default"),
      std::string::npos)
      << r.output;
}

// Under data parallel Gemini --update-in-backward off keeps the chunk updates for the step (Note
// [Updates as reductions complete]); gpt2_train warned from every rank that it had no effect.
// (Warnings about the command line now come from rank 0 alone.)
TEST(DataParallelOptions, UpdateInBackwardOffUnderGeminiActsWithoutAWarning) {
  SKIP_WITHOUT_MPI();
  const std::string gemini = kTiny + "--steps 1 --device sim:64MiB --gemini auto --zero 2 ";
  AppResult r = train(2, gemini + "--update-in-backward off");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("updates after backward"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("has no effect"), std::string::npos) << r.output;
  r = train(2, gemini + "--update-in-backward on");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("each chunk updated in backward once its reduction completes"),
            std::string::npos)
      << r.output;
  // A warning that holds is printed once, not by every rank.
  r = train(2, kTiny + "--steps 1 --optimizer adamw --update-in-backward off");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string w = "has no effect with --optimizer adamw";
  const size_t at = r.output.find(w);
  EXPECT_NE(at, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(w, at + 1), std::string::npos) << r.output;
}

}  // namespace
}  // namespace mw
