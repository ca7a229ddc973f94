// Data parallel training on CUDA over NCCL (Note [Buckets on CUDA], src/train/data_parallel.cpp):
// gpt2_train --device cuda under mpirun against one plain CUDA process on the same global batch,
// at ZeRO stages 0 to 3, with and without Gemini, and a checkpoint written over NCCL resumed by one
// plain process. Written on a machine without a GPU: the refusals run everywhere; the trainings
// skip without one GPU (one rank: real NCCL collectives of one rank) or two (two ranks), saying
// why.
#include <gtest/gtest.h>

#include <ostream>
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

TEST(DataParallelNccl, RefusesHostDevices) {
  expect_refused(train(0, kTiny + "--steps 1 --dist nccl"), 2,
                 "--dist nccl takes CUDA tensors, but --device is cpu: pass --device cuda");
  expect_refused(train(0, kTiny + "--steps 1 --device sim --dist nccl"), 2,
                 "--dist nccl takes CUDA tensors, but --device is sim:0");
}

TEST(DataParallelNccl, MpiRefusesCuda) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: --device cuda is refused first";
  expect_refused(train(0, kTiny + "--steps 1 --device cuda --dist mpi"), 2,
                 "--dist mpi takes host tensors (cpu, sim), but --device is cuda:0");
}

// Gemini's chunks in RAM (static with everything offloaded) take the staged collectives (Note
// [Staged collectives], dist/communicator.h); auto on this tiny model keeps them on the device.
const char* kHostChunks = "--gemini static --offload-param-frac 1 --offload-optim-frac 1 ";
// Static's default fractions: chunks, gradient buffers and Adam states on the GPU, each chunk's
// reduced gradient scaled and measured by kernels there (the host once read them: a crash).
const char* kDeviceStates = "--gemini static ";

struct Case {
  const char* zero;
  const char* gemini;  // "" for none
};

void PrintTo(const Case& c, std::ostream* os) { *os << "--zero " << c.zero << " " << c.gemini; }

const Case kCases[] = {{"0", ""},
                       {"1", ""},
                       {"2", ""},
                       {"3", ""},
                       {"0", "--gemini auto "},
                       {"0", kDeviceStates},
                       {"2", kDeviceStates},
                       {"0", kHostChunks},
                       {"2", kHostChunks},
                       {"3", kHostChunks}};

// One NCCL rank goes through the data-parallel path (buckets on the device, their all_reduce or
// reduce_scatter and all_gather by NCCL, ZeRO 3's gathers around each op into device buckets,
// Gemini's chunk reductions, the ZeRO checkpoint's collectives), so it must give what one plain
// process gives, within the data-parallel tolerance (dist_train.h), and its checkpoint must
// resume in one process with the same placement.
class DataParallelNcclOneRank : public ::testing::TestWithParam<Case> {};

TEST_P(DataParallelNcclOneRank, MatchesOneProcessAndItsCheckpointResumesThere) {
  if (auto why = nccl_unavailable(1); !why.empty()) GTEST_SKIP() << why;
  const Case c = GetParam();
  TempDir tmp;
  const std::string one = tmp.path() + "/one", nccl = tmp.path() + "/nccl";
  AppResult a = train(0, kCuda + outputs(one));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  AppResult b =
      train(1,
            kCuda + c.gemini + "--dist nccl --zero " + c.zero +
                " --checkpoint-every 2 --checkpoint-dir " + nccl + "/ckpt" + outputs(nccl),
            120);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find(std::string("Data parallel: 1 rank (nccl), ZeRO stage ") + c.zero),
            std::string::npos)
      << b.output;
  expect_same_run(one, nccl);
  const std::string resumed = tmp.path() + "/resumed";
  AppResult r =
      train(0, kCuda + c.gemini + outputs(resumed) + "--resume " + nccl + "/ckpt/step_000002");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_run(one, resumed, 2);
}

INSTANTIATE_TEST_SUITE_P(Zero, DataParallelNcclOneRank, ::testing::ValuesIn(kCases));

// Note [16-bit parameter gathers] (train/zero3_low.cpp) on the device: under bf16 one NCCL rank's
// ZeRO 3 gathers the blocks' matrices in 2 bytes into a receive buffer on the GPU and copies the
// runs out on the compute stream; it must train as one plain CUDA process under bf16.
TEST(DataParallelNcclOneRankBf16, ZeroThreeGathersInSixteenBitsAsOneProcess) {
  if (auto why = nccl_unavailable(1); !why.empty()) GTEST_SKIP() << why;
  TempDir tmp;
  const std::string one = tmp.path() + "/one", nccl = tmp.path() + "/nccl";
  const std::string bf16 = kCuda + "--precision bf16 ";
  AppResult a = train(0, bf16 + outputs(one));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  AppResult b = train(1, bf16 + "--dist nccl --zero 3" + outputs(nccl), 120);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("are gathered in bf16 (Note [16-bit parameter gathers])"),
            std::string::npos)
      << b.output;
  expect_same_run(one, nccl);
}

// Two GPUs: under mpirun --device cuda picks NCCL and each rank its own GPU.
TEST(DataParallelNcclTwoRanks, MatchOneProcessAtEveryStage) {
  if (auto why = nccl_unavailable(2); !why.empty()) GTEST_SKIP() << why;
  TempDir tmp;
  const std::string one = tmp.path() + "/one";
  AppResult a = train(0, kCuda + outputs(one));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  int k = 0;
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::string("--zero ") + c.zero + " " + c.gemini);
    const std::string two = tmp.path() + "/two" + std::to_string(k++);
    AppResult b = train(2, kCuda + c.gemini + "--zero " + c.zero + outputs(two), 120);
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_NE(b.output.find(std::string("Data parallel: 2 ranks (nccl), ZeRO stage ") + c.zero),
              std::string::npos)
        << b.output;
    expect_same_run(one, two);
  }
}

}  // namespace
}  // namespace mw
