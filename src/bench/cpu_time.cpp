// machine_cpu_times (bench/cpu_time.h): the "cpu" line of /proc/stat, in ticks of USER_HZ.
#include "bench/cpu_time.h"

#include <unistd.h>

#include <fstream>
#include <string>

namespace mw::bench {

CpuTimes machine_cpu_times() {
  CpuTimes t;
  std::ifstream f("/proc/stat");
  std::string cpu;
  // user nice system idle iowait irq softirq steal (guest time is already in user and nice).
  long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (!(f >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) ||
      cpu != "cpu")
    return t;
  const double ms_per_tick = 1e3 / static_cast<double>(::sysconf(_SC_CLK_TCK));
  t.busy_ms = static_cast<double>(user + nice + system + irq + softirq) * ms_per_tick;
  t.idle_ms = static_cast<double>(idle + iowait) * ms_per_tick;
  t.steal_ms = static_cast<double>(steal) * ms_per_tick;
  t.known = true;
  return t;
}

CpuTimes operator-(const CpuTimes& b, const CpuTimes& a) {
  CpuTimes d;
  d.busy_ms = b.busy_ms - a.busy_ms;
  d.idle_ms = b.idle_ms - a.idle_ms;
  d.steal_ms = b.steal_ms - a.steal_ms;
  d.known = a.known && b.known;
  return d;
}

CpuTimes& operator+=(CpuTimes& a, const CpuTimes& b) {
  a.busy_ms += b.busy_ms;
  a.idle_ms += b.idle_ms;
  a.steal_ms += b.steal_ms;
  a.known = b.known;
  return a;
}

}  // namespace mw::bench
