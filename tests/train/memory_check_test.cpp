// The memory plan's refusals (train/memory_plan.h, check_plan_fits): what does not fit is refused
// naming the numbers and the options; the sim device's bytes count against the host; data parallel
// is planned per rank and checked per host; the arithmetic stays fast and saturates on absurd
// shapes. The plan against measured peaks: memory_plan_test.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "../core/test_cgroup.h"
#include "core/error.h"
#include "plan_test_inputs.h"
#include "train/data_parallel.h"
#include "train/memory_plan.h"

namespace mw::train {
namespace {

using gpt2::Config;
using test::inputs;
using test::on_sim;
using test::wide;

TEST(MemoryPlan, RefusesWhatDoesNotFitNamingTheNumbersAndTheOptions) {
  PlanInputs in = inputs(Config::preset("small"), 100000, 128);
  const MemoryPlan plan = plan_memory(in);
  AvailableMemory avail;
  avail.host_bytes = int64_t{16} << 30;
  avail.host_source = "MemAvailable";
  try {
    check_plan_fits(plan, in, avail);
    FAIL() << "a 10 TiB plan was accepted";
  } catch (const OutOfMemory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("16384.0 MiB available"), std::string::npos) << what;
    EXPECT_NE(what.find("--batch"), std::string::npos) << what;
    EXPECT_NE(what.find("--checkpoint-activations"), std::string::npos) << what;
    EXPECT_NE(what.find("--skip-memory-check"), std::string::npos) << what;
  }
  in.batch = 4;  // GPT-2 small at B4 T128 fits in 16 GiB
  EXPECT_NO_THROW(check_plan_fits(plan_memory(in), in, avail));
}

// An --nvme-dir the run will create has the free space of the file system it will be created on
// (its nearest existing parent): it was -1, "unknown", and a plan too large for that disk passed.
TEST(MemoryPlan, AMissingNvmeDirIsCheckedWhereItWillBeCreated) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string parent = tmp && *tmp ? tmp : "/tmp";
  const AvailableMemory there = available_memory(parent);
  const AvailableMemory missing = available_memory(parent + "/memwall-no-such-dir/a/b");
  ASSERT_GE(there.disk_bytes, 0) << parent;
  EXPECT_EQ(missing.disk_path, parent + "/memwall-no-such-dir/a/b");
  ASSERT_GE(missing.disk_bytes, 0) << "not measured at the parent";
  // The same file system, read twice: other tests may write meanwhile (CI runs two at a time).
  EXPECT_NEAR(static_cast<double>(missing.disk_bytes), static_cast<double>(there.disk_bytes),
              double(int64_t{1} << 30));
  PlanInputs in = inputs(Config::preset("small"), 4, 128);
  in.nvme_fraction = 1.0;
  const MemoryPlan plan = plan_memory(in);
  ASSERT_GT(plan.disk_bytes, 0) << plan.table();
  AvailableMemory small = missing;
  small.disk_bytes = plan.disk_bytes - 1;
  EXPECT_THROW(check_plan_fits(plan, in, small), OutOfMemory);
}

// The sim device's memory is host RAM: a plan that fits the device's capacity but not the host
// with the device's bytes added is refused (GPT-2 xl on sim:100GiB with its Adam states on the
// device planned 23.2 GiB on the device and none on the host, passed, and was OOM-killed).
TEST(MemoryPlan, SimDeviceBytesCountAgainstHostRam) {
  PlanInputs in = on_sim(inputs(Config::preset("small"), 4, 128));
  in.device_capacity_bytes = int64_t{100} << 30;
  in.states_on_host = false;
  const MemoryPlan plan = plan_memory(in);
  ASSERT_GT(plan.device_bytes, plan.host_bytes) << plan.table();
  AvailableMemory avail;
  avail.host_source = "MemAvailable";
  avail.host_bytes = plan.host_bytes + plan.device_bytes - 1;  // one byte short
  try {
    check_plan_fits(plan, in, avail);
    FAIL() << "the sim device's bytes were not counted against host RAM\n" << plan.table();
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("the simulated device"), std::string::npos) << e.what();
  }
  avail.host_bytes += 1;
  EXPECT_NO_THROW(check_plan_fits(plan, in, avail));
  in.device = Device::cuda(0);  // a GPU's bytes are not the host's: nothing is added
  const MemoryPlan on_gpu = plan_memory(in);
  ASSERT_GT(on_gpu.device_bytes, 0) << on_gpu.table();
  avail.host_bytes = on_gpu.host_bytes;
  EXPECT_NO_THROW(check_plan_fits(on_gpu, in, avail));
}

// Note [Offload in RAM]: offloaded bytes on tmpfs stay in the machine's memory, so they count
// against host RAM (an --offload nvme run into /dev/shm passed a check that had them on a disk).
TEST(MemoryPlan, OffloadIntoAFileSystemInRamCountsAgainstHostRam) {
  PlanInputs in = inputs(Config::preset("small"), 4, 128);
  in.nvme_fraction = 1.0;
  const MemoryPlan plan = plan_memory(in);
  ASSERT_GT(plan.disk_bytes, 0) << plan.table();
  AvailableMemory avail;
  avail.host_source = "MemAvailable";
  avail.host_bytes = plan.host_bytes + plan.disk_bytes - 1;  // one byte short with the offload
  avail.disk_bytes = int64_t{1} << 40;
  avail.disk_path = "/dev/shm/states";
  EXPECT_NO_THROW(check_plan_fits(plan, in, avail));  // on a disk
  avail.disk_in_memory = "tmpfs";
  try {
    check_plan_fits(plan, in, avail);
    FAIL() << "the offloaded bytes in RAM were not counted against host RAM\n" << plan.table();
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("at '/dev/shm/states', on tmpfs, which is RAM"),
              std::string::npos)
        << e.what();
  }
  avail.host_bytes += 1;
  EXPECT_NO_THROW(check_plan_fits(plan, in, avail));
  EXPECT_NE(available_text(avail, plan.disk_bytes).find("warning: the offloaded bytes go to"),
            std::string::npos);
  EXPECT_EQ(available_text(avail, 0).find("warning"), std::string::npos);  // nothing offloaded
}

// The host RAM a cgroup allows is what the check compares with: under a v1 memory limit (a v1
// host's `docker run -m`) the check used the host's MemAvailable and passed a plan the limit
// would kill. Needs root and a writable cgroup file system: skipped elsewhere.
TEST(MemoryPlan, ACgroupMemoryLimitIsWhatTheHostHas) {
  const testing::TestCgroup group("memory", "memory.limit_in_bytes", "800M", "memory.max", "800M");
  if (!group.ok()) GTEST_SKIP() << "no writable cgroup with a memory limit here";
  const std::optional<std::string> out =
      group.run(std::string(MW_BINARY_DIR) + "/apps/gpt2_train --plan");
  if (!out) GTEST_SKIP() << "cannot join the cgroup here";
  EXPECT_NE(out->find("MiB (cgroup memory limit - usage)"), std::string::npos) << *out;
  EXPECT_NE(out->find("does not fit"), std::string::npos) << *out;  // GPT-2 small: about 2 GiB
}

// The group's inactive page cache is reclaimed before anything is killed: 140 MB just written
// under a 160 MiB limit left "13.8 MiB available" and a refusal of a run that trained in 40 MiB.
TEST(MemoryPlan, ACgroupsReclaimablePageCacheIsAvailable) {
  const testing::TestCgroup group("memory", "memory.limit_in_bytes", "160M", "memory.max", "160M");
  if (!group.ok()) GTEST_SKIP() << "no writable cgroup with a memory limit here";
  const std::string file = "/tmp/memwall-cache-" + std::to_string(::getpid());
  const std::optional<std::string> out =
      group.run("sh -c \"dd if=/dev/zero of=" + file + " bs=1M count=140 conv=fsync 2>/dev/null; " +
                std::string(MW_BINARY_DIR) +
                "/apps/gpt2_train --plan --n-layer 2 --n-embd 128 --n-head 2 --vocab-size 8192 "
                "--batch 2 --seq 64\"");
  std::remove(file.c_str());
  if (!out) GTEST_SKIP() << "cannot join the cgroup here";
  EXPECT_NE(out->find("(cgroup memory limit - usage)"), std::string::npos) << *out;
  EXPECT_EQ(out->find("does not fit"), std::string::npos) << *out;
}

// Data parallel (docs/distributed.md): the plan is one rank's, over its rows of the global batch;
// ZeRO 1 and 2 shard the Adam states (and stage 2 the kept gradients); ranks on one machine share
// its RAM, so the check multiplies. Measured against each rank's peak in tests/dist/plan_test.cpp.
// The buckets the plan sizes its data-parallel rows from are DataParallel's (one rule, shared):
// reverse registration order, about --bucket-mb each, a larger parameter alone.
TEST(MemoryPlan, BucketsGroupParametersInReverseOrderUpToTheCap) {
  EXPECT_EQ(bucket_numels({10, 5, 30, 2, 3}, 4 * 12), (std::vector<int64_t>{5, 30, 5, 10}));
  EXPECT_EQ(bucket_numels({4, 4, 4}, 4 * 12), (std::vector<int64_t>{12}));
  EXPECT_EQ(bucket_numels({}, 4 * 12), (std::vector<int64_t>{}));
}

TEST(MemoryPlan, DataParallelIsPlannedPerRankAndCheckedPerHost) {
  const PlanInputs one = inputs(wide(), 4, 128);
  PlanInputs dp = one;
  dp.ranks = 2;
  dp.update_in_backward = false;  // as the trainer sets it under data parallel
  const MemoryPlan single = plan_memory(one), ddp = plan_memory(dp);
  PlanInputs half = one;
  half.batch = 2;
  EXPECT_EQ(ddp.activation_bytes, plan_memory(half).activation_bytes) << "B4 over 2 ranks: B2";
  auto row = [](const MemoryPlan& p, const std::string& what) {
    for (const auto& r : p.rows)
      if (r.what == what) return r.bytes;
    return int64_t{0};
  };
  const int64_t params = row(single, "parameters");
  EXPECT_EQ(row(ddp, "gradient buckets"), params) << "stage 0 keeps every bucket";
  EXPECT_EQ(row(ddp, "Adam m, v"), 2 * params);
  dp.zero_stage = 1;
  const MemoryPlan z1 = plan_memory(dp);
  EXPECT_EQ(row(z1, "Adam m, v"), params) << "this rank's half of m and v";
  EXPECT_EQ(row(z1, "gradient shard"), params / 2);
  dp.zero_stage = 2;
  const MemoryPlan z2 = plan_memory(dp);
  EXPECT_EQ(row(z2, "gradient buckets"), 0) << "stage 2 frees a bucket after its reduce_scatter";
  EXPECT_LT(z2.host_bytes, z1.host_bytes);
  // Four ranks on a machine with room for three of them.
  dp.ranks = dp.ranks_on_host = 4;
  const MemoryPlan four = plan_memory(dp);
  EXPECT_NE(four.table().find("4 ranks on this host"), std::string::npos) << four.table();
  AvailableMemory avail;
  avail.host_bytes = 3 * four.host_bytes + (four.host_bytes / 2);
  avail.host_source = "MemAvailable";
  try {
    check_plan_fits(four, dp, avail);
    FAIL() << "four ranks were accepted in the room of three and a half";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("(4 ranks on this host)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fewer ranks per host"), std::string::npos) << e.what();
  }
  dp.ranks_on_host = 3;  // the fourth rank on another machine
  EXPECT_NO_THROW(check_plan_fits(plan_memory(dp), dp, avail));
}

TEST(MemoryPlan, ADeviceTooSmallIsRefusedWithGeminiSuggested) {
  PlanInputs in = inputs(Config::preset("small"), 4, 128);
  in.device = Device::sim(0);
  in.device_capacity_bytes = int64_t{768} << 20;
  try {
    check_plan_fits(plan_memory(in), in, AvailableMemory{});
    FAIL() << "GPT-2 small on 768 MiB without Gemini was accepted";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("--gemini auto"), std::string::npos) << e.what();
  }
}

// HybridAdam offloads the states of host parameters only: on a GPU without Gemini, --offload nvme
// would offload nothing, and the plan put the states on disk. Under Gemini the chunks whose states
// are on the host offload theirs.
TEST(MemoryPlan, NvmeOffloadThatWouldOffloadNothingIsRefusedWithTheWayThatDoes) {
  PlanInputs in = inputs(Config::preset("small"), 4, 128);
  in.nvme_fraction = 1.0;
  in.device = Device::sim(0);
  in.device_capacity_bytes = int64_t{8} << 30;
  EXPECT_NO_THROW(plan_memory(in)) << "sim parameters are host memory: offloaded";
  in.device = Device::cuda(0);
  try {
    plan_memory(in);
    FAIL() << "--device cuda --offload nvme was planned";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(
        std::string(e.what()).find("--gemini static --offload-param-frac 1 --offload-optim-frac 1"),
        std::string::npos)
        << e.what();
  }
  in.gemini = true;
  in.gemini_options.policy = gemini::Policy::kStatic;
  in.gemini_options.offload_optim_frac = 1.0;
  EXPECT_THROW(plan_memory(in), InvalidArgument) << "host states of chunks homed on the GPU";
  in.nvme_fraction = 0;  // three tiers would put them on disk as well
  in.gemini_options.host_capacity_bytes = int64_t{1} << 30;
  EXPECT_THROW(plan_memory(in), InvalidArgument) << "--host-capacity, same chunks";
  in.gemini_options.offload_param_frac = 1.0;
  EXPECT_NO_THROW(plan_memory(in)) << "Gemini's host-homed chunks' states go to disk";
  in.gemini_options.host_capacity_bytes = 0;
  in.nvme_fraction = 1.0;
  EXPECT_NO_THROW(plan_memory(in)) << "Gemini's host-homed chunks' states are offloaded";
  // Static with every chunk's states on the device (the default fractions): nothing to offload,
  // on sim as on cuda (sim ignored it without a word until session 39).
  for (Device d : {Device::sim(0), Device::cuda(0)}) {
    in.device = d;
    in.gemini_options.offload_param_frac = in.gemini_options.offload_optim_frac = 0;
    EXPECT_THROW(plan_memory(in), InvalidArgument) << d.str() << ": static 0/0 with --offload nvme";
  }
}

TEST(MemoryPlan, TheLargestConfigIsPlannedQuicklyWithoutOverflow) {
  // Every size at the config's limit (2^24): the plan neither overflows nor lists 200 million
  // tensors, so an absurd config.json is refused at once.
  const int64_t max_dim = int64_t{1} << 24;
  PlanInputs in = inputs(Config::preset("small"), 1 << 20, 1024);
  in.config.n_layer = max_dim;
  in.config.n_embd = max_dim;
  in.config.n_head = 1;
  in.config.vocab_size = max_dim;
  const auto t0 = std::chrono::steady_clock::now();
  const MemoryPlan plan = plan_memory(in);
  in.gemini = true;
  in.device = Device::sim(0);
  const MemoryPlan gemini_plan = plan_memory(in);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 0.5);                                // two tables of at most two layers each
  EXPECT_GE(plan.host_bytes, int64_t{1} << 60);           // saturated, not wrapped negative
  EXPECT_GE(gemini_plan.device_bytes, int64_t{1} << 60);  // static, nothing offloaded
  // Past kListedLayers the per-block arithmetic equals the listed table's.
  PlanInputs listed = inputs(Config::preset("small"), 4, 128), derived = listed;
  listed.config.n_layer = 4096;
  derived.config.n_layer = 4097;
  const MemoryPlan a = plan_memory(listed), b = plan_memory(derived);
  EXPECT_EQ(b.host_bytes - a.host_bytes,
            plan_memory(inputs(Config::preset("small"), 4, 128)).host_bytes -
                plan_memory([] {
                  PlanInputs eleven = inputs(Config::preset("small"), 4, 128);
                  eleven.config.n_layer = 11;
                  return eleven;
                }())
                    .host_bytes);
}

}  // namespace
}  // namespace mw::train
