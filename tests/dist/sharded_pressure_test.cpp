// Note [Memory pressure] (offload/gemini/pressure.cpp) with sharded chunks, under mpirun: a step
// that needs more device memory than the warmup measured must not fail where the one-op prefetch
// of sharded chunks (Note [Shard prefetch]) is what fills the device. Every rank still joins the
// same all_gathers; the rank short of memory moves the prefetched copy to the host (or lands it
// there) and back for its op. The run with the unexpected bytes is bit for bit the run without.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

#include "../data/temp_dir.h"
#include "core/allocator.h"
#include "dist/communicator.h"
#include "dist_train.h"
#include "train/trainer.h"

namespace mw {
namespace {

using data::testing::TempDir;
using testing::AppResult;
using train::Trainer;
using train::TrainOptions;

constexpr int kSim = 6;  // a sim device of its own

int64_t env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoll(v) : 0;
}

// GPT-2 of 3 blocks of width 64 in chunks of 20000 elements, every chunk sharded over 2 ranks
// (--zero 3) and homed on the host, under auto.
TrainOptions sharded_options(int64_t capacity) {
  TrainOptions o;
  o.model = "tiny";
  o.n_layer = 3, o.n_embd = 64, o.vocab_size = 257;
  o.batch = 4, o.seq = 32, o.steps = 4;  // 2 rows a rank
  o.threads = 1;
  o.seed = 5, o.dropout = 0.1, o.hyper.lr = 1e-2f;
  o.device = Device::sim(kSim);
  o.device_capacity_limit_bytes = capacity;
  o.skip_memory_check = true;  // the allocator enforces the capacity
  o.zero_stage = 3;
  o.gemini = "auto";
  auto& g = o.gemini_options;
  g.policy = gemini::parse_policy(o.gemini);
  g.device = o.device;
  g.chunk_numel = 20000;
  g.verbose = true;
  return o;
}

// Rank r of the run: MW_PRESSURE_HOLD bytes taken on the device after the first block's c_fc
// from the second step on, until the step ends (the warmup never saw them); MW_PRESSURE_BF16=1:
// under autocast bf16, the chunks gathered in 16 bits (Note [16-bit gathers]). Rank 0 writes the
// losses and the counters to MW_PRESSURE_DIR/result.txt and the model beside it.
TEST(ShardedPressureWorker, Trains) {
  if (!testing::is_mpi_worker()) GTEST_SKIP() << "runs under mpirun (GeminiShardedPressure.*)";
  const std::string dir = std::getenv("MW_PRESSURE_DIR");
  TrainOptions o = sharded_options(env_int("MW_PRESSURE_CAPACITY"));
  if (env_int("MW_PRESSURE_BF16") == 1) {
    o.precision = DType::BF16;
    o.gemini_low_copies = true;
  }
  o.comm = dist::make_communicator({"mpi", 60000});
  const int64_t hold = env_int("MW_PRESSURE_HOLD");
  Trainer t(o, [](const std::string&) {});
  Tensor held;
  int64_t step = 0;
  for (auto& [name, m] : t.model().named_modules())
    if (name == "transformer.h.0.mlp.c_fc")
      m->add_forward_hook([&](nn::Module&, const Tensor&, const Tensor&) {
        if (hold > 0 && step > 0 && !held.defined())
          held = Tensor::empty({hold / 4}, DType::F32, o.device);
      });
  std::string result;
  while (!t.done()) {
    const train::StepResult r = t.train_step();
    held = Tensor();
    ++step;
    char loss[32];
    std::snprintf(loss, sizeof loss, "%.17g\n", r.loss);
    result += loss;
  }
  t.flush();
  const gemini::GeminiStats& s = t.gemini()->run_stats();
  result +=
      str("pressure_evictions ", s.pressure_evictions, "\nlanded_prefetches ", s.landed_prefetches,
          "\nsim peak ", allocator_for(o.device).stats().peak_bytes, "\n");
  t.save_model(dir + "/model");
  if (o.comm->rank() == 0) std::ofstream(dir + "/result.txt") << result;
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct WorkerRun {
  std::string losses;  // one per line, every digit
  int64_t pressure_evictions = -1, landed_prefetches = -1, sim_peak = -1;
  std::string model;  // model.safetensors' bytes
  std::string output;
};

// The worker's result.txt: the losses, then "pressure_evictions N", "landed_prefetches N" and
// "sim peak N".
WorkerRun run_workers(const std::string& dir, int64_t capacity, int64_t hold, bool bf16,
                      const std::string& env = "") {
  std::filesystem::create_directories(dir);
  const AppResult r = testing::run_mpi_workers(
      2, "ShardedPressureWorker.*", 120,
      str(env, " MW_PRESSURE_DIR=", dir, " MW_PRESSURE_CAPACITY=", capacity,
          " MW_PRESSURE_HOLD=", hold, " MW_PRESSURE_BF16=", bf16 ? 1 : 0));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  WorkerRun w;
  w.output = r.output;
  std::istringstream in(file_text(dir + "/result.txt"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("pressure_evictions ", 0) == 0)
      w.pressure_evictions = std::stoll(line.substr(19));
    else if (line.rfind("landed_prefetches ", 0) == 0)
      w.landed_prefetches = std::stoll(line.substr(18));
    else if (line.rfind("sim peak ", 0) == 0)
      w.sim_peak = std::stoll(line.substr(9));
    else
      w.losses += line + "\n";
  }
  w.model = file_text(dir + "/model/model.safetensors");
  return w;
}

// The capacity: 64 KiB above the unconstrained run's peak, so the warmup finds room to gather the
// next op's sharded chunk (80 KB) ahead; then 96 KiB more is taken in every later step, which
// leaves no room for that chunk beside the op's own. Without moving it to the host, or landing a
// later prefetch there, the run stops with the allocator's OutOfMemory in step 1.
TEST(GeminiShardedPressure, APrefetchedShardMovesToTheHostAndTheBitsStay) {
  SKIP_WITHOUT_MPI();
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16, 16-bit gathers" : "fp32");
    TempDir tmp;
    const WorkerRun free = run_workers(tmp.path() + "/free", 0, 0, bf16);
    ASSERT_GT(free.sim_peak, 0) << free.output;
    const int64_t capacity = free.sim_peak + (64 << 10);
    const WorkerRun held = run_workers(tmp.path() + "/held", capacity, 96 << 10, bf16);
    EXPECT_NE(held.output.find("gemini: sharded chunks gathered one op ahead"), std::string::npos)
        << held.output;
    EXPECT_EQ(free.losses, held.losses);
    EXPECT_EQ(std::count(held.losses.begin(), held.losses.end(), '\n'), 4);
    EXPECT_TRUE(free.model == held.model && !free.model.empty());
    EXPECT_EQ(free.pressure_evictions, 0);
    EXPECT_GT(held.pressure_evictions, 0);
    EXPECT_LE(held.sim_peak, capacity);
  }
}

// A prefetch the device refuses when the op before it starts (its room already made) lands in RAM
// on that rank, as if spilled at once, and its op moves it to the device (Note [Memory pressure]).
// MW_GEMINI_PREFETCH_OOM=1 refuses every one, as a full device would: the run is bit for bit the
// free one, each landing counted. Without the landing the first prefetch stops the run with
// OutOfMemory (until session 36, what a full device did).
TEST(GeminiShardedPressure, APrefetchTheDeviceRefusesLandsInRamAndTheBitsStay) {
  SKIP_WITHOUT_MPI();
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16, 16-bit gathers" : "fp32");
    TempDir tmp;
    const WorkerRun free = run_workers(tmp.path() + "/free", 0, 0, bf16);
    const WorkerRun refused =
        run_workers(tmp.path() + "/refused", 0, 0, bf16, "MW_GEMINI_PREFETCH_OOM=1");
    EXPECT_NE(refused.output.find("gemini: sharded chunks gathered one op ahead"),
              std::string::npos)
        << refused.output;
    EXPECT_EQ(std::count(refused.losses.begin(), refused.losses.end(), '\n'), 4);
    EXPECT_EQ(free.losses, refused.losses);
    EXPECT_TRUE(free.model == refused.model && !free.model.empty());
    EXPECT_EQ(free.landed_prefetches, 0);
    EXPECT_GT(refused.landed_prefetches, 0);
    EXPECT_EQ(refused.pressure_evictions, 0);  // nothing else moved for it
  }
}

}  // namespace
}  // namespace mw
