// nvme_bench's measurements and report (apps/nvme_bench.cpp): sequential write and read bandwidth
// of the offload I/O engine, next to fio's in the same run (the ceiling), like DeepSpeed's NVMe
// tuner. Each repetition runs ours (write, then read back) and then fio (ioengine=io_uring,
// direct=1, same size, block and depth), alternating, and the medians are reported.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/format.h"
#include "core/error.h"
#include "offload/io/io_engine.h"

namespace mw::bench {

struct NvmeBenchConfig {
  io::BackendKind backend;
  int64_t block_bytes;
  int depth;
};

// With none of block/depth/backend given (0, 0, ""), the sweep: backend x depth {8, 32} x block
// {256KiB, 1MiB, 4MiB}; otherwise the one configuration asked for, defaults filling the rest
// (uring, 1 MiB, 32). InvalidArgument for a bad backend, block or depth.
std::vector<NvmeBenchConfig> nvme_bench_configs(int64_t block_bytes, int depth,
                                                const std::string& backend);

// True when fio is on the PATH.
bool have_fio();

struct NvmeBenchRun {
  std::string dir;
  int64_t size_bytes = int64_t{2} << 30;
  int reps = 1;
  bool fio = true, json = false;
};

// Runs `reps` alternated repetitions of ours and fio for `c`; returns its report line. A stop
// signal (Note [Stop signals]) ends it with Interrupted, leaving no file behind.
std::string run_nvme_bench(const NvmeBenchRun& run, const NvmeBenchConfig& c);

// fio could not be started or did not report a rate (a file system that refuses O_DIRECT, a
// missing io_uring): nvme_bench stops with it, nvme_step_bench leaves the disk floor out.
class FioFailed : public Error {
 public:
  using Error::Error;
};

// fio alone in `dir` (io_uring, O_DIRECT, 1 MiB blocks, depth 32): write `size_bytes`, then read
// them back; GB/s each way. Its file is removed on every path. Needs have_fio(); FioFailed.
struct FioRates {
  double write_GBps = 0, read_GBps = 0;
};
FioRates measure_fio(const std::string& dir, int64_t size_bytes);

// "2GiB", "256KiB", "4096B": the largest binary unit that divides n.
std::string format_bytes(int64_t n);

}  // namespace mw::bench
