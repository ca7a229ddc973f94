// nvme_bench: sequential write and read bandwidth of the offload I/O engine, next to fio's in the
// same run (the ceiling), like DeepSpeed's NVMe tuner.
//
//   nvme_bench --dir D [--size 2GiB] [--block 1MiB] [--depth 32] [--backend uring|threads]
//              [--reps N] [--json] [--no-fio]
//
// With none of --block/--depth/--backend it sweeps backend x depth {8, 32} x block {256KiB, 1MiB,
// 4MiB}; otherwise it runs the one configuration asked for (defaults fill the rest). The disk is
// noisy; use --reps 3 or more for figures you quote. The measurements and the report are
// bench/nvme_bench.h.
#include "bench/nvme_bench.h"

#include <iostream>

#include "cli.h"
#include "core/interrupt.h"
#include "offload/io/file.h"

namespace mw {
namespace {

int run(const cli::Parser& p) {
  bench::NvmeBenchRun run;
  run.dir = p.str("dir");
  run.size_bytes = p.bytes("size");
  const int64_t block_bytes = p.given("block") ? p.bytes("block") : 0;
  const int depth = p.given("depth") ? static_cast<int>(p.integer("depth", 1, 1024)) : 0;
  const int reps = p.given("reps") ? static_cast<int>(p.integer("reps", 1, 1000)) : 0;
  run.json = p.has("json");
  run.fio = !p.has("no-fio");
  MW_CHECK_T(InvalidArgument, !run.dir.empty(),
             "--dir is required (a directory on the drive to test)");
  MW_CHECK_T(InvalidArgument, run.size_bytes >= 4096 && run.size_bytes % 4096 == 0,
             "--size must be a positive multiple of 4096; got ", run.size_bytes);
  const std::vector<bench::NvmeBenchConfig> configs =
      bench::nvme_bench_configs(block_bytes, depth, p.str("backend"));
  run.reps = reps > 0 ? reps : configs.size() > 1 ? 1 : 3;
  io::ensure_directory(run.dir);
  if (run.fio && !bench::have_fio()) {
    std::cerr << "fio is not installed: skipping the fio ceiling (apt-get install fio)\n";
    run.fio = false;
  }
  for (const bench::NvmeBenchConfig& c : configs) cli::print(bench::run_nvme_bench(run, c));
  return 0;
}

}  // namespace
}  // namespace mw

int main(int argc, char** argv) {
  mw::install_stop_signal_handlers();  // Note [Stop signals]: fio's file is removed before exit
  mw::cli::Parser p("nvme_bench",
                    "Sequential write and read bandwidth of the I/O engine next to fio's, "
                    "alternating repetitions; with none of --block/--depth/--backend, a sweep.");
  p.option("dir", "", "a directory on the drive to test (required)");
  p.option("size", "2GiB", "bytes per pass, a multiple of 4096");
  p.option("block", "", "request size (default 1MiB; none of block/depth/backend: the sweep)");
  p.option("depth", "", "requests in flight, 1..1024 (default 32)");
  p.option("backend", "", "uring|threads (default uring)");
  p.option("reps", "", "repetitions, 1..1000 (default 3; 1 in the sweep)");
  p.flag("json", "one JSON object per configuration instead of text");
  p.flag("no-fio", "skip the fio ceiling");
  return mw::cli::run_main(p, "nvme_bench", argc, argv,
                           [](const mw::cli::Parser& q) { return mw::run(q); });
}
