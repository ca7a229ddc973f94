// Note [16-bit gathers] (offload/gemini/low_copies.cpp) end to end: under --precision bf16 a
// sharded chunk's all_gather carries its 16-bit part in 2 bytes, and the run is bit for bit the
// run whose chunks are replicated (--zero 2: the same chunks, pieces and Adam states, its copies
// rounded from RAM by Note [16-bit copies], itself bit for bit the plain autocast run).
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "dist_train.h"

namespace mw {
namespace {

using data::testing::TempDir;
using testing::AppResult;
using namespace testing::dist_train;

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The bytes the run's all_gathers sent, summed over its steps (the JSON log's).
double all_gather_bytes(const std::string& dir) {
  double sum = 0;
  for (double b : per_step(dir + "/log.jsonl", "all_gather_bytes")) sum += b;
  return sum;
}

// b's losses and gradient norms are a's to the last digit (the JSON log's), its saved model the
// same bytes, and it printed a's validation losses and samples.
void expect_bitwise(const std::string& a_dir, const AppResult& a, const std::string& b_dir,
                    const AppResult& b, const char* what) {
  SCOPED_TRACE(what);
  for (const char* field : {"loss", "grad_norm"}) {
    const auto fa = per_step(a_dir + "/log.jsonl", field),
               fb = per_step(b_dir + "/log.jsonl", field);
    ASSERT_EQ(fa.size(), 4u) << field;
    EXPECT_EQ(fa, fb) << field;
  }
  EXPECT_EQ(file_bytes(a_dir + "/model/model.safetensors"),
            file_bytes(b_dir + "/model/model.safetensors"));
  expect_same_evals_and_samples(a, b);
}

// The tiny model's 13 chunks: the blocks' matrices are 16-bit parts; the samples (an f32 forward)
// gather f32, the evaluations (under autocast) 16 bits. Then with pieces on disk (Note [Pieces on
// disk]), read before the rounding. Without the 16-bit gathers the all_gather bytes are f32's;
// with a run moved to the wrong place (the slots' compaction) the losses differ.
TEST(DataParallelGeminiZero3, SixteenBitGathersTrainBitForBitAsReplicatedChunks) {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  const std::string args =
      kTiny + "--steps 4 --precision bf16 --grad-clip 100 " + eval_and_sample(tmp);
  const std::string placed = "--device sim:64MiB --gemini auto --chunk-size 4096 ";
  const std::string replicated = tmp.path() + "/z2", f32 = tmp.path() + "/f32",
                    low = tmp.path() + "/low", disk = tmp.path() + "/disk";
  const AppResult a = train(4, args + placed + "--zero 2" + outputs(replicated));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const AppResult b = train(4, args + placed + "--zero 3 --chunk-copy-dtype fp32" + outputs(f32));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const AppResult c = train(4, args + placed + "--zero 3" + outputs(low));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("13 chunks (0.1 MiB) sharded across 4 ranks"), std::string::npos);
  EXPECT_NE(c.output.find("gemini: sharded chunks gathered one op ahead"), std::string::npos);
  EXPECT_NE(c.output.find("(sharded chunks' 16-bit parts gathered in 2 B)"), std::string::npos);
  EXPECT_EQ(b.output.find("16-bit parts gathered"), std::string::npos);
  expect_bitwise(replicated, a, low, c, "--zero 3, 16-bit gathers");
  // f32 gathers: the same bits, but the chunks' members in f32's order, so the pieces' squares
  // are summed in other groups; the losses and the model are the same.
  EXPECT_EQ(per_step(f32 + "/log.jsonl", "loss"), per_step(low + "/log.jsonl", "loss"));
  EXPECT_EQ(file_bytes(f32 + "/model/model.safetensors"),
            file_bytes(low + "/model/model.safetensors"));
  // The blocks' matrices are 24,576 of the tiny model's 29,600 parameters: gathered twice a step
  // in 2 bytes instead of 4, that is 0.58 of f32's bytes, with the slots' padding a little more.
  const double f32_bytes = all_gather_bytes(f32), low_bytes = all_gather_bytes(low);
  EXPECT_GT(f32_bytes, 0);
  EXPECT_LT(low_bytes, 0.65 * f32_bytes) << low_bytes << " bytes against f32's " << f32_bytes;
  const std::string nvme = tmp.path() + "/nvme";
  std::filesystem::create_directories(nvme);
  const AppResult d =
      train(4, args + placed + "--host-capacity 128KiB --nvme-window 16KiB --nvme-dir " + nvme +
                   " --zero 3" + outputs(disk));
  ASSERT_EQ(d.exit_code, 0) << d.output;
  EXPECT_NE(d.output.find("this rank's pieces of sharded chunks) homed on disk"), std::string::npos)
      << d.output;
  expect_bitwise(replicated, a, disk, d, "--zero 3, pieces on disk, 16-bit gathers");
  EXPECT_TRUE(std::filesystem::is_empty(nvme));
}

// Note [16-bit parameter gathers] (train/zero3_low.cpp): plain ZeRO 3's buckets, under bf16
// with two micro-batches, gather the blocks' matrices in 2 bytes and train bit for bit as --zero 2
// (same reductions at 2 ranks: one addition per element, whatever its place in the bucket). The
// f32 gathers (--chunk-copy-dtype fp32) have the same layout, so the same gradient norms too.
// Under NCCL's memory rule the slots are received in a buffer of their own and copied out, the
// device's path. Its checkpoint resumes at --zero 2, whose pieces are in the parameters' order.
// Measured mutations: the runs left in their slots, or the 16-bit gradients not widened before
// the next micro-batch, change the losses.
TEST(DataParallelZero3, SixteenBitGathersTrainBitForBitAsStage2) {
  SKIP_WITHOUT_MPI();
  TempDir tmp;
  const std::string args = kTiny +
                           "--steps 4 --precision bf16 --grad-clip 100 --grad-accum 2 "
                           "--device sim:64MiB " +
                           eval_and_sample(tmp);
  const std::string z2 = tmp.path() + "/z2", f32 = tmp.path() + "/f32", low = tmp.path() + "/low",
                    rule = tmp.path() + "/rule", resumed = tmp.path() + "/resumed";
  const AppResult a = train(2, args + "--zero 2" + outputs(z2));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const AppResult b = train(2, args + "--zero 3 --chunk-copy-dtype fp32" + outputs(f32));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const std::string ck = " --checkpoint-dir " + tmp.path() + "/ck --checkpoint-every 2";
  const AppResult c = train(2, args + "--zero 3" + ck + outputs(low));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  const AppResult d = train(2, args + "--zero 3" + outputs(rule), 60, "MW_DIST_DEVICE_MEMORY=sim");
  ASSERT_EQ(d.exit_code, 0) << d.output;
  EXPECT_NE(c.output.find("(the blocks' matrices gathered in 2 B)"), std::string::npos) << c.output;
  EXPECT_EQ(b.output.find("gathered in 2 B"), std::string::npos) << b.output;
  for (const auto& [dir, run] : {std::pair{low, &c}, std::pair{rule, &d}}) {
    SCOPED_TRACE(dir);
    EXPECT_EQ(per_step(z2 + "/log.jsonl", "loss"), per_step(dir + "/log.jsonl", "loss"));
    EXPECT_TRUE(file_bytes(z2 + "/model/model.safetensors") ==
                file_bytes(dir + "/model/model.safetensors"))
        << "the saved models differ";
    expect_same_evals_and_samples(a, *run);
  }
  expect_bitwise(f32, b, low, c, "plain --zero 3, 16-bit against f32 gathers");
  // The blocks' matrices are 24,576 of the tiny model's 29,600 parameters: twice a step in 2 bytes
  // instead of 4 is 0.58 of f32's bytes; the slots' padding and the embedding's rows (f32 in both)
  // make it 0.64 (measured).
  const double f32_bytes = all_gather_bytes(f32), low_bytes = all_gather_bytes(low);
  EXPECT_GT(f32_bytes, 0);
  EXPECT_LT(low_bytes, 0.66 * f32_bytes) << low_bytes << " bytes against f32's " << f32_bytes;
  const AppResult e =
      train(2, args + "--zero 2 --resume " + tmp.path() + "/ck/step_000002" + outputs(resumed));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  const auto all = per_step(z2 + "/log.jsonl", "loss");
  EXPECT_EQ(std::vector<double>(all.begin() + 2, all.end()),
            per_step(resumed + "/log.jsonl", "loss"));
  EXPECT_TRUE(file_bytes(z2 + "/model/model.safetensors") ==
              file_bytes(resumed + "/model/model.safetensors"))
      << "the saved models differ";
}

}  // namespace
}  // namespace mw
