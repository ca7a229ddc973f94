// adam_bench: times the CPU Adam step (optim/adam_cpu.h) on N fp32 parameters with f32 gradients
// and prints its effective bandwidth next to three memory ceilings measured in the same run:
//   copy:  a[i] = b[i] over two arrays of N floats (STREAM convention: 8 B/elem);
//   triad: a[i] = b[i] + s * c[i] over three arrays of N floats (STREAM convention: 12 B/elem);
//   rmw28: Adam's own access pattern (read p, g, m, v; write p, m, v; 28 B/elem) with trivial
//          arithmetic, i.e. the best any Adam kernel could do on these very arrays.
// Adam's effective GB/s counts 28 bytes per parameter. Every timed number is the median of several
// runs after a warmup run; arrays are initialised in parallel (first touch) so that their pages
// are faulted in, and spread over the threads, before anything is timed.
//
// usage: adam_bench [--numel N] [--steps K] [--threads T] [--isa scalar|avx2|avx512|all] [--json]
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "core/numbers.h"
#include "optim/adam_cpu.h"

namespace {

using mw::optim::Isa;

struct Options {
  int64_t numel = 124439808;  // GPT-2 small
  int steps = 10;
  int threads = 0;  // 0 = all cores
  std::string isa = "all";
  bool json = false;
};

const char* kUsage =
    "usage: adam_bench [--numel N] [--steps K] [--threads T] [--isa scalar|avx2|avx512|all] "
    "[--json]\n"
    "  --numel N    fp32 parameters (default 124439808, GPT-2 small)\n"
    "  --steps K    timed steps after one warmup step; the median is reported (default 10)\n"
    "  --threads T  oneTBB threads (default: all cores)\n"
    "  --isa X      kernel to time; 'all' times every ISA this CPU supports (default all)\n"
    "  --json       one JSON object per configuration instead of text\n";

// Thrown for a bad command line; main() prints the usage and exits 2.
struct UsageError : mw::InvalidArgument {
  using InvalidArgument::InvalidArgument;
};

int64_t parse_int(const std::string& flag, const char* text, int64_t min_value, int64_t max_value) {
  try {
    return mw::parse_integer(text, flag, min_value, max_value);
  } catch (const mw::InvalidArgument& e) {
    throw UsageError(e.what());
  }
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) throw UsageError(a + " needs a value");
      return argv[++i];
    };
    if (a == "--numel") {
      o.numel = parse_int(a, value(), 1, int64_t{1} << 40);
    } else if (a == "--steps") {
      o.steps = static_cast<int>(parse_int(a, value(), 1, 1000000));
    } else if (a == "--threads") {
      o.threads = static_cast<int>(parse_int(a, value(), 1, 4096));
    } else if (a == "--isa") {
      o.isa = value();
      if (o.isa != "all") {
        try {
          mw::optim::parse_isa(o.isa);
        } catch (const mw::InvalidArgument& e) {
          throw UsageError(e.what());
        }
      }
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      throw UsageError("unknown flag '" + a + "'");
    }
  }
  return o;
}

double now_ms() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

// Runs fn(begin, end) over [0, numel) in the same task split as adam_update_parallel, so that
// first-touch placement matches the timed loops.
template <typename Fn>
void parallel_chunks(int64_t numel, Fn&& fn) {
  const int64_t grain = mw::optim::kAdamGrainNumel;
  const int64_t tasks = (numel + grain - 1) / grain;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, tasks),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      fn(r.begin() * grain, std::min(numel, r.end() * grain));
                    });
}

float* floats(mw::AlignedBuffer& b) { return static_cast<float*>(b.data()); }

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

int run(const Options& o) {
  const int threads = o.threads > 0 ? o.threads : tbb::info::default_concurrency();
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);

  std::vector<Isa> isas;
  if (o.isa == "all") {
    isas = mw::optim::supported_isas();
  } else {
    const Isa isa = mw::optim::parse_isa(o.isa);
    if (!mw::optim::isa_supported(isa)) {
      throw UsageError(mw::str("--isa ", o.isa, ": this CPU lacks it; use --isa all"));
    }
    isas.push_back(isa);
  }

  const int64_t n = o.numel;
  const int64_t bytes = n * 4;
  mw::AlignedBuffer p(bytes), g(bytes), m(bytes), v(bytes);
  float *pp = floats(p), *gp = floats(g), *mp = floats(m), *vp = floats(v);
  parallel_chunks(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      // Deterministic, well-scaled values (no denormals): p in [-1, 1), g in [-1e-2, 1e-2).
      const auto h = static_cast<uint32_t>(i * 2654435761u);
      pp[i] = static_cast<float>(h >> 8) / float(1 << 23) - 1.f;
      gp[i] = 1e-2f * (static_cast<float>((h >> 4) & 0xffff) / 32768.f - 1.f);
      mp[i] = 0.f;
      vp[i] = 0.f;
    }
  });

  // Ceiling 1: STREAM copy and triad over three more arrays of n floats, freed afterwards.
  double triad_gbps = 0.0, copy_gbps = 0.0;
  {
    mw::AlignedBuffer a(bytes), b(bytes), c(bytes);
    float *ap = floats(a), *bp = floats(b), *cp = floats(c);
    parallel_chunks(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) ap[i] = 0.f, bp[i] = 1.f, cp[i] = 2.f;
    });
    const float s = 0.5f;
    const double ms = time_median_ms(5, [&] {
      parallel_chunks(n, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) ap[i] = bp[i] + s * cp[i];
      });
    });
    triad_gbps = 12.0 * n / ms / 1e6;
    const double copy_ms = time_median_ms(5, [&] {
      parallel_chunks(n, [&](int64_t lo, int64_t hi) { std::copy(bp + lo, bp + hi, ap + lo); });
    });
    copy_gbps = 8.0 * n / copy_ms / 1e6;
  }
  // Ceiling 2: Adam's access pattern on the Adam arrays with trivial arithmetic (scale 0 keeps the
  // values; it is a run-time value, so the loads and stores stay).
  volatile float zero_v = 0.f;
  const float zero = zero_v;
  const double rmw_ms = time_median_ms(5, [&] {
    parallel_chunks(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const float gi = gp[i] * zero;
        pp[i] += gi;
        mp[i] += gi;
        vp[i] += gi;
      }
    });
  });
  const double rmw_gbps = 28.0 * n / rmw_ms / 1e6;

  if (!o.json) {
    std::printf("adam_bench: numel %lld (%.2f GB moved per step at 28 B/param), threads %d\n",
                static_cast<long long>(n), 28.0 * n / 1e9, threads);
    std::printf(
        "ceilings: copy %.1f GB/s (8 B/elem), triad %.1f GB/s (12 B/elem), Adam-pattern rmw %.1f "
        "GB/s = %.1f ms/step\n",
        copy_gbps, triad_gbps, rmw_gbps, rmw_ms);
  }

  const mw::optim::AdamHyper hyper;  // defaults: lr 1e-3, betas (0.9, 0.999), AdamW, wd 0
  for (Isa isa : isas) {
    int64_t step = 0;
    std::vector<double> ms;
    for (int k = 0; k <= o.steps; ++k) {  // k == 0 is the warmup step
      const mw::optim::AdamStepScalars s = mw::optim::make_adam_step_scalars(hyper, ++step, -1.f);
      const double t0 = now_ms();
      mw::optim::adam_update_parallel(isa, s, pp, gp, mw::DType::F32, mp, vp, n);
      const double t1 = now_ms();
      if (k > 0) ms.push_back(t1 - t0);
    }
    const double med = median(ms);
    const double best = *std::min_element(ms.begin(), ms.end());
    const double gbps = 28.0 * n / med / 1e6;
    if (o.json) {
      std::printf(
          "{\"numel\": %lld, \"isa\": \"%s\", \"threads\": %d, \"steps\": %d, \"median_ms\": %.3f, "
          "\"min_ms\": %.3f, \"GBps\": %.2f, \"ceiling_copy_GBps\": %.2f, "
          "\"ceiling_triad_GBps\": %.2f, \"ceiling_rmw_GBps\": %.2f, \"ceiling_rmw_ms\": %.3f}\n",
          static_cast<long long>(n), mw::optim::isa_name(isa), threads, o.steps, med, best, gbps,
          copy_gbps, triad_gbps, rmw_gbps, rmw_ms);
    } else {
      std::printf(
          "%-7s median %8.2f ms (min %8.2f)  %6.1f GB/s  = %3.0f%% of rmw ceiling, %3.0f%% of "
          "triad, %3.0f%% of copy\n",
          mw::optim::isa_name(isa), med, best, gbps, 100.0 * gbps / rmw_gbps,
          100.0 * gbps / triad_gbps, 100.0 * gbps / copy_gbps);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "adam_bench: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "adam_bench: %s\n", e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "adam_bench: internal error: an unknown exception\n");
    return 1;
  }
}
