// gemini_step_bench: Gemini's step-time cost and its traffic, measured side by side in one process:
// a plain GPT-2 model on an unlimited sim device against Gemini auto, Gemini static cpu and Gemini
// auto with the copy worker (Note [Copy worker]), each on its own capped sim device, their steps
// rotating; medians of per-round ratios, losses equal bit for bit. The comparison and its report
// are bench/step_compare.h.

#include "autograd/autocast.h"
#include "bench/step_compare.h"
#include "cli.h"
#include "core/parallel.h"

namespace mw {
namespace {

int run(const cli::Parser& p) {
  cli::RunShapeLimits limits;
  limits.min_steps = 3;
  const cli::RunShape s = cli::run_shape(p, limits);
  const int64_t capacity = p.bytes("capacity");
  set_num_threads(s.threads);
  bench::StepCompareShape shape{s.model, s.config, s.batch, s.seq, s.steps};
  shape.precision = parse_precision(p.choice("precision", {"fp32", "bf16", "fp16"}));
  const bool same = bench::compare_gemini_steps(shape, capacity, cli::print);
  return same ? 0 : 1;
}

}  // namespace
}  // namespace mw

int main(int argc, char** argv) {
  mw::cli::Parser p("gemini_step_bench",
                    "Step time and traffic of Gemini auto, static cpu and auto with the copy "
                    "worker against a plain run, rotating steps of four identical models in one "
                    "process.");
  mw::cli::declare_run_shape(p, {"8", "steps per model (the first two are excluded from medians)"});
  p.option("capacity", "768MiB", "capacity of each Gemini model's sim device");
  p.option("precision", "fp32",
           "fp32|bf16|fp16: every model's forward under autocast to it; Gemini's with 16-bit "
           "copies of the blocks' matrices (docs/gemini.md)");
  return mw::cli::run_main(p, "gemini_step_bench", argc, argv,
                           [](const mw::cli::Parser& q) { return mw::run(q); });
}
