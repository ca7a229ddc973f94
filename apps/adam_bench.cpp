// adam_bench: times the CPU Adam step (optim/adam_cpu.h) on N fp32 parameters with f32 gradients
// and prints its effective bandwidth next to three memory ceilings measured in the same run (copy,
// triad, and Adam's own access pattern); the measurements and the report are bench/adam_bench.h.
//
// usage: adam_bench [--numel N] [--steps K] [--threads T] [--isa scalar|avx2|avx512|all] [--json]
#include "bench/adam_bench.h"

#include <tbb/global_control.h>
#include <tbb/info.h>

#include "cli.h"

namespace mw {
namespace {

std::vector<optim::Isa> isas_to_time(const std::string& name) {
  if (name == "all") return optim::supported_isas();
  optim::Isa isa{};
  try {
    isa = optim::parse_isa(name);
  } catch (const InvalidArgument& e) {
    throw cli::UsageError(e.what());
  }
  if (!optim::isa_supported(isa))
    throw cli::UsageError(str("--isa ", name, ": this CPU lacks it; use --isa all"));
  return {isa};
}

int run(const cli::Parser& p) {
  bench::AdamBenchOptions o;
  o.numel = p.integer("numel", 1, int64_t{1} << 40);
  o.steps = static_cast<int>(p.integer("steps", 1, 1000000));
  const int threads = p.given("threads") ? static_cast<int>(p.integer("threads", 1, 4096)) : 0;
  o.isas = isas_to_time(p.str("isa"));
  o.json = p.has("json");
  o.threads = threads > 0 ? threads : tbb::info::default_concurrency();
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, o.threads);
  bench::run_adam_bench(o, cli::print);
  return 0;
}

}  // namespace
}  // namespace mw

int main(int argc, char** argv) {
  mw::cli::Parser p("adam_bench",
                    "The CPU Adam step's effective bandwidth against copy, triad and Adam-pattern "
                    "ceilings measured in the same run.");
  p.option("numel", "124439808", "fp32 parameters (GPT-2 small)");
  p.option("steps", "10", "timed steps after one warmup step; the median is reported");
  p.option("threads", "", "oneTBB threads (default: all cores)");
  p.option("isa", "all", "kernel to time: scalar|avx2|avx512, or all that this CPU supports");
  p.flag("json", "one JSON object per configuration instead of text");
  return mw::cli::run_main(p, "adam_bench", argc, argv,
                           [](const mw::cli::Parser& q) { return mw::run(q); });
}
