// adam_bench's measurements and report (bench/adam_bench.h).
#include "bench/adam_bench.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/numbers.h"

namespace mw::bench {

namespace {

double now_ms() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
}

// Runs fn(begin, end) over [0, numel) in the same task split as adam_update_parallel, so that
// first-touch placement matches the timed loops.
template <typename Fn>
void parallel_chunks(int64_t numel, Fn&& fn) {
  const int64_t grain = optim::kAdamGrainNumel;
  const int64_t tasks = (numel + grain - 1) / grain;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, tasks),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      fn(r.begin() * grain, std::min(numel, r.end() * grain));
                    });
}

float* floats(AlignedBuffer& b) { return static_cast<float*>(b.data()); }

// Median time in ms of `runs` calls of fn() after one warmup call.
template <typename Fn>
double time_median_ms(int runs, Fn&& fn) {
  fn();
  std::vector<double> ms;
  for (int r = 0; r < runs; ++r) {
    const double t0 = now_ms();
    fn();
    ms.push_back(now_ms() - t0);
  }
  return median(ms);
}

// Adam's four arrays, first touched in parallel with deterministic, well-scaled values (no
// denormals): p in [-1, 1), g in [-1e-2, 1e-2), m = v = 0.
struct AdamArrays {
  AlignedBuffer p, g, m, v;
  explicit AdamArrays(int64_t n) : p(n * 4), g(n * 4), m(n * 4), v(n * 4) {
    float *pp = floats(p), *gp = floats(g), *mp = floats(m), *vp = floats(v);
    parallel_chunks(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const auto h = static_cast<uint32_t>(i * 2654435761u);
        pp[i] = static_cast<float>(h >> 8) / float(1 << 23) - 1.f;
        gp[i] = 1e-2f * (static_cast<float>((h >> 4) & 0xffff) / 32768.f - 1.f);
        mp[i] = 0.f;
        vp[i] = 0.f;
      }
    });
  }
};

struct Ceilings {
  double copy_gbps = 0, triad_gbps = 0, rmw_gbps = 0, rmw_ms = 0;
};

// STREAM copy and triad over three more arrays of n floats, freed afterwards.
void stream_ceilings(int64_t n, Ceilings& c) {
  AlignedBuffer a(n * 4), b(n * 4), cc(n * 4);
  float *ap = floats(a), *bp = floats(b), *cp = floats(cc);
  parallel_chunks(n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) ap[i] = 0.f, bp[i] = 1.f, cp[i] = 2.f;
  });
  const float s = 0.5f;
  const double ms = time_median_ms(5, [&] {
    parallel_chunks(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) ap[i] = bp[i] + s * cp[i];
    });
  });
  c.triad_gbps = 12.0 * n / ms / 1e6;
  const double copy_ms = time_median_ms(5, [&] {
    parallel_chunks(n, [&](int64_t lo, int64_t hi) { std::copy(bp + lo, bp + hi, ap + lo); });
  });
  c.copy_gbps = 8.0 * n / copy_ms / 1e6;
}

// Adam's access pattern on the Adam arrays with trivial arithmetic (scale 0 keeps the values; it
// is a run-time value, so the loads and stores stay).
void rmw_ceiling(int64_t n, AdamArrays& x, Ceilings& c) {
  float *pp = floats(x.p), *gp = floats(x.g), *mp = floats(x.m), *vp = floats(x.v);
  volatile float zero_v = 0.f;
  const float zero = zero_v;
  c.rmw_ms = time_median_ms(5, [&] {
    parallel_chunks(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const float gi = gp[i] * zero;
        pp[i] += gi;
        mp[i] += gi;
        vp[i] += gi;
      }
    });
  });
  c.rmw_gbps = 28.0 * n / c.rmw_ms / 1e6;
}

std::string kernel_line(const AdamBenchOptions& o, optim::Isa isa, const std::vector<double>& ms,
                        const Ceilings& c) {
  const int64_t n = o.numel;
  const double med = median(ms);
  const double best = *std::min_element(ms.begin(), ms.end());
  const double gbps = 28.0 * n / med / 1e6;
  if (o.json)
    return strprintf(
        "{\"numel\": %lld, \"isa\": \"%s\", \"threads\": %d, \"steps\": %d, \"median_ms\": %.3f, "
        "\"min_ms\": %.3f, \"GBps\": %.2f, \"ceiling_copy_GBps\": %.2f, "
        "\"ceiling_triad_GBps\": %.2f, \"ceiling_rmw_GBps\": %.2f, \"ceiling_rmw_ms\": %.3f}\n",
        static_cast<long long>(n), optim::isa_name(isa), o.threads, o.steps, med, best, gbps,
        c.copy_gbps, c.triad_gbps, c.rmw_gbps, c.rmw_ms);
  return strprintf(
      "%-7s median %8.2f ms (min %8.2f)  %6.1f GB/s  = %3.0f%% of rmw ceiling, %3.0f%% of "
      "triad, %3.0f%% of copy\n",
      optim::isa_name(isa), med, best, gbps, 100.0 * gbps / c.rmw_gbps, 100.0 * gbps / c.triad_gbps,
      100.0 * gbps / c.copy_gbps);
}

}  // namespace

void run_adam_bench(const AdamBenchOptions& o, const LineSink& log) {
  const int64_t n = o.numel;
  AdamArrays x(n);
  Ceilings c;
  stream_ceilings(n, c);
  rmw_ceiling(n, x, c);
  if (!o.json) {
    log(strprintf("adam_bench: numel %lld (%.2f GB moved per step at 28 B/param), threads %d\n",
                  static_cast<long long>(n), 28.0 * n / 1e9, o.threads));
    log(strprintf(
        "ceilings: copy %.1f GB/s (8 B/elem), triad %.1f GB/s (12 B/elem), Adam-pattern rmw %.1f "
        "GB/s = %.1f ms/step\n",
        c.copy_gbps, c.triad_gbps, c.rmw_gbps, c.rmw_ms));
  }
  const optim::AdamHyper hyper;  // defaults: lr 1e-3, betas (0.9, 0.999), AdamW, wd 0
  float *pp = floats(x.p), *gp = floats(x.g), *mp = floats(x.m), *vp = floats(x.v);
  for (optim::Isa isa : o.isas) {
    int64_t step = 0;
    std::vector<double> ms;
    for (int k = 0; k <= o.steps; ++k) {  // k == 0 is the warmup step
      const optim::AdamStepScalars s = optim::make_adam_step_scalars(hyper, ++step, -1.f);
      const double t0 = now_ms();
      optim::adam_update_parallel(isa, s, pp, gp, DType::F32, mp, vp, n);
      const double t1 = now_ms();
      if (k > 0) ms.push_back(t1 - t0);
    }
    log(kernel_line(o, isa, ms, c));
  }
}

}  // namespace mw::bench
