// Note [ZeRO checkpoints] (train/zero_state_file.h) without the app: ranks whose optimizers step
// pieces of the parameters write, between them, exactly the bytes one process's optimizer writes
// for the same gradients (Adam is elementwise, so the states are bit for bit the same), and read
// that file back into their pieces. HybridAdam in memory, on NVMe with slices smaller than the
// parameters (so pieces and the file's segments cut each other), half on NVMe (one process and
// the ranks offload different parameters), and AdamW. At 1 rank (the local communicator: pieces
// in bucket order, not the model's) and, inside mpirun, at 2.
#include "train/zero_state_file.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "../data/temp_dir.h"
#include "autograd/autograd.h"
#include "dist/communicator.h"
#include "mpi_launch.h"
#include "optim/hybrid_adam.h"

namespace mw {
namespace {

using data::testing::TempDir;

struct Variant {
  const char* name;
  double nvme_fraction;
  bool adamw;
};

// Odd sizes over three buckets of at most 2,600 elements; slices of 1,024.
const std::vector<Shape> kShapes = {{37, 5}, {1000}, {3000}, {7}, {64, 33}};
constexpr int64_t kBucketBytes = 4 * 2600;

Tensor pattern(int64_t numel, uint32_t seed) {  // deterministic values in [-1, 1)
  std::vector<float> v(static_cast<size_t>(numel));
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(seed >> 8) / static_cast<float>(1 << 23) - 1.f;
  }
  return Tensor::from_vector(v, {numel});
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::unique_ptr<optim::Optimizer> make_optimizer(const Variant& v, std::vector<Tensor> params,
                                                 const optim::NvmeOffloadOptions& nvme) {
  if (v.adamw) return std::make_unique<optim::AdamW>(std::move(params));
  optim::HybridAdamOptions h({}, -1.f, nvme);
  h.nvme.overlap_backward = false;  // gradients are set by hand, stepped by step()
  return std::make_unique<optim::HybridAdam>(std::move(params), h);
}

void flush(optim::Optimizer& opt) {
  if (auto* h = dynamic_cast<optim::HybridAdam*>(&opt)) h->flush();
}

// One step with gradient pattern `step`: the whole parameters (one process), or this rank's pieces.
void step(optim::Optimizer& whole, optim::Optimizer& sharded, train::DataParallel& dp,
          uint32_t step) {
  std::vector<Tensor> grads;
  for (size_t p = 0; p < kShapes.size(); ++p) {
    grads.push_back(pattern(shape_numel(kShapes[p]), 1000 * step + static_cast<uint32_t>(p)));
    set_grad(whole.params()[p], grads.back().view(kShapes[p]));
  }
  const std::vector<train::ShardPiece> pieces = dp.pieces(dp.rank());
  for (size_t k = 0; k < pieces.size(); ++k)
    set_grad(sharded.params()[k],
             grads[pieces[k].param].narrow(0, pieces[k].offset, pieces[k].numel).clone());
  whole.step();
  sharded.step();
  flush(whole);
  flush(sharded);
}

void check_variant(const std::shared_ptr<dist::Communicator>& comm, const Variant& v,
                   const std::string& dir) {
  SCOPED_TRACE(v.name);
  std::vector<Tensor> params, copies;
  for (size_t p = 0; p < kShapes.size(); ++p) {
    params.push_back(pattern(shape_numel(kShapes[p]), static_cast<uint32_t>(p)).view(kShapes[p]));
    copies.push_back(params.back().clone());
    set_requires_grad(params.back());
    set_requires_grad(copies.back());
  }
  train::DataParallel dp(comm, params, 1, kBucketBytes);
  optim::NvmeOffloadOptions nvme;
  nvme.fraction = v.nvme_fraction;
  nvme.slice_numel = 1024;
  nvme.window_bytes = 64 << 10;
  auto whole = make_optimizer(v, copies, nvme);
  auto sharded = make_optimizer(v, dp.optimizer_params(), nvme);
  const train::OneProcessLayout layout = train::one_process_layout(params, nvme, !v.adamw);
  auto same_file = [&](const char* what) {
    const std::string one = dir + "/one_" + what, zero = dir + "/zero_" + what;
    if (comm->rank() == 0 && v.adamw) dynamic_cast<optim::AdamW&>(*whole).save_state(one);
    if (comm->rank() == 0 && !v.adamw) dynamic_cast<optim::HybridAdam&>(*whole).save_state(one);
    train::save_zero_state(dp, *sharded, layout, zero);
    if (comm->rank() == 0) {
      const std::string a = bytes_of(one), b = bytes_of(zero);
      EXPECT_GT(a.size(), 24u) << what;
      EXPECT_TRUE(a == b) << what << ": " << a.size() << " bytes one process, " << b.size()
                          << " from the ranks";
    }
    comm->barrier().wait();  // the other ranks read rank 0's files after this
  };
  same_file("step0");  // no state yet: no segment in memory, zero slices on NVMe
  step(*whole, *sharded, dp, 1);
  step(*whole, *sharded, dp, 2);
  same_file("step2");
  // Each rank reads its pieces of the one-process file into a new optimizer and goes on.
  auto loaded = make_optimizer(v, dp.optimizer_params(), nvme);
  train::load_zero_state(dp, *loaded, dir + "/one_step2");
  EXPECT_EQ(loaded->step_count(), 2);
  sharded = std::move(loaded);
  step(*whole, *sharded, dp, 3);
  same_file("step3");
}

const Variant kVariants[] = {{"in memory", 0.0, false},
                             {"on NVMe", 1.0, false},
                             {"half on NVMe", 0.5, false},
                             {"AdamW", 0.0, true}};

TEST(ZeroStateFile, OneRankWritesTheOneProcessFile) {
  if (testing::is_mpi_worker()) GTEST_SKIP() << "inside a worker";
  TempDir tmp;
  for (const Variant& v : kVariants) check_variant(dist::make_local_communicator(), v, tmp.path());
}

TEST(ZeroStateFileWorker, TwoRanksWriteTheOneProcessFile) {
  if (!testing::is_mpi_worker()) GTEST_SKIP() << "an MPI worker; run by ZeroStateFile.TwoRanks*";
  const char* dir = std::getenv("MW_ZERO_TEST_DIR");
  ASSERT_NE(dir, nullptr);
  auto comm = dist::make_communicator({"mpi", 30000});
  ASSERT_EQ(comm->size(), 2);
  for (const Variant& v : kVariants) check_variant(comm, v, dir);
}

TEST(ZeroStateFile, TwoRanksWriteTheOneProcessFile) {
  if (testing::is_mpi_worker()) GTEST_SKIP() << "inside a worker";
  if (auto why = testing::mpi_unavailable(); !why.empty()) GTEST_SKIP() << why;
  TempDir tmp;
  auto r =
      testing::run_mpi_workers(2, "ZeroStateFileWorker.*", 60, "MW_ZERO_TEST_DIR=" + tmp.path());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[       OK ] ZeroStateFileWorker.TwoRanksWriteTheOneProcessFile"),
            std::string::npos)
      << "the workers did not run:\n"
      << r.output;
  EXPECT_EQ(r.output.find("FAILED"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace mw
