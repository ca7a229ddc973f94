// Note [Device memory on the CPU] (src/dist/communicator.h): NCCL's rule, every collective's
// tensors on the rank's device, played on the CPU by the MPI backend requiring sim memory
// ($MW_DIST_DEVICE_MEMORY=sim). gpt2_train at 2 ranks under it, at every ZeRO stage and under
// Gemini (chunks on the device, in RAM and on disk), must give what one process gives, and its
// checkpoints must resume there: a host tensor handed to a collective (which NCCL would refuse)
// stops the run, and the buckets, pieces and staged copies live on the device as on a GPU. The CUDA
// kernels themselves (scaling, norms) are the GPU tests' (nccl_train_test.cpp).
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "../data/temp_dir.h"
#include "core/error.h"
#include "dist/communicator.h"
#include "dist_train.h"

namespace mw {
namespace {

using data::testing::TempDir;
using testing::AppResult;
using namespace testing::dist_train;

TEST(DeviceMemoryOnTheCpu, AHostTensorIsRefusedAsNcclWouldRefuseIt) {
  auto comm = dist::require_memory(dist::make_local_communicator(), Device::sim());
  EXPECT_EQ(comm->required_memory(), Device::sim());
  try {
    comm->all_reduce(Tensor::zeros({3}));
    FAIL() << "a cpu tensor was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("is not on sim:0, the memory this communicator requires"),
              std::string::npos)
        << e.what();
  }
  Tensor t = Tensor::full({3}, 2.0, DType::F32, Device::sim());
  comm->all_reduce(t).wait();
  dist::staged_all_reduce(*comm, Tensor::zeros({3})).wait();  // staged: taken
}

struct Case {
  int zero;
  const char* options;  // beyond kTiny
};

void PrintTo(const Case& c, std::ostream* os) { *os << "--zero " << c.zero << " " << c.options; }

constexpr const char* kPlain = "--device sim:64MiB --grad-clip 0.5";
constexpr const char* kChunksInRam =
    "--device sim:64MiB --gemini static --offload-param-frac 1 --offload-optim-frac 1 "
    "--chunk-size 4096 --grad-clip 0.5";
constexpr const char* kChunksOnDevice = "--device sim:64MiB --gemini auto --chunk-size 4096";
// Static's default fractions: chunks, gradient buffers and Adam states all on the device, so each
// chunk's reduced gradient is scaled and measured there (on a GPU by its kernels).
constexpr const char* kStatesOnDevice =
    "--device sim:64MiB --gemini static --chunk-size 4096 --grad-clip 0.5";
// Three tiers (train_test.cpp's): 9 of 13 chunks on disk; at --zero 3 some pieces on disk.
constexpr const char* kThreeTiers =
    "--device sim:64MiB --gemini auto --chunk-size 4096 --host-capacity 220KiB --nvme-window 64KiB "
    "--grad-accum 2 --grad-clip 0.5";
constexpr const char* kPiecesOnDisk =
    "--device sim:64MiB --gemini auto --chunk-size 4096 --host-capacity 120KiB --nvme-window 16KiB";

class DeviceMemoryRanks : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceMemoryRanks, MatchOneProcessAndTheirCheckpointResumesThere) {
  SKIP_WITHOUT_MPI();
  const Case c = GetParam();
  TempDir tmp;
  const std::string args = kTiny + "--steps 4 " + c.options + " ";
  // Evaluation and sampling (collective forwards at ZeRO 3) and the best model (an agreement of
  // the ranks) under the rule too.
  const std::string evals = eval_and_sample(tmp) + "--save-best " + tmp.path() + "/best ";
  const std::string one = tmp.path() + "/one", two = tmp.path() + "/two";
  AppResult a = train(0, args + evals + outputs(one));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  AppResult b = train(2,
                      args + evals + "--zero " + std::to_string(c.zero) +
                          " --checkpoint-every 2 --checkpoint-dir " + two + "/ckpt" + outputs(two),
                      120, "MW_DIST_DEVICE_MEMORY=sim");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("Data parallel: 2 ranks (mpi), ZeRO stage " + std::to_string(c.zero)),
            std::string::npos)
      << b.output;
  // Over device memory the embedding's gradient is reduced whole (Note [Buckets on CUDA]).
  EXPECT_EQ(b.output.find("embedding gradient(s) per step reduced during backward"),
            std::string::npos)
      << b.output;
  expect_same_run(one, two);
  expect_same_evals_and_samples(a, b);
  const std::string resumed = tmp.path() + "/resumed";
  AppResult r = train(0, args + outputs(resumed) + "--resume " + two + "/ckpt/step_000002");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_run(one, resumed, 2);
}

INSTANTIATE_TEST_SUITE_P(Stages, DeviceMemoryRanks,
                         ::testing::Values(Case{0, kPlain}, Case{1, kPlain}, Case{2, kPlain},
                                           Case{3, kPlain}, Case{0, kChunksOnDevice},
                                           Case{0, kChunksInRam}, Case{2, kChunksInRam},
                                           Case{3, kChunksInRam}, Case{2, kThreeTiers},
                                           Case{3, kPiecesOnDisk}));

// One rank under the rule takes the data-parallel path, as one NCCL rank does
// (nccl_train_test.cpp's DataParallelNcclOneRank, the same placements, on a GPU): the same
// losses and weights as one plain process.
class DeviceMemoryOneRank : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceMemoryOneRank, MatchesOneProcess) {
  SKIP_WITHOUT_MPI();
  const Case c = GetParam();
  TempDir tmp;
  const std::string args = kTiny + "--steps 4 " + c.options + " ";
  const std::string one = tmp.path() + "/one", rank = tmp.path() + "/rank";
  AppResult a = train(0, args + outputs(one));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  AppResult b = train(1, args + "--dist mpi --zero " + std::to_string(c.zero) + outputs(rank), 120,
                      "MW_DIST_DEVICE_MEMORY=sim");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("Data parallel: 1 rank (mpi), ZeRO stage " + std::to_string(c.zero)),
            std::string::npos)
      << b.output;
  expect_same_run(one, rank);
}

INSTANTIATE_TEST_SUITE_P(Stages, DeviceMemoryOneRank,
                         ::testing::Values(Case{0, kPlain}, Case{1, kPlain}, Case{2, kPlain},
                                           Case{3, kPlain}, Case{0, kChunksOnDevice},
                                           Case{0, kStatesOnDevice}, Case{2, kStatesOnDevice},
                                           Case{0, kChunksInRam}, Case{2, kChunksInRam},
                                           Case{3, kChunksInRam}));

}  // namespace
}  // namespace mw
