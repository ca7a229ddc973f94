// The memory plan's check against what the machine has (memory_plan.h): /proc/meminfo, the
// cgroup's memory limit and usage (v2 or v1), statvfs at the NVMe directory.
#include <sys/statvfs.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/process_limits.h"
#include "offload/io/scratch_dir.h"
#include "train/memory_plan.h"
#include "train/plan_bytes.h"

namespace mw::train {

using plan_bytes::clamp_bytes;
using plan_bytes::mib_text;

namespace {

int64_t read_int_file(const std::string& path) {  // -1: absent or "max"
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s == "max") return -1;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  return (end && *end == 0 && v >= 0) ? v : -1;
}

int64_t mem_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (f >> key >> kib) {
    std::getline(f, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

// A key's value in a cgroup's memory.stat ("inactive_file 146878464"), or 0 when absent.
int64_t memory_stat(const std::string& path, const std::string& key) {
  std::ifstream f(path);
  std::string k;
  int64_t v = 0;
  while (f >> k >> v)
    if (k == key) return v;
  return 0;
}

// The least free memory (limit - usage) over this process's cgroup and those above it: v2's
// memory.max - memory.current, v1's memory.limit_in_bytes - memory.usage_in_bytes (a v1 host's
// `docker run -m 4g`, which the v2 files alone missed: the check then used the host's
// MemAvailable and passed runs the limit then killed). The usage counts the group's page cache,
// whose inactive part the kernel reclaims before it kills anything: it is left out, as docker
// stats and the kubelet do (after 140 MB written under a 160 MiB limit the check said 13.8 MiB
// available and refused a run that trained in 40 MiB). The levels: core/process_limits.h. -1 when
// unlimited or unknown.
int64_t cgroup_free_bytes() {
  int64_t free = -1;
  for_each_cgroup_level("memory", [&](const std::string& dir, bool v2) {
    const int64_t max = read_int_file(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
    if (max < 0 || max >= (int64_t{1} << 60)) return;  // v1 writes "no limit" as about 2^63
    const int64_t usage = read_int_file(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"));
    const int64_t cache =
        memory_stat(dir + "/memory.stat", v2 ? "inactive_file" : "total_inactive_file");
    const int64_t used = std::max<int64_t>(0, usage) - std::min(cache, std::max<int64_t>(0, usage));
    const int64_t left = std::max<int64_t>(0, max - used);
    if (free < 0 || left < free) free = left;
  });
  return free;
}

// Free bytes of the file system that holds `path`, or would hold it once created: statvfs at its
// nearest existing ancestor (an --nvme-dir the run creates was unchecked, its free space -1).
int64_t free_disk_bytes(const std::string& path) {
  std::error_code ec;  // absolute() fails only without a current directory: then unknown
  std::filesystem::path p = std::filesystem::absolute(path, ec).lexically_normal();
  if (ec) return -1;
  for (;;) {
    struct statvfs s {};
    if (statvfs(p.c_str(), &s) == 0)
      return static_cast<int64_t>(s.f_bavail) * static_cast<int64_t>(s.f_frsize);
    if (!p.has_relative_path()) return -1;  // the root itself failed
    p = p.parent_path();
  }
}

}  // namespace

AvailableMemory available_memory(const std::string& nvme_dir) {
  AvailableMemory a;
  a.host_bytes = mem_available_bytes();
  a.host_source = "MemAvailable";
  const int64_t cg = cgroup_free_bytes();
  if (cg >= 0 && (a.host_bytes < 0 || cg < a.host_bytes)) {
    a.host_bytes = cg;
    a.host_source = "cgroup memory limit - usage";
  }
  a.disk_path = nvme_dir.empty() ? io::default_offload_base() : nvme_dir;
  a.disk_bytes = free_disk_bytes(a.disk_path);
  a.disk_in_memory = io::memory_file_system(a.disk_path);
  // ramfs has no size: statfs says 0 bytes free, and the run was refused as a full disk. Its
  // bytes are RAM, counted with the host's (Note [Offload in RAM]).
  if (a.disk_in_memory == "ramfs") a.disk_bytes = -1;
  return a;
}

std::string available_text(const AvailableMemory& avail, int64_t disk_bytes) {
  const auto mib = [](int64_t b) { return format_fixed(static_cast<double>(b) / (1 << 20), 1); };
  std::string text = str(
      "  available: host ", mib(avail.host_bytes), " MiB (", avail.host_source, ") | disk ",
      avail.disk_bytes < 0 ? "unknown" : mib(avail.disk_bytes) + " MiB", " at '", avail.disk_path,
      "'", avail.disk_in_memory.empty() ? "" : str(" (", avail.disk_in_memory, ": in RAM)"), "\n");
  if (!avail.disk_in_memory.empty() && disk_bytes > 0)  // Note [Offload in RAM]
    text += str("gpt2_train: warning: the offloaded bytes go to '", avail.disk_path, "', on ",
                avail.disk_in_memory, ", a file system in RAM: they do not leave memory (the ",
                "check counts them as host RAM); pass --nvme-dir a folder on a disk\n");
  return text;
}

void check_plan_fits(const MemoryPlan& plan, const PlanInputs& in, const AvailableMemory& avail) {
  std::string problems;
  int64_t need = 0, have = 0, cap = 0;
  // Advice names only the activation options the run does not use already.
  const bool recomputes = in.checkpoint_every_block || in.checkpoint_segments >= 0;
  const std::string act_advice =
      str("a smaller --batch or --seq", recomputes ? "" : ", --checkpoint-activations");
  const std::string offload_advice = in.offload_activations ? "" : ", --offload-activations";
  const auto ranks_on_host = static_cast<double>(plan.ranks_on_host);
  // The simulated device's memory is this host's: its bytes count against host RAM too (a run
  // on sim:100GiB that planned 23 GiB on the "device" passed the check and was killed by the OOM
  // killer).
  const int64_t sim_bytes = in.device.is_sim() ? plan.device_bytes : 0;
  const int64_t disk_need = clamp_bytes(static_cast<double>(plan.disk_bytes) * ranks_on_host);
  // Note [Offload in RAM]: files on tmpfs take the machine's memory, not a disk's.
  const int64_t ram_disk = avail.disk_in_memory.empty() ? 0 : disk_need;
  const int64_t host_need =
      clamp_bytes(static_cast<double>(plan.host_bytes + sim_bytes) * ranks_on_host) + ram_disk;
  const std::string ranks =
      plan.ranks_on_host > 1 ? str(" (", plan.ranks_on_host, " ranks on this host)") : "";
  if (avail.host_bytes >= 0 && host_need > avail.host_bytes) {
    problems += str(
        "host RAM: needs ", mib_text(host_need), ranks,
        sim_bytes > 0 ? str(" (", mib_text(sim_bytes), " of it on ", plan.device_name,
                            ", the simulated device, whose memory is the host's)")
                      : "",
        ram_disk > 0 ? str(" (", mib_text(ram_disk), " of it the offloaded bytes at '",
                           avail.disk_path, "', on ", avail.disk_in_memory,
                           ", which is RAM: pass --nvme-dir a folder on a disk)")
                     : "",
        ", ", mib_text(avail.host_bytes), " available (", avail.host_source,
        "); to fit: ", act_advice, in.device.is_cpu() ? "" : offload_advice,
        ", --offload nvme --fraction 1 (Adam states on disk)",
        in.device.is_cpu() ? "" : ", --gemini auto --host-capacity SIZE",
        plan.ranks_on_host > 1 ? ", --zero 1 or 2 (Adam states sharded), fewer ranks per host" : "",
        ", or a smaller model. ");
    need = host_need, have = avail.host_bytes;
  }
  if (in.device_capacity_bytes > 0 && plan.device_bytes > in.device_capacity_bytes) {
    problems +=
        str(plan.device_name, ": needs ", mib_text(plan.device_bytes), ", capacity ",
            mib_text(in.device_capacity_bytes), "; to fit: ", act_advice, offload_advice,
            in.gemini ? ", a larger capacity" : ", --gemini auto (parameters in chunks)", ". ");
    need = plan.device_bytes, cap = in.device_capacity_bytes;
  }
  if (avail.disk_bytes >= 0 && disk_need > avail.disk_bytes) {
    problems += str("disk at '", avail.disk_path, "': needs ", mib_text(disk_need), ranks, ", ",
                    mib_text(avail.disk_bytes),
                    " free; to fit: --nvme-dir on a larger disk, a smaller --fraction or a "
                    "larger --host-capacity. ");
    need = disk_need, have = avail.disk_bytes;
  }
  if (!problems.empty())
    throw OutOfMemory(str("the run does not fit, stopped before allocating: ", problems,
                          "--skip-memory-check runs anyway"),
                      need, have, cap);
}

}  // namespace mw::train
