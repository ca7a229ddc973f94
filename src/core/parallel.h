// Parallel loops over index ranges, on oneTBB.
//
// Note [Deterministic parallelism]: parallel_for only splits work whose result does not depend on
// the split (elementwise maps, disjoint rows). Reductions use parallel_reduce_blocks, which cuts
// the range into fixed blocks of `block` elements, reduces each block serially, and combines the
// partials in block order, so the result is bitwise identical for any number of threads.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mw {

// f(begin, end) over [0, n), split into pieces of at least `grain` indices.
template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  if (n <= grain) {
    f(int64_t{0}, n);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, grain),
                    [&](const tbb::blocked_range<int64_t>& r) { f(r.begin(), r.end()); });
}

// Reduces [0, n) in fixed blocks: partial[k] = f(k*block, min(n, (k+1)*block)); returns the
// partials in order (Note [Deterministic parallelism]). The caller combines them serially.
template <typename R, typename F>
std::vector<R> parallel_reduce_blocks(int64_t n, int64_t block, F&& f) {
  int64_t nblocks = n <= 0 ? 0 : (n + block - 1) / block;
  std::vector<R> partial(static_cast<size_t>(nblocks));
  parallel_for(nblocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) partial[k] = f(k * block, std::min(n, (k + 1) * block));
  });
  return partial;
}

// Sets the thread count for oneTBB and OpenBLAS together, so the two pools never oversubscribe
// the cores (Note [Threads], threads.cpp). 0 means all cores.
void set_num_threads(int threads);
int num_threads();
// The cores this process may use: its affinity mask, capped by its cgroup's CPU quota (Note
// [CPU quota], threads.cpp): what --threads 0 means.
int available_cores();
// The cores a cgroup v2 cpu.max ("200000 100000": quota and period, in us) allows, rounded up;
// 0 for "max ..." (no quota) or text that is not one.
int cpu_max_cores(const std::string& cpu_max);

}  // namespace mw
