// nvme_bench's measurements and report (bench/nvme_bench.h).
#include "bench/nvme_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "core/allocator.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/numbers.h"
#include "offload/io/file.h"

namespace mw::bench {

std::string format_bytes(int64_t n) {
  if (n % (int64_t{1} << 30) == 0) return str(n >> 30, "GiB");
  if (n % (int64_t{1} << 20) == 0) return str(n >> 20, "MiB");
  if (n % (int64_t{1} << 10) == 0) return str(n >> 10, "KiB");
  return str(n, "B");
}

std::vector<NvmeBenchConfig> nvme_bench_configs(int64_t block_bytes, int depth,
                                                const std::string& backend) {
  std::vector<NvmeBenchConfig> configs;
  if (block_bytes == 0 && depth == 0 && backend.empty()) {
    for (auto b : {io::BackendKind::kUring, io::BackendKind::kThreads})
      for (int d : {8, 32})
        for (int64_t bs : {int64_t{256} << 10, int64_t{1} << 20, int64_t{4} << 20})
          configs.push_back({b, bs, d});
  } else {
    io::BackendKind b = backend.empty() ? io::BackendKind::kUring : io::parse_backend_kind(backend);
    MW_CHECK_T(InvalidArgument, b != io::BackendKind::kAuto, "--backend must be uring or threads");
    configs.push_back({b, block_bytes ? block_bytes : int64_t{1} << 20, depth ? depth : 32});
  }
  for (const NvmeBenchConfig& c : configs) {
    MW_CHECK_T(InvalidArgument, c.block_bytes >= 4096 && c.block_bytes % 4096 == 0,
               "--block must be a positive multiple of 4096; got ", c.block_bytes);
    MW_CHECK_T(InvalidArgument, c.depth >= 1 && c.depth <= 1024, "--depth must be in [1, 1024]");
  }
  return configs;
}

namespace {

struct Rates {
  double write_GBps = 0, read_GBps = 0;
};

// Waits for every request in flight, ignoring their errors (the buffers must outlive them).
void drain(std::vector<io::IoHandle>& slots) {
  for (auto& h : slots) {
    try {
      h.wait();
    } catch (...) {
    }
  }
}

// One pass over the file with `depth` requests in flight, as fio keeps its queue: wait until any
// request finishes, then refill every finished slot in one batch (one submit). Returns GB/s (1e9
// bytes per second).
double pass(io::IoEngine& engine, const io::ScratchFile& file, int64_t size_bytes,
            int64_t block_bytes, int depth, std::vector<AlignedBuffer>& bufs, io::IoOp op) {
  std::vector<io::IoHandle> slots(depth);  // default handles are done: every slot starts free
  std::vector<io::IoRequest> batch;
  std::vector<int> batch_slots;
  auto start = std::chrono::steady_clock::now();
  int64_t off = 0;
  try {
    while (off < size_bytes) {
      throw_if_stop_requested("during a pass");
      engine.wait_any(slots);
      batch.clear();
      batch_slots.clear();
      for (int k = 0; k < depth && off < size_bytes; ++k) {
        if (!slots[k].done()) continue;
        slots[k].wait();  // throws its IoError, if any
        batch.push_back({file.fd(), file.path(), off, bufs[k].data(),
                         std::min(block_bytes, size_bytes - off), op});
        batch_slots.push_back(k);
        off += block_bytes;
      }
      std::vector<io::IoHandle> handles = engine.submit(batch);
      for (size_t j = 0; j < handles.size(); ++j) slots[batch_slots[j]] = handles[j];
    }
  } catch (...) {  // the buffers outlive no request: wait for those in flight, then rethrow
    drain(slots);
    throw;
  }
  for (auto& h : slots) h.wait();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(size_bytes) / s / 1e9;
}

Rates run_ours(const std::string& dir, int64_t size_bytes, const NvmeBenchConfig& c) {
  io::IoOptions o;
  o.backend = c.backend;
  o.queue_depth = c.depth;
  auto engine = io::IoEngine::create(o);
  io::ScratchFile file(dir, "nvme-bench", /*want_direct=*/true);
  file.unlink_now();  // nothing left behind, even after kill -9
  MW_CHECK_T(Error, file.direct(), "the file system of '", dir,
             "' refuses O_DIRECT, so this would measure the page cache; use a disk directory");
  file.reserve(size_bytes);  // laid out first, as fio does, so writes do not extend the file
  std::vector<AlignedBuffer> bufs;
  std::mt19937_64 rng(1);
  for (int d = 0; d < c.depth; ++d) {
    bufs.emplace_back(c.block_bytes);
    auto* p = static_cast<uint64_t*>(bufs.back().data());
    for (int64_t k = 0; k < c.block_bytes / 8; ++k) p[k] = rng();
  }
  Rates r;
  r.write_GBps = pass(*engine, file, size_bytes, c.block_bytes, c.depth, bufs, io::IoOp::kWrite);
  r.read_GBps = pass(*engine, file, size_bytes, c.block_bytes, c.depth, bufs, io::IoOp::kRead);
  return r;
}

// bw_bytes of the "read" or "write" section of fio's JSON output.
double fio_bw_bytes(const std::string& json, const std::string& section) {
  size_t s = json.find("\"" + section + "\" : {");
  if (s == std::string::npos) return -1;
  size_t k = json.find("\"bw_bytes\"", s);
  if (k == std::string::npos) return -1;
  size_t colon = json.find(':', k);
  return std::atof(json.c_str() + colon + 1);
}

// fio reads a ':' in --filename as the start of a second file name: "\:" is the character.
std::string fio_file_name(const std::string& path) {
  std::string out;
  for (const char c : path) out += c == ':' ? std::string("\\:") : std::string(1, c);
  return out;
}

double run_fio(const std::string& file, int64_t size_bytes, const NvmeBenchConfig& c,
               const char* rw) {
  std::string cmd =
      str("fio --name=mwbench --filename=", shell_quote(fio_file_name(file)),
          " --size=", size_bytes, " --bs=", c.block_bytes, " --iodepth=", c.depth,
          " --ioengine=io_uring --direct=1 --rw=", rw, " --output-format=json 2>/dev/null");
  FILE* pipe = ::popen(cmd.c_str(), "r");
  MW_CHECK_T(bench::FioFailed, pipe != nullptr, "could not start fio: ", cmd);
  std::string out;
  char chunk[4096];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof chunk, pipe)) > 0) out.append(chunk, n);
  int status = ::pclose(pipe);
  double bw = fio_bw_bytes(out, std::string(rw) == "write" ? "write" : "read");
  MW_CHECK_T(bench::FioFailed, status == 0 && bw > 0, "fio failed (exit status ", status,
             "): ", cmd);
  return bw / 1e9;
}

Rates run_fio_pair(const std::string& dir, int64_t size_bytes, const NvmeBenchConfig& c) {
  std::string file = str(dir, "/fio-bench-", ::getpid(), ".dat");
  // fio makes a missing directory (nvme_step_bench passes the states' private directory, removed
  // as soon as their files were made): remove what it made, or every run left one behind.
  const bool made_by_fio = ::access(dir.c_str(), F_OK) != 0;
  auto clean = [&] {
    ::unlink(file.c_str());
    if (made_by_fio) ::rmdir(dir.c_str());
  };
  Rates r;
  try {
    r.write_GBps = run_fio(file, size_bytes, c, "write");
    r.read_GBps = run_fio(file, size_bytes, c, "read");
  } catch (...) {
    clean();
    throw;
  }
  clean();
  throw_if_stop_requested("after a fio run");  // fio's file is gone; stop now
  return r;
}

// Every repetition's rates: ours (w, r) and fio's (w, r) when it ran.
struct Samples {
  std::vector<double> ow, orr, fw, fr;
};

std::string list(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t k = 0; k < v.size(); ++k) out += str(k ? ", " : "", v[k]);
  return out + "]";
}

std::string json_line(const NvmeBenchRun& run, const NvmeBenchConfig& c, const Samples& x) {
  const double w = median(x.ow), rd = median(x.orr), fwm = median(x.fw), frm = median(x.fr);
  std::string out = strprintf(
      "{\"backend\": \"%s\", \"block\": %lld, \"depth\": %d, \"size\": %lld, \"reps\": %d, "
      "\"write_GBps\": %.3f, \"read_GBps\": %.3f",
      io::backend_kind_name(c.backend), static_cast<long long>(c.block_bytes), c.depth,
      static_cast<long long>(run.size_bytes), run.reps, w, rd);
  if (run.fio)
    out += strprintf(
        ", \"fio_write_GBps\": %.3f, \"fio_read_GBps\": %.3f, \"write_ratio\": %.3f, "
        "\"read_ratio\": %.3f",
        fwm, frm, w / fwm, rd / frm);
  out += strprintf(", \"write_GBps_reps\": %s, \"read_GBps_reps\": %s", list(x.ow).c_str(),
                   list(x.orr).c_str());
  if (run.fio)
    out += strprintf(", \"fio_write_GBps_reps\": %s, \"fio_read_GBps_reps\": %s",
                     list(x.fw).c_str(), list(x.fr).c_str());
  return out + "}\n";
}

std::string text_line(const NvmeBenchRun& run, const NvmeBenchConfig& c, const Samples& x) {
  const double w = median(x.ow), rd = median(x.orr), fwm = median(x.fw), frm = median(x.fr);
  // Paired ratio: ours over the fio run right after it, then the median. On a noisy disk this
  // is steadier than a ratio of medians, since neighbours in time share the disk's mood.
  std::vector<double> pw, pr;
  for (size_t k = 0; k < x.fw.size(); ++k) {
    pw.push_back(x.ow[k] / x.fw[k]);
    pr.push_back(x.orr[k] / x.fr[k]);
  }
  std::string out = strprintf("%-7s block %-6s depth %-3d size %s (median of %d): write %.2f GB/s",
                              io::backend_kind_name(c.backend), format_bytes(c.block_bytes).c_str(),
                              c.depth, format_bytes(run.size_bytes).c_str(), run.reps, w);
  if (run.fio) out += strprintf(" (fio %.2f, %.2fx; paired %.2fx)", fwm, w / fwm, median(pw));
  out += strprintf("  read %.2f GB/s", rd);
  if (run.fio) out += strprintf(" (fio %.2f, %.2fx; paired %.2fx)", frm, rd / frm, median(pr));
  return out + "\n";
}

}  // namespace

FioRates measure_fio(const std::string& dir, int64_t size_bytes) {
  const Rates r = run_fio_pair(dir, size_bytes, {io::BackendKind::kUring, int64_t{1} << 20, 32});
  return {r.write_GBps, r.read_GBps};
}

bool have_fio() {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string candidate = p.substr(start, end - start) + "/fio";
    if (::access(candidate.c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

std::string run_nvme_bench(const NvmeBenchRun& run, const NvmeBenchConfig& c) {
  Samples x;
  for (int r = 0; r < run.reps; ++r) {  // alternate ours and fio, so drift hits both alike
    throw_if_stop_requested("between repetitions");
    Rates ours = run_ours(run.dir, run.size_bytes, c);
    x.ow.push_back(ours.write_GBps);
    x.orr.push_back(ours.read_GBps);
    if (run.fio) {
      Rates f = run_fio_pair(run.dir, run.size_bytes, c);
      x.fw.push_back(f.write_GBps);
      x.fr.push_back(f.read_GBps);
    }
  }
  return run.json ? json_line(run, c, x) : text_line(run, c, x);
}

}  // namespace mw::bench
