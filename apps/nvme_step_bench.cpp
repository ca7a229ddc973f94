// nvme_step_bench: the step-time cost of NVMe offload, measured side by side in one process: two
// identical GPT-2 models, one with HybridAdam's m and v in RAM and one with them on disk, their
// steps alternating; the median of the per-pair ratios. The comparison and its report are
// bench/step_compare.h.

#include "bench/step_compare.h"
#include "cli.h"
#include "core/parallel.h"

namespace mw {
namespace {

int run(const cli::Parser& p) {
  cli::RunShapeLimits limits;
  limits.min_steps = 2;
  const cli::RunShape s = cli::run_shape(p, limits);
  set_num_threads(s.threads);
  optim::NvmeOffloadOptions nvme;
  nvme.fraction = p.real("fraction", 0.0, 1.0);
  nvme.dir = p.str("nvme-dir");
  nvme.window_bytes = p.bytes("nvme-window");
  const bench::StepCompareShape shape{s.model, s.config, s.batch, s.seq, s.steps, !p.has("no-fio")};
  return bench::compare_nvme_steps(shape, nvme, cli::print) ? 0 : 1;
}

}  // namespace
}  // namespace mw

int main(int argc, char** argv) {
  mw::cli::Parser p("nvme_step_bench",
                    "Step time with Adam states on NVMe against in RAM, alternating steps of two "
                    "identical models in one process; median of per-pair ratios.");
  mw::cli::declare_run_shape(
      p, {"11", "steps per model (the first is a warmup, excluded from medians)"});
  p.option("fraction", "1.0", "nvme_offload_fraction");
  p.option("nvme-dir", "", "directory for the states (default: a private temporary one)");
  p.option("nvme-window", "32MiB", "RAM for states in flight");
  p.flag("no-fio", "skip fio and the disk floor it gives (fio writes and reads 1 GiB twice)");
  return mw::cli::run_main(p, "nvme_step_bench", argc, argv,
                           [](const mw::cli::Parser& q) { return mw::run(q); });
}
