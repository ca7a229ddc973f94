// Note [CPU quota] (core/threads.cpp): --threads 0 is the cores this process may use, its affinity
// mask capped by its cgroup's CPU quota, which oneTBB 2021.8 does not read.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "core/parallel.h"

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
  std::string group;
  for (const std::string& root :
       {std::string("/sys/fs/cgroup/cpu"), std::string("/sys/fs/cgroup")}) {
    const std::string dir = root + "/memwall-test-" + std::to_string(::getpid());
    if (::mkdir(dir.c_str(), 0755) != 0) continue;
    struct stat st {};
    if (::stat((dir + "/cgroup.procs").c_str(), &st) != 0) {  // a plain folder, not a cgroup
      ::rmdir(dir.c_str());
      continue;
    }
    const bool v1 =
        static_cast<bool>(std::fstream(dir + "/cpu.cfs_quota_us", std::ios::in | std::ios::out)
                          << "100000" << std::flush);
    const bool v2 =
        !v1 && static_cast<bool>(std::fstream(dir + "/cpu.max", std::ios::in | std::ios::out)
                                 << "100000 100000" << std::flush);
    if (v1 || v2) {
      group = dir;
      break;
    }
    ::rmdir(dir.c_str());
  }
  if (group.empty()) GTEST_SKIP() << "no writable cgroup with a CPU quota here";
  const std::string cmd = "sh -c 'echo $$ > " + group + "/cgroup.procs && exec " +
                          std::string(MW_BINARY_DIR) +
                          "/apps/gpt2_train --model tiny --steps 1 --threads 0' 2>&1";
  std::string out;
  if (FILE* pipe = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
    ::pclose(pipe);
  }
  ::rmdir(group.c_str());
  EXPECT_NE(out.find("threads: 1\n"), std::string::npos) << out;
}

}  // namespace
}  // namespace mw
