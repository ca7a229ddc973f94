// The whole machine's CPU time by kind, from the first line of /proc/stat: what the benchmarks
// print to show where an offloaded step's extra wall time went (Note [Stolen time]).
//
// Note [Stolen time]: in a virtual machine the hypervisor may run other work (another guest, or
// the host's emulation of this guest's disk) on the physical core behind a busy vCPU; the guest
// counts that time as "steal". On this project's 2-vCPU VMs, NVMe offload of GPT-2 small moves
// about 2 GB per step through the virtual disk, and while the compute threads keep both vCPUs busy
// the host's I/O work takes its CPU from them: 2026-11-26, three steps each, 604 ticks (6.0 s) of
// steal with --offload nvme against 2 without it, and fio alone on the idle VM 0. A stolen vCPU
// also idles its partner at the next barrier of a parallel op (idle + iowait 524 ticks against
// 24). No I/O engine avoids it but by moving fewer bytes; the benchmark prints it so that the
// reader can tell our cost from the host's.
#pragma once

#include <cstdint>

namespace mw::bench {

struct CpuTimes {
  double busy_ms = 0;   // user, nice, system, irq, softirq: summed over every CPU
  double idle_ms = 0;   // idle and iowait
  double steal_ms = 0;  // taken by the hypervisor while a vCPU wanted to run
  bool known = false;   // /proc/stat was read
};

// The totals since boot over all CPUs; known = false where /proc/stat cannot be read.
CpuTimes machine_cpu_times();

// b - a, field by field (known when both are).
CpuTimes operator-(const CpuTimes& b, const CpuTimes& a);
CpuTimes& operator+=(CpuTimes& a, const CpuTimes& b);

}  // namespace mw::bench
