// Note [Threads]: one thread pool, not two. OpenBLAS is told to run single-threaded, and memwall's
// gemm splits each product into tiles that oneTBB runs in parallel (cpu/gemm.cpp). OpenBLAS's own
// pthreads busy-wait after every call (about 2^28 cycles by default), so letting both pools run
// means each steals the cores the other needs: the "spinning threads" cost that docs/references.md
// records for PyTorch on this machine.
#include <tbb/global_control.h>
#include <tbb/info.h>

#include <memory>
#include <mutex>

#include "core/parallel.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace mw {

namespace {
std::mutex g_threads_mutex;
std::unique_ptr<tbb::global_control> g_tbb_control;
int g_threads = 0;
}  // namespace

void set_num_threads(int threads) {
  std::lock_guard<std::mutex> lock(g_threads_mutex);
  if (threads <= 0) threads = tbb::info::default_concurrency();
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

int available_cores() { return tbb::info::default_concurrency(); }

}  // namespace mw
