// Data parallel training on CUDA over NCCL (Note [Buckets on CUDA], src/train/data_parallel.cpp):
// gpt2_train --device cuda under mpirun against one plain CUDA process on the same global batch,
// at ZeRO stages 0 to 3, and a checkpoint written over NCCL resumed by one plain process.
// Written on a machine without a GPU: the refusals run everywhere; the trainings skip without one
// GPU (one rank: real NCCL collectives of one rank) or two (two ranks), saying why.
#include <gtest/gtest.h>

#include <string>

#include "../data/temp_dir.h"
#include "core/cuda_stream.h"
#include "dist_train.h"
#include "nccl_launch.h"

namespace mw {
namespace {

using data::testing::TempDir;
using testing::AppResult;
using testing::nccl_unavailable;
using namespace testing::dist_train;

// --grad-clip: the norm of ZeRO's gradient pieces is summed on the device and over the ranks.
const std::string kCuda = kTiny + "--steps 4 --device cuda --grad-clip 1 ";

void expect_refused(const AppResult& r, int code, const std::string& why) {
  EXPECT_EQ(r.exit_code, code) << r.output;
  EXPECT_NE(r.output.find(why), std::string::npos) << r.output;
  if (code != 2) {  // exit 2 prints the usage, which names the line; 1 stops before the model
    EXPECT_EQ(r.output.find("Model numel:"), std::string::npos) << r.output;
  }
}

TEST(DataParallelNccl, RefusedWithAReason) {
  expect_refused(train(0, kTiny + "--steps 1 --dist nccl"), 2,
                 "--dist nccl takes CUDA tensors, but --device is cpu: pass --device cuda");
  expect_refused(train(0, kTiny + "--steps 1 --device sim --dist nccl"), 2,
                 "--dist nccl takes CUDA tensors, but --device is sim:0");
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: --device cuda is refused first";
  expect_refused(train(0, kTiny + "--steps 1 --device cuda --dist mpi"), 2,
                 "--dist mpi takes host tensors (cpu, sim), but --device is cuda:0");
  if (auto why = nccl_unavailable(1); !why.empty()) GTEST_SKIP() << why;
  expect_refused(train(1, kTiny + "--steps 1 --device cuda --dist nccl --gemini auto"), 1,
                 "--gemini with --device cuda over NCCL (plain data parallel and --zero 1-3 run "
                 "there) is not implemented yet");
}

// One NCCL rank goes through the data-parallel path (buckets on the device, their all_reduce or
// reduce_scatter and all_gather by NCCL, ZeRO 3's gathers around each op into device buckets, the
// ZeRO checkpoint's collectives), so it must give what
// one plain process gives, within the data-parallel tolerance (dist_train.h), and its checkpoint
// must resume there.
class DataParallelNcclOneRank : public ::testing::TestWithParam<int> {};

TEST_P(DataParallelNcclOneRank, MatchesOneProcessAndItsCheckpointResumesThere) {
  if (auto why = nccl_unavailable(1); !why.empty()) GTEST_SKIP() << why;
  const std::string zero = std::to_string(GetParam());
  TempDir tmp;
  const std::string one = tmp.path() + "/one", nccl = tmp.path() + "/nccl";
  AppResult a = train(0, kCuda + outputs(one));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  AppResult b = train(1,
                      kCuda + "--dist nccl --zero " + zero + " --checkpoint-every 2 " +
                          "--checkpoint-dir " + nccl + "/ckpt" + outputs(nccl),
                      120);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("Data parallel: 1 rank (nccl), ZeRO stage " + zero), std::string::npos)
      << b.output;
  expect_same_run(one, nccl);
  const std::string resumed = tmp.path() + "/resumed";
  AppResult r = train(0, kCuda + outputs(resumed) + "--resume " + nccl + "/ckpt/step_000002");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_run(one, resumed, 2);
}

INSTANTIATE_TEST_SUITE_P(Zero, DataParallelNcclOneRank, ::testing::Values(0, 1, 2, 3));

// Two GPUs: under mpirun --device cuda picks NCCL and each rank its own GPU.
TEST(DataParallelNcclTwoRanks, MatchOneProcessAtEveryStage) {
  if (auto why = nccl_unavailable(2); !why.empty()) GTEST_SKIP() << why;
  TempDir tmp;
  const std::string one = tmp.path() + "/one";
  AppResult a = train(0, kCuda + outputs(one));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  for (const char* zero : {"0", "1", "2", "3"}) {
    SCOPED_TRACE(std::string("--zero ") + zero);
    const std::string two = tmp.path() + "/two" + zero;
    AppResult b = train(2, kCuda + "--zero " + zero + outputs(two), 120);
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_NE(b.output.find(std::string("Data parallel: 2 ranks (nccl), ZeRO stage ") + zero),
              std::string::npos)
        << b.output;
    expect_same_run(one, two);
  }
}

}  // namespace
}  // namespace mw
