// The NCCL communicator (src/dist/nccl/, docs/distributed.md "NCCL"). Without a GPU, as on the
// machine this was written on, only the loader's errors and the tensor checks run; the collectives
// on CUDA tensors (NcclWorker.*, run inside `mpirun -np 1` and `-np 2` by the DistNccl.* tests)
// skip, saying why. DistNccl.OneRank passed on an H200 (session 34); TwoRanks needs two GPUs and
// has never run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "core/cuda_stream.h"
#include "core/ops.h"
#include "dist/communicator.h"
#include "mpi_launch.h"
#include "nccl_launch.h"

namespace mw {
namespace {

using dist::Communicator;
using dist::Work;
using testing::nccl_module;
using testing::nccl_unavailable;

// Sets an environment variable for one test and restores it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { had_ ? ::setenv(name_, old_.c_str(), 1) : ::unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

std::string comm_error_of(const dist::CommOptions& options) {
  try {
    dist::make_communicator(options);
  } catch (const dist::CommError& e) {
    return e.what();
  }
  return "(no CommError)";
}

// A missing module is a CommError that names the module, where it was looked for and what to
// install; it is raised before any library (MPI, NCCL, CUDA) is loaded.
TEST(NcclCommunicator, MissingModuleNamesWhatToInstall) {
  ScopedEnv env("MW_DIST_NCCL_MODULE", "/nonexistent/libmw_dist_nccl.so");
  const std::string m = comm_error_of({"nccl"});
  for (const char* part : {"--dist nccl needs the NCCL backend module libmw_dist_nccl.so",
                           "/nonexistent/libmw_dist_nccl.so: not found ($MW_DIST_NCCL_MODULE)",
                           "apt-get install libnccl2 libnccl-dev", "openmpi-bin",
                           "memwall: NCCL backend ON", "point MW_DIST_NCCL_MODULE at the module"})
    EXPECT_NE(m.find(part), std::string::npos) << "missing '" << part << "' in:\n" << m;
}

// The MPI module in NCCL's place takes host memory: refused before it is started.
TEST(NcclCommunicator, ModuleOfHostMemoryIsRefused) {
  if (!std::filesystem::exists(testing::mpi_backend_module()))
    GTEST_SKIP() << "the MPI backend module was not built (MPI not found at configure time)";
  ScopedEnv env("MW_DIST_NCCL_MODULE", testing::mpi_backend_module());
  const std::string m = comm_error_of({"nccl"});
  EXPECT_NE(m.find("is not an NCCL module"), std::string::npos) << m;
}

TEST(NcclCommunicator, UnknownBackendIsAUsageError) {
  EXPECT_THROW(dist::make_communicator({"gloo"}), InvalidArgument);
  EXPECT_EQ(dist::make_communicator({"local"})->cuda_device(), -1);
}

// Host backends refuse CUDA tensors (checked on the desc alone: no GPU needed); the NCCL backend
// refuses host tensors and tensors on another device.
TEST(NcclCommunicator, TensorChecksFollowTheBackendsMemory) {
  const Tensor host = Tensor::zeros({4});
  EXPECT_NO_THROW(dist::check_collective_tensor(host, "all_reduce"));
  try {
    dist::check_collective_tensor(host, "all_reduce", 1);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("all_reduce: f32[4] on cpu is not on cuda:1"), std::string::npos) << m;
    EXPECT_NE(m.find("use --dist mpi for cpu or sim tensors"), std::string::npos) << m;
  }
}

// ---- with a GPU: inside mpirun -np 1 or 2 ----

#define SKIP_UNLESS_NCCL_WORKER() \
  if (!testing::is_mpi_worker()) GTEST_SKIP() << "an NCCL worker; run by DistNccl.*"

// Rank r's values: (r + 1) * (i + 1), exact in every dtype for these sizes.
Tensor rank_values(int64_t n, int r, DType dtype, Device device) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = (r + 1.0) * static_cast<double>(i + 1);
  return Tensor::from_vector(v, {n}, Device::cpu()).to(dtype).to(device);
}

std::vector<double> host_values(const Tensor& t) {
  return t.to(Device::cpu()).to(DType::F64).to_vector<double>();
}

// Sum over ranks 0..n-1 of (r + 1) = n(n + 1)/2.
double rank_sum(int n) { return n * (n + 1) / 2.0; }

void check_all_reduce(Communicator& comm, Device dev, int64_t numel) {
  const int r = comm.rank(), n = comm.size();
  for (DType dtype : {DType::F32, DType::F64, DType::I32, DType::I64}) {
    Tensor t = rank_values(numel, r, dtype, dev);
    comm.all_reduce(t).wait();
    const auto v = host_values(t);
    for (int64_t i = 0; i < numel; ++i)
      ASSERT_EQ(v[i], rank_sum(n) * static_cast<double>(i + 1)) << dtype_name(dtype) << " " << i;
  }
}

// Out of place, then in place (output = input's first k elements: Note [In-place
// reduce-scatter] moves rank r's piece from offset r*k to the front).
void check_reduce_scatter(Communicator& comm, Device dev, int64_t k) {
  const int r = comm.rank(), n = comm.size();
  for (bool in_place : {false, true}) {
    Tensor in = rank_values(n * k, r, DType::F32, dev);
    Tensor out = in_place ? in.narrow(0, 0, k) : Tensor::zeros({k}, DType::F32, dev);
    comm.reduce_scatter(in, out).wait();
    const auto v = host_values(out);
    for (int64_t i = 0; i < k; ++i)
      ASSERT_EQ(v[i], rank_sum(n) * static_cast<double>(r * k + i + 1))
          << (in_place ? "in place " : "") << i;
  }
}

void check_gather_broadcast_barrier(Communicator& comm, Device dev, int64_t k) {
  const int r = comm.rank(), n = comm.size();
  Tensor mine = Tensor::full({k}, 10.0 * (r + 1), DType::I32, dev);
  Tensor all = Tensor::zeros({n * k}, DType::I32, dev);
  comm.all_gather(mine, all).wait();
  const auto av = host_values(all);
  for (int64_t i = 0; i < n * k; ++i) ASSERT_EQ(av[i], 10.0 * static_cast<double>(i / k + 1)) << i;
  Tensor b = Tensor::full({k}, r == n - 1 ? 3.5 : -1.0, DType::F32, dev);
  comm.broadcast(b, n - 1).wait();
  for (double x : host_values(b)) ASSERT_EQ(x, 3.5);
  comm.barrier().wait();
}

// Note [NCCL stream order]: the input is still being written by 40 kernels on the compute stream
// (~10 GB of traffic) when the all_reduce is queued, with no synchronisation between; a
// collective that did not wait for them would sum zeros or a partial result.
void check_waits_for_the_compute_stream(Communicator& comm, Device dev) {
  const int64_t numel = int64_t{1} << 25;  // 128 MiB of f32
  Tensor t = Tensor::zeros({numel}, DType::F32, dev);
  for (int step = 0; step < 40; ++step) t = ops::affine_scalar(t, 1.0, comm.rank() + 1.0);
  comm.all_reduce(t).wait();
  const auto v = t.to(Device::cpu()).to_vector<float>();
  for (int64_t i : {int64_t{0}, numel / 2, numel - 1})
    ASSERT_EQ(v[i], 40.f * static_cast<float>(rank_sum(comm.size()))) << i;
}

// Without a GPU the module still loads (libnccl.so, cudart), MPI starts, and every rank fails to
// start with an error saying why, instead of crashing or waiting for the others.
TEST(NcclWorker, WithoutAGpuTheStartIsAClearError) {
  SKIP_UNLESS_NCCL_WORKER();
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is visible";
  try {
    dist::make_communicator({"nccl", 60000});
    FAIL() << "expected CommError";
  } catch (const dist::CommError& e) {
    std::printf("NCCL-START-ERROR: %s\n", e.what());
  }
}

TEST(NcclWorker, EveryCollectiveOnCudaTensors) {
  SKIP_UNLESS_NCCL_WORKER();
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  auto comm = dist::make_communicator({"nccl", 60000});
  ASSERT_EQ(comm->backend(), "nccl");
  const int d = comm->cuda_device();
  ASSERT_GE(d, 0);
  const Device dev = Device::cuda(d);
  for (int64_t numel : {1, 7, 1001}) {
    check_all_reduce(*comm, dev, numel);
    check_reduce_scatter(*comm, dev, numel);
    check_gather_broadcast_barrier(*comm, dev, numel);
  }
  check_waits_for_the_compute_stream(*comm, dev);
  EXPECT_THROW(comm->all_reduce(Tensor::zeros({3})), InvalidArgument);  // host memory
  std::printf("NCCL-WORKER-OK rank %d of %d on cuda:%d\n", comm->rank(), comm->size(), d);
}

// ---- the launchers ----

void run_nccl_workers(int ranks) {
  auto r = testing::run_mpi_workers(ranks, "NcclWorker.*", 300);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < ranks; ++rank)
    EXPECT_NE(r.output.find("NCCL-WORKER-OK rank " + std::to_string(rank) + " of " +
                            std::to_string(ranks)),
              std::string::npos)
        << "rank " << rank << " did not finish:\n"
        << r.output;
}

// Runs here (no GPU): the real module under mpirun -np 2. Both ranks load it, start MPI, agree
// that neither has a device, finalise MPI and report why; the job ends cleanly.
TEST(DistNccl, WithoutAGpuEveryRankFailsToStartCleanly) {
  if (testing::is_mpi_worker()) GTEST_SKIP() << "inside a worker";
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is visible: DistNccl.OneRank runs";
  if (!std::filesystem::exists(nccl_module()))
    GTEST_SKIP() << "the NCCL backend module was not built (cmake: 'memwall: NCCL backend OFF')";
  if (auto why = testing::mpi_unavailable(); !why.empty()) GTEST_SKIP() << why;
  auto r = testing::run_mpi_workers(2, "NcclWorker.WithoutAGpuTheStartIsAClearError", 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* rank : {"rank 0", "rank 1"})
    EXPECT_NE(r.output.find(std::string("NCCL-START-ERROR: the nccl backend did not start: ") +
                            rank + ": no CUDA device is visible"),
              std::string::npos)
        << r.output;
  EXPECT_EQ(r.output.find("exiting improperly"), std::string::npos) << r.output;
}

TEST(DistNccl, OneRank) {
  if (auto why = nccl_unavailable(1); !why.empty()) GTEST_SKIP() << why;
  run_nccl_workers(1);
}

TEST(DistNccl, TwoRanks) {
  if (auto why = nccl_unavailable(2); !why.empty()) GTEST_SKIP() << why;
  run_nccl_workers(2);
}

}  // namespace
}  // namespace mw
