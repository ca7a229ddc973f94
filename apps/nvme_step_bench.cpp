// nvme_step_bench: the step-time cost of NVMe offload, measured side by side in one process.
//
// Two identical GPT-2 models train on the same tokens: one with HybridAdam keeping m and v in
// RAM (updates inside backward, gpt2_train's default), one with them on disk (--offload nvme).
// Their steps alternate, so both see the same machine load from one minute to the next (this
// machine's load moves the step time by +-20% over minutes), and the reported figure is the median
// of the per-pair ratios. Losses must be equal bit for bit. The offloaded step is timed up to the
// end of step(); its last write-backs, which in training overlap its next forward, are then
// completed (flush) outside both timings, so neither model's step is slowed by the other's I/O.
// The prefetch of its next step's first slices (the 32 MiB window) still runs during the in-memory
// model's step, as it runs during its own forward in training.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "autograd/functions.h"
#include "cli.h"
#include "core/parallel.h"
#include "core/random.h"
#include "data/random_tokens.h"
#include "models/gpt2/model.h"
#include "optim/hybrid_adam.h"

namespace mw {
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

int run(const cli::Parser& p) {
  const gpt2::Config config = gpt2::Config::preset(p.str("model"));
  const int64_t B = p.integer("batch", 1, 4096), T = p.integer("seq", 1, config.n_positions);
  const int64_t steps = p.integer("steps", 2, 100000);
  set_num_threads(static_cast<int>(p.integer("threads", 0, 4096)));

  gpt2::GPT2 mem_model(config, 0), nvme_model(config, 0);
  optim::HybridAdamOptions mem_options;
  mem_options.update_in_backward = true;
  optim::HybridAdam mem_opt(mem_model.parameters(), mem_options);
  optim::NvmeOffloadOptions nvme;
  nvme.fraction = p.real("fraction", 0.0, 1.0);
  nvme.dir = p.str("nvme-dir");
  nvme.window_bytes = p.bytes("nvme-window");
  optim::HybridAdamOptions nvme_options({}, -1.f, nvme);
  nvme_options.update_in_backward = true;
  optim::HybridAdam nvme_opt(nvme_model.parameters(), nvme_options);

  std::printf(
      "nvme_step_bench: GPT-2 %s, B%lld T%lld, %lld steps each, alternating, threads %d; "
      "offloaded: %.1f%% of %lld parameters\n",
      p.str("model").c_str(), static_cast<long long>(B), static_cast<long long>(T),
      static_cast<long long>(steps), num_threads(),
      100.0 * static_cast<double>(nvme_opt.offloaded_numel()) /
          static_cast<double>(mem_model.num_parameters()),
      static_cast<long long>(mem_model.num_parameters()));
  std::vector<int32_t> tokens(static_cast<size_t>(B * T));
  std::vector<double> mem_ms, nvme_ms, ratios;
  bool same_losses = true;
  for (int64_t step = 0; step < steps; ++step) {
    data::random_tokens(0, step, B, T, config.vocab_size, tokens.data());
    Tensor ids = Tensor::from_vector(tokens, {B, T});
    float mem_loss = 0, nvme_loss = 0;
    // Both draw the same dropout masks: the second starts from the generator state of the first.
    const RngState rng = default_generator().state();
    auto run_mem = [&] {
      default_generator().set_state(rng);
      return train_step(mem_model, mem_opt, ids, &mem_loss);
    };
    auto run_nvme = [&] {
      default_generator().set_state(rng);
      const double ms = train_step(nvme_model, nvme_opt, ids, &nvme_loss);
      nvme_opt.flush();
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
    std::printf("[%lld] loss %.6f %s | in memory %.1f ms | nvme %.1f ms | ratio %.3f\n",
                static_cast<long long>(step), mem_loss, same ? "(equal)" : "(DIFFERENT)", a, b,
                b / a);
    std::fflush(stdout);
    if (step == 0) continue;  // warmup: first touches of every buffer, nothing on disk yet
    mem_ms.push_back(a);
    nvme_ms.push_back(b);
    ratios.push_back(b / a);
  }
  const optim::NvmeStats st = nvme_opt.nvme() ? nvme_opt.nvme()->stats() : optim::NvmeStats{};
  std::printf(
      "median step: in memory %.1f ms, nvme %.1f ms | median of per-pair ratios %.3f (min %.3f, "
      "max %.3f) over %zu pairs | losses %s\n",
      cli::median(mem_ms), cli::median(nvme_ms), cli::median(ratios),
      *std::min_element(ratios.begin(), ratios.end()),
      *std::max_element(ratios.begin(), ratios.end()), ratios.size(),
      same_losses ? "bitwise equal" : "DIFFER");
  std::printf(
      "nvme: read %.3f GB, written %.3f GB | exposed waits: step() %.0f ms, backward %.0f ms | "
      "updater waited for reads %.0f ms (hidden) | %lld spare-slot slices\n",
      st.bytes_read / 1e9, st.bytes_written / 1e9, st.flush_wait_ms, st.join_wait_ms,
      st.consumer_wait_ms, static_cast<long long>(st.spare_slices));
  return same_losses ? 0 : 1;
}

}  // namespace
}  // namespace mw

int main(int argc, char** argv) {
  mw::cli::Parser p("nvme_step_bench",
                    "Step time with Adam states on NVMe against in RAM, alternating steps of two "
                    "identical models in one process; median of per-pair ratios.");
  p.option("model", "small", "tiny|small|medium|large|xl");
  p.option("batch", "4", "B");
  p.option("seq", "128", "T");
  p.option("steps", "11", "steps per model (the first is a warmup, excluded from medians)");
  p.option("threads", "0", "worker threads (0 = all cores)");
  p.option("fraction", "1.0", "nvme_offload_fraction");
  p.option("nvme-dir", "", "directory for the states (default: a private temporary one)");
  p.option("nvme-window", "32MiB", "RAM for states in flight");
  return mw::cli::run_main(p, "nvme_step_bench", argc, argv,
                           [](const mw::cli::Parser& q) { return mw::run(q); });
}
