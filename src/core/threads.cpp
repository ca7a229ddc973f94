// Note [Threads]: one thread pool, not two. OpenBLAS is told to run single-threaded, and memwall's
// gemm splits each product into tiles that oneTBB runs in parallel (cpu/gemm.cpp). OpenBLAS's own
// pthreads busy-wait after every call (about 2^28 cycles by default), so letting both pools run
// means each steals the cores the other needs: the "spinning threads" cost that docs/references.md
// records for PyTorch on this machine.
#include <dlfcn.h>
#include <tbb/global_control.h>
#include <tbb/info.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>

#include "core/parallel.h"
#include "core/process_limits.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace mw {

namespace {

// Note [OpenBLAS kernels]: Debian 12's OpenBLAS (0.3.21, built for every x86 core and choosing
// at load) does not know Intel's newer Xeons (family 6 model 207, an Emerald Rapids with AVX-512,
// this project's session-39 machine) and falls back to its Prescott kernels, SSE3 only: GPT-2
// small's products ran at 41.6 GFLOP/s on two cores, 94% of the step. Where OpenBLAS chose
// Prescott on a CPU with AVX-512 (or AVX2 and FMA), it is made to choose SkylakeX (Haswell) as
// OPENBLAS_CORETYPE does, once, before the first product: its own loader entry points, looked up
// at run time (absent from a build for one core, which then keeps its choice). An
// OPENBLAS_CORETYPE the user set is left as it is, and so is any core OpenBLAS did recognise. The
// variable is set for child processes too (gpt2_bench's PyTorch peer, which uses the same
// OpenBLAS, then gets the same kernels).
void choose_blas_kernels() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  using Name = char* (*)();
  using Init = void (*)();
  const auto corename = reinterpret_cast<Name>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  const auto quit = reinterpret_cast<Init>(::dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
  const auto init = reinterpret_cast<Init>(::dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  if (corename == nullptr || quit == nullptr || init == nullptr) return;
  const char* name = corename();
  if (name == nullptr || std::string(name) != "Prescott") return;
  const char* core = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512cd"))
    core = "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    core = "Haswell";
  if (core == nullptr) return;
  ::setenv("OPENBLAS_CORETYPE", core, 1);
  quit();
  init();
}

std::mutex g_threads_mutex;
std::unique_ptr<tbb::global_control> g_tbb_control;
int g_threads = 0;
}  // namespace

void set_num_threads(int threads) {
  static std::once_flag kernels;
  std::call_once(kernels, choose_blas_kernels);  // Note [OpenBLAS kernels]
  std::lock_guard<std::mutex> lock(g_threads_mutex);
  if (threads <= 0) threads = available_cores();  // Note [CPU quota]
  g_tbb_control = std::make_unique<tbb::global_control>(
      tbb::global_control::max_allowed_parallelism, static_cast<size_t>(threads));
  openblas_set_num_threads(1);
  g_threads = threads;
}

int num_threads() {
  {
    std::lock_guard<std::mutex> lock(g_threads_mutex);
    if (g_threads > 0) return g_threads;
  }
  set_num_threads(0);
  return g_threads;
}

// Note [CPU quota]: a container started with `docker --cpus=2` (or a Kubernetes CPU limit) on a
// 64-core host may run on all 64 cores but gets 2 cores' time per period; oneTBB 2021.8 (Debian
// 12) sizes its pool by the affinity mask alone, so --threads 0 started 64 workers whose spinning
// the kernel throttled, the documented way to make such a run many times slower (oneTBB issue
// 190). The quota of this process's cgroup and of each cgroup above it (cgroup v2 cpu.max, as
// in /proc/self/cgroup; v1's cpu.cfs_quota_us / cpu.cfs_period_us likewise) caps the count.
int cpu_max_cores(const std::string& cpu_max) {
  std::istringstream in(cpu_max);
  std::string quota;
  double period = 0;
  if (!(in >> quota >> period) || quota == "max" || period <= 0) return 0;
  char* end = nullptr;
  const double q = std::strtod(quota.c_str(), &end);
  if (end == quota.c_str() || *end != '\0' || q <= 0) return 0;
  return static_cast<int>(std::ceil(q / period - 1e-9));
}

namespace {

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The smallest quota on the way from this process's cgroup up to the root; 0 when none.
int cgroup_cpu_quota_cores() {
  int cores = 0;
  for_each_cgroup_level("cpu", [&](const std::string& dir, bool v2) {
    const int c = cpu_max_cores(v2 ? read_first_line(dir + "/cpu.max")
                                   : read_first_line(dir + "/cpu.cfs_quota_us") + " " +
                                         read_first_line(dir + "/cpu.cfs_period_us"));
    if (c > 0 && (cores == 0 || c < cores)) cores = c;
  });
  return cores;
}

}  // namespace

int available_cores() {
  static const int cores = [] {
    const int affinity = tbb::info::default_concurrency();
    const int quota = cgroup_cpu_quota_cores();
    return quota > 0 ? std::max(1, std::min(affinity, quota)) : affinity;
  }();
  return cores;
}

}  // namespace mw
