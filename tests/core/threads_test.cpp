// Note [CPU quota] (core/threads.cpp): --threads 0 is the cores this process may use, its affinity
// mask capped by its cgroup's CPU quota, which oneTBB 2021.8 does not read.
#include <gtest/gtest.h>
#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "core/parallel.h"

extern "C" char* openblas_get_corename();
#include "test_cgroup.h"

namespace mw {
namespace {

TEST(Threads, ACgroupCpuMaxGivesItsCoresRoundedUp) {
  EXPECT_EQ(cpu_max_cores("200000 100000"), 2);  // docker --cpus=2
  EXPECT_EQ(cpu_max_cores("150000 100000"), 2);  // --cpus=1.5: two threads, each busy part-time
  EXPECT_EQ(cpu_max_cores("50000 100000"), 1);
  EXPECT_EQ(cpu_max_cores("6400000 100000"), 64);
  EXPECT_EQ(cpu_max_cores("max 100000"), 0);  // no quota
  EXPECT_EQ(cpu_max_cores("-1 100000"), 0);   // cgroup v1's "no quota"
  EXPECT_EQ(cpu_max_cores(""), 0);            // no such file
  EXPECT_EQ(cpu_max_cores("garbage"), 0);
  EXPECT_EQ(cpu_max_cores("100000 0"), 0);
}

TEST(Threads, AllCoresIsAtMostTheAffinityMask) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  EXPECT_GE(available_cores(), 1);
  EXPECT_LE(available_cores(), CPU_COUNT(&set));
}

// A child in a cgroup (v1 cpu, as on this hybrid machine, or v2 with the cpu controller) capped at
// one core's time picks one thread for --threads 0; it took every core of its affinity mask.
// Needs root and a writable cgroup file system: skipped elsewhere.
TEST(Threads, AQuotaOfOneCoreGivesOneThread) {
  const testing::TestCgroup group("cpu", "cpu.cfs_quota_us", "100000", "cpu.max", "100000 100000");
  if (!group.ok()) GTEST_SKIP() << "no writable cgroup with a CPU quota here";
  const std::optional<std::string> out =
      group.run(std::string(MW_BINARY_DIR) + "/apps/gpt2_train --model tiny --steps 1 --threads 0");
  if (!out) GTEST_SKIP() << "cannot join the cgroup here";
  EXPECT_NE(out->find("threads: 1\n"), std::string::npos) << *out;
}

// Note [OpenBLAS kernels]: Debian's OpenBLAS chose its SSE3 Prescott kernels on an Emerald
// Rapids Xeon it does not know (GPT-2 small's step 10.4 s; 1.7-2.1 s with SkylakeX's). Once the
// pool is set up, a CPU with AVX-512 or AVX2 never runs Prescott's, unless the user asked for them.
TEST(Threads, AnAvx2OrAvx512CpuDoesNotRunOpenBlasPrescottKernels) {
  const char* asked = std::getenv("OPENBLAS_CORETYPE");
  const bool user = asked != nullptr && std::string(asked) != "SkylakeX" &&
                    std::string(asked) != "Haswell";  // ours, set by an earlier test's pool
  if (user) GTEST_SKIP() << "OPENBLAS_CORETYPE=" << asked << " set by the user";
  num_threads();
  const std::string core = openblas_get_corename();
  std::printf("OpenBLAS kernels: %s\n", core.c_str());
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_NE(core, "Prescott");
  }
}

}  // namespace
}  // namespace mw
