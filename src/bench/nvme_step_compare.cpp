// compare_nvme_steps (bench/step_compare.h): HybridAdam with states in RAM against on NVMe.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "autograd/functions.h"
#include "bench/cpu_time.h"
#include "bench/nvme_bench.h"
#include "bench/step_compare.h"
#include "core/numbers.h"
#include "core/parallel.h"
#include "core/random.h"
#include "data/random_tokens.h"
#include "models/gpt2/model.h"
#include "optim/hybrid_adam.h"

namespace mw::bench {

namespace {

using clock_type = std::chrono::steady_clock;

double train_step(gpt2::GPT2& model, optim::HybridAdam& opt, const Tensor& ids, float* loss_out) {
  const auto t0 = clock_type::now();
  opt.zero_grad();
  Tensor logits = model(ids);
  Tensor loss = shifted_cross_entropy(logits, ids);
  logits = Tensor();
  backward(loss);
  opt.step();
  const auto t1 = clock_type::now();
  *loss_out = static_cast<float>(loss.item());
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

struct Pair {
  gpt2::GPT2 mem_model, nvme_model;
  optim::HybridAdam mem_opt, nvme_opt;
  Pair(const gpt2::Config& config, const optim::HybridAdamOptions& mem,
       const optim::HybridAdamOptions& nvme)
      : mem_model(config, 0),
        nvme_model(config, 0),
        mem_opt(mem_model.parameters(), mem),
        nvme_opt(nvme_model.parameters(), nvme) {}
};

std::unique_ptr<Pair> make_pair(const gpt2::Config& config, const optim::NvmeOffloadOptions& nvme) {
  optim::HybridAdamOptions mem_options;
  mem_options.update_in_backward = true;
  optim::HybridAdamOptions nvme_options({}, -1.f, nvme);
  nvme_options.update_in_backward = true;
  return std::make_unique<Pair>(config, mem_options, nvme_options);
}

std::string summary(const std::vector<double>& mem_ms, const std::vector<double>& nvme_ms,
                    const std::vector<double>& ratios, bool same_losses,
                    const optim::NvmeStats& st) {
  return strprintf(
             "median step: in memory %.1f ms, nvme %.1f ms | median of per-pair ratios %.3f (min "
             "%.3f, max %.3f) over %zu pairs | losses %s\n",
             median(mem_ms), median(nvme_ms), median(ratios),
             *std::min_element(ratios.begin(), ratios.end()),
             *std::max_element(ratios.begin(), ratios.end()), ratios.size(),
             same_losses ? "bitwise equal" : "DIFFER") +
         strprintf(
             "nvme: read %.3f GB, written %.3f GB | exposed waits: step() %.0f ms, backward %.0f "
             "ms | updater waited for reads %.0f ms (hidden) | %lld spare-slot slices\n",
             st.bytes_read / 1e9, st.bytes_written / 1e9, st.flush_wait_ms, st.join_wait_ms,
             st.consumer_wait_ms, static_cast<long long>(st.spare_slices));
}

// Note [Disk floor]: the least time a step can take when its states cross the disk: the bytes it
// reads at fio's read rate plus the bytes it writes at fio's write rate, fio run in the states'
// directory before and after the steps (the faster of the two runs each way, so the floor is the
// lowest the disk showed). Bytes per step are the steps after the warmup's. An offloaded step at
// the larger of the in-memory step and the floor runs at the device's speed.
std::string disk_floor(const std::string& dir, const FioRates& a, const optim::NvmeStats& first,
                       const optim::NvmeStats& last, int64_t steps, double mem_ms, double nvme_ms) {
  FioRates b = a;  // a failure of the second run leaves the first's rates
  try {
    b = measure_fio(dir, int64_t{1} << 30);
  } catch (const FioFailed&) {
  }
  const double w = std::max(a.write_GBps, b.write_GBps), r = std::max(a.read_GBps, b.read_GBps);
  const double read_gb =
      static_cast<double>(last.bytes_read - first.bytes_read) / 1e9 / static_cast<double>(steps);
  const double written_gb = static_cast<double>(last.bytes_written - first.bytes_written) / 1e9 /
                            static_cast<double>(steps);
  const double floor_ms = 1e3 * (read_gb / r + written_gb / w);
  return strprintf(
      "disk floor per step: %.3f GB read / fio %.2f GB/s + %.3f GB written / fio %.2f GB/s = "
      "%.0f ms | nvme step %.1f ms = %.3fx the larger of the in-memory step (%.1f ms) and the "
      "floor\n",
      read_gb, r, written_gb, w, floor_ms, nvme_ms, nvme_ms / std::max(mem_ms, floor_ms), mem_ms);
}

// Note [Stolen time]: the machine's CPU time per timed step, so that the host's share of an
// offloaded step's cost shows next to ours.
std::string cpu_line(const CpuTimes& mem, const CpuTimes& nvme, size_t steps) {
  if (!mem.known || !nvme.known || steps == 0) return "";
  const double n = static_cast<double>(steps);
  return strprintf(
      "machine CPU time per step (/proc/stat, all CPUs; Note [Stolen time]): in memory busy %.0f "
      "ms, idle %.0f ms, stolen by the hypervisor %.0f ms | nvme busy %.0f ms, idle %.0f ms, "
      "stolen %.0f ms\n",
      mem.busy_ms / n, mem.idle_ms / n, mem.steal_ms / n, nvme.busy_ms / n, nvme.idle_ms / n,
      nvme.steal_ms / n);
}

// Note [Disk floor] needs fio: its rates before the steps into `rates`; without fio, or where it
// fails, the steps still run and the returned reason says why the report has no floor.
std::string fio_before_steps(const StepCompareShape& shape, optim::NvmeAdamStates* nvme,
                             FioRates& rates) {
  if (!shape.fio) return "--no-fio";
  if (nvme == nullptr) return "nothing is offloaded";
  if (!have_fio()) return "fio is not installed (apt-get install fio)";
  try {
    rates = measure_fio(nvme->dir(), int64_t{1} << 30);
  } catch (const FioFailed& e) {
    return e.what();
  }
  return "";
}

}  // namespace

bool compare_nvme_steps(const StepCompareShape& shape, const optim::NvmeOffloadOptions& nvme,
                        const LineSink& log) {
  const int64_t B = shape.batch, T = shape.seq;
  std::unique_ptr<Pair> m = make_pair(shape.config, nvme);
  log(
      strprintf("nvme_step_bench: GPT-2 %s, B%lld T%lld, %lld steps each, alternating, threads %d; "
                "offloaded: %.1f%% of %lld parameters\n",
                shape.model.c_str(), static_cast<long long>(B), static_cast<long long>(T),
                static_cast<long long>(shape.steps), num_threads(),
                100.0 * static_cast<double>(m->nvme_opt.offloaded_numel()) /
                    static_cast<double>(m->mem_model.num_parameters()),
                static_cast<long long>(m->mem_model.num_parameters())));
  FioRates fio_before;
  std::string no_floor = fio_before_steps(shape, m->nvme_opt.nvme(), fio_before);
  optim::NvmeStats after_warmup;
  std::vector<int32_t> tokens(static_cast<size_t>(B * T));
  std::vector<double> mem_ms, nvme_ms, ratios;
  CpuTimes mem_cpu, nvme_cpu;  // summed over the steps after the warmup
  bool same_losses = true;
  for (int64_t step = 0; step < shape.steps; ++step) {
    data::random_tokens(0, step, B, T, shape.config.vocab_size, tokens.data());
    Tensor ids = Tensor::from_vector(tokens, {B, T});
    float mem_loss = 0, nvme_loss = 0;
    // Both draw the same dropout masks: the second starts from the generator state of the first.
    const RngState rng = default_generator().state();
    auto run_mem = [&] {
      default_generator().set_state(rng);
      const CpuTimes before = machine_cpu_times();
      const double ms = train_step(m->mem_model, m->mem_opt, ids, &mem_loss);
      if (step > 0) mem_cpu += machine_cpu_times() - before;
      return ms;
    };
    auto run_nvme = [&] {
      default_generator().set_state(rng);
      const CpuTimes before = machine_cpu_times();
      const double ms = train_step(m->nvme_model, m->nvme_opt, ids, &nvme_loss);
      if (step > 0) nvme_cpu += machine_cpu_times() - before;
      m->nvme_opt.flush();
      return ms;
    };
    // Alternate which goes first, so that neither always follows the other's tail.
    double a = 0, b = 0;
    if (step % 2 == 0) {
      a = run_mem();
      b = run_nvme();
    } else {
      b = run_nvme();
      a = run_mem();
    }
    const bool same = std::memcmp(&mem_loss, &nvme_loss, sizeof(float)) == 0;
    same_losses = same_losses && same;
    log(strprintf("[%lld] loss %.6f %s | in memory %.1f ms | nvme %.1f ms | ratio %.3f\n",
                  static_cast<long long>(step), mem_loss, same ? "(equal)" : "(DIFFERENT)", a, b,
                  b / a));
    if (step == 0) {  // warmup: first touches of every buffer, nothing on disk yet
      if (m->nvme_opt.nvme()) after_warmup = m->nvme_opt.nvme()->stats();
      continue;
    }
    mem_ms.push_back(a);
    nvme_ms.push_back(b);
    ratios.push_back(b / a);
  }
  const optim::NvmeStats st = m->nvme_opt.nvme() ? m->nvme_opt.nvme()->stats() : optim::NvmeStats{};
  log(summary(mem_ms, nvme_ms, ratios, same_losses, st));
  log(cpu_line(mem_cpu, nvme_cpu, mem_ms.size()));
  if (no_floor.empty() && !mem_ms.empty())
    log(disk_floor(m->nvme_opt.nvme()->dir(), fio_before, after_warmup, st,
                   static_cast<int64_t>(mem_ms.size()), median(mem_ms), median(nvme_ms)));
  else if (!no_floor.empty())
    log(strprintf("no disk floor (Note [Disk floor]): %s\n", no_floor.c_str()));
  return same_losses;
}

}  // namespace mw::bench
