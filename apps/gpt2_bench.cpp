// gpt2_bench: GPT-2 training speed and memory, against PyTorch measured in the same run.
//
// Ours: fp32, HybridAdam, dropout 0, random tokens, --steps steps (median step time, peak RSS).
// Peer: tools/torch_gpt2_bench.sh tuned (Debian python3-torch, OMP_WAIT_POLICY=PASSIVE, jemalloc
// with decay off, same threads), run as a subprocess so its RSS is its own. Then the share of our
// step spent in GEMM, against the sgemm rate measured for the very same shapes in this process,
// and the whole step's achieved GFLOP/s as a fraction of that sgemm rate (its ceiling).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <tuple>

#include "autograd/functions.h"
#include "cli.h"
#include "core/allocator.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "data/json.h"
#include "data/random_tokens.h"
#include "models/gpt2/model.h"
#include "optim/hybrid_adam.h"

namespace mw {
namespace {

using clock_type = std::chrono::steady_clock;

struct OursResult {
  double median_ms = 0, gemm_ms_per_step = 0, gemm_gflops = 0;
  int64_t peak_rss_bytes = 0, gemm_flops_per_step = 0;
  // per-phase times of the measured steps; *_other is the phase minus its gemm() time
  std::vector<double> forward_ms, backward_ms, optimizer_ms, forward_other_ms, backward_other_ms;
  std::vector<double> losses;
};

OursResult run_ours(const gpt2::Config& config, int64_t B, int64_t T, int64_t steps) {
  gpt2::GPT2 model(config, 0);
  optim::HybridAdamOptions hopts;
  hopts.update_in_backward = true;  // gpt2_train's default (Note [Update in backward])
  optim::HybridAdam opt(model.parameters(), hopts);
  std::vector<int32_t> tokens(static_cast<size_t>(B * T));
  std::vector<double> ms;
  OursResult r;
  int64_t gemm_ns = 0, gemm_flops = 0;
  for (int64_t step = 0; step < steps; ++step) {
    data::random_tokens(0, step, B, T, config.vocab_size, tokens.data());
    Tensor ids = Tensor::from_vector(tokens, {B, T});
    ops::reset_gemm_stats();
    const auto t0 = clock_type::now();
    opt.zero_grad();
    Tensor logits = model(ids);
    Tensor loss = shifted_cross_entropy(logits, ids);
    logits = Tensor();
    const auto t1 = clock_type::now();
    const int64_t gemm_fwd_ns = ops::gemm_stats().nanoseconds;
    backward(loss);
    const auto t2 = clock_type::now();
    const int64_t gemm_bwd_ns = ops::gemm_stats().nanoseconds - gemm_fwd_ns;
    opt.step();
    const auto t3 = clock_type::now();
    auto ms_between = [](auto a, auto b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    };
    if (step > 0) {
      r.forward_ms.push_back(ms_between(t0, t1));
      r.backward_ms.push_back(ms_between(t1, t2));
      r.optimizer_ms.push_back(ms_between(t2, t3));
      r.forward_other_ms.push_back(ms_between(t0, t1) - gemm_fwd_ns / 1e6);
      r.backward_other_ms.push_back(ms_between(t1, t2) - gemm_bwd_ns / 1e6);
    }
    r.losses.push_back(loss.item());
    ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
    auto g = ops::gemm_stats();
    if (step > 0) {  // the first step faults in every buffer; it is reported but not in the medians
      gemm_ns += g.nanoseconds;
      gemm_flops += g.flops;
    }
    std::printf("  ours [%lld] loss %.4f  %.0f ms (GEMM %.0f ms)\n", static_cast<long long>(step),
                r.losses.back(), ms.back(), g.nanoseconds / 1e6);
    std::fflush(stdout);
  }
  if (ms.size() > 1) ms.erase(ms.begin());
  r.median_ms = cli::median(ms);
  r.peak_rss_bytes = peak_rss_bytes();
  const double measured_steps = static_cast<double>(std::max<int64_t>(1, steps - 1));
  r.gemm_ms_per_step = gemm_ns / 1e6 / measured_steps;
  r.gemm_flops_per_step = static_cast<int64_t>(gemm_flops / measured_steps);
  r.gemm_gflops = gemm_ns > 0 ? static_cast<double>(gemm_flops) / gemm_ns : 0;
  return r;
}

// The ceiling: each GEMM shape of one training step timed alone (median of 5), weighted by how
// many times a step runs it.
double isolated_gemm_ms_per_step(const gpt2::Config& c, int64_t B, int64_t T, double* gflops_out) {
  const int64_t R = B * T, C = c.n_embd, V = c.vocab_size, L = c.n_layer;
  struct Shape {
    int64_t M, K, N;  // forward: [M, K] @ [K, N]
    int64_t count;
  };
  const std::vector<Shape> forward = {
      {R, C, 3 * C, L}, {R, C, C, L}, {R, C, 4 * C, L}, {R, 4 * C, C, L}, {R, C, V, 1}};
  double total_ms = 0, total_flops = 0;
  for (const Shape& s : forward) {
    Tensor x = Tensor::full({s.M, s.K}, 0.01), w = Tensor::full({s.K, s.N}, 0.02);
    Tensor y = Tensor::empty({s.M, s.N}), dy = Tensor::full({s.M, s.N}, 0.03);
    Tensor dx = Tensor::empty({s.M, s.K}), dw = Tensor::empty({s.K, s.N});
    // forward, grad wrt input, grad wrt weight: the three products of a linear layer
    auto time_one = [&](auto&& f) {
      std::vector<double> t;
      for (int rep = 0; rep < 5; ++rep) {
        auto t0 = clock_type::now();
        f();
        t.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
      }
      return cli::median(t);
    };
    double ms = time_one([&] { ops::gemm(x, false, w, false, y, false); }) +
                time_one([&] { ops::gemm(dy, false, w, true, dx, false); }) +
                time_one([&] { ops::gemm(x, true, dy, false, dw, false); });
    total_ms += ms * static_cast<double>(s.count);
    total_flops += 3.0 * 2.0 * s.M * s.K * s.N * static_cast<double>(s.count);
  }
  *gflops_out = total_flops / (total_ms * 1e6);
  return total_ms;
}

struct TorchResult {
  bool ok = false;
  double median_ms = 0, peak_rss_mb = 0;
  std::string note;
};

TorchResult run_torch(const std::string& model, int64_t B, int64_t T, int64_t steps, int threads) {
  TorchResult r;
  std::string cmd =
      str("bash ", MW_SOURCE_DIR, "/tools/torch_gpt2_bench.sh tuned --model ", model, " --batch ",
          B, " --seq ", T, " --steps ", steps, " --threads ", threads, " --json 2>&1");
  std::printf("peer: %s\n", cmd.c_str());
  std::fflush(stdout);
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) {
    r.note = "could not start the PyTorch peer";
    return r;
  }
  std::string last_json, line;
  char buf[8192];
  while (fgets(buf, sizeof buf, pipe)) {
    line = buf;
    if (!line.empty() && line[0] == '{')
      last_json = line;
    else
      std::printf("  torch %s", line.c_str());
  }
  int status = pclose(pipe);
  if (status != 0 || last_json.empty()) {
    r.note =
        "the PyTorch peer failed (is python3-torch installed? apt-get install python3-torch "
        "libjemalloc2)";
    return r;
  }
  json::Value v = json::parse(last_json, "torch_gpt2_bench.py output");
  r.median_ms = v.get_double("median_step_ms");
  r.peak_rss_mb = v.get_double("peak_rss_mb");
  r.ok = true;
  return r;
}

int run(const cli::Parser& p) {
  const std::string model_name = p.choice("model", {"tiny", "small", "medium", "large", "xl"});
  const int64_t B = p.integer("batch", 1, 1 << 16), T = p.integer("seq", 2, 1 << 16);
  const int64_t steps = p.integer("steps", 2, 1000);
  const int threads = static_cast<int>(p.integer("threads", 0, 4096));
  set_num_threads(threads);
  gpt2::Config config = gpt2::Config::preset(model_name);
  config.set_dropout(0.0);

  std::printf("memwall: GPT-2 %s fp32, B%lld T%lld, %lld steps, %d threads, HybridAdam (%s)\n",
              model_name.c_str(), static_cast<long long>(B), static_cast<long long>(T),
              static_cast<long long>(steps), num_threads(), optim::isa_name(optim::best_isa()));
  OursResult ours = run_ours(config, B, T, steps);
  double iso_gflops = 0;
  const double iso_ms = isolated_gemm_ms_per_step(config, B, T, &iso_gflops);

  TorchResult torch;
  if (p.choice("torch", {"auto", "off"}) != "off")
    torch = run_torch(model_name, B, T, steps, num_threads());

  const double mib = 1024.0 * 1024.0;
  std::printf("\n%-28s %12s %12s %8s\n", "", "memwall", "PyTorch", "ratio");
  if (torch.ok) {
    std::printf("%-28s %12.0f %12.0f %8.2f\n", "median step (ms)", ours.median_ms, torch.median_ms,
                ours.median_ms / torch.median_ms);
    std::printf("%-28s %12.0f %12.0f %8.2f\n", "peak RSS (MiB)", ours.peak_rss_bytes / mib,
                torch.peak_rss_mb * 1e6 / mib,
                (ours.peak_rss_bytes / mib) / (torch.peak_rss_mb * 1e6 / mib));
  } else {
    std::printf("%-28s %12.0f %12s\n", "median step (ms)", ours.median_ms, "-");
    std::printf("%-28s %12.0f %12s\n", "peak RSS (MiB)", ours.peak_rss_bytes / mib, "-");
    std::printf("(no PyTorch comparison: %s)\n",
                torch.note.empty() ? "--torch off" : torch.note.c_str());
  }
  std::printf("GEMM in a step: %.0f ms = %.0f%% of the step, at %.1f GFLOP/s (%.1f GFLOP/step)\n",
              ours.gemm_ms_per_step, 100.0 * ours.gemm_ms_per_step / ours.median_ms,
              ours.gemm_gflops, ours.gemm_flops_per_step / 1e9);
  std::printf(
      "phases (median ms): forward %.0f (non-GEMM %.0f), backward %.0f (non-GEMM %.0f), "
      "optimizer step() %.0f (the updates run inside backward)\n",
      cli::median(ours.forward_ms), cli::median(ours.forward_other_ms),
      cli::median(ours.backward_ms), cli::median(ours.backward_other_ms),
      cli::median(ours.optimizer_ms));
  std::printf(
      "same GEMM shapes run alone: %.0f ms at %.1f GFLOP/s (the floor for this step's GEMMs)\n",
      iso_ms, iso_gflops);
  // The ceiling line (#13 item 5): the whole step's rate next to the sgemm rate of this run.
  const double step_gflops = ours.gemm_flops_per_step / 1e9 / (ours.median_ms / 1e3);
  std::printf(
      "achieved: %.1f GFLOP/s over the whole step (its GEMM FLOPs / median step) = %.0f%% of the "
      "%.1f GFLOP/s sgemm ceiling measured in this run\n",
      step_gflops, 100.0 * step_gflops / iso_gflops, iso_gflops);
  if (p.has("json")) {
    json::Value v = json::Value::object();
    v.set("model", model_name);
    v.set("median_step_ms", ours.median_ms);
    v.set("peak_rss_mb", ours.peak_rss_bytes / mib);
    v.set("gemm_ms_per_step", ours.gemm_ms_per_step);
    v.set("gemm_gflops", ours.gemm_gflops);
    v.set("isolated_gemm_ms", iso_ms);
    v.set("isolated_gemm_gflops", iso_gflops);
    v.set("step_gflops", step_gflops);
    v.set("fraction_of_sgemm", step_gflops / iso_gflops);
    if (torch.ok) {
      v.set("torch_median_step_ms", torch.median_ms);
      v.set("torch_peak_rss_mb", torch.peak_rss_mb * 1e6 / mib);
      v.set("step_ratio", ours.median_ms / torch.median_ms);
      v.set("rss_ratio", (ours.peak_rss_bytes / mib) / (torch.peak_rss_mb * 1e6 / mib));
    }
    std::printf("%s\n", v.dump().c_str());
  }
  return 0;
}

}  // namespace
}  // namespace mw

int main(int argc, char** argv) {
  mw::cli::Parser p("gpt2_bench",
                    "GPT-2 training step time and peak RSS against PyTorch, same run.");
  p.option("model", "small", "tiny|small|medium|large|xl");
  p.option("batch", "4", "B");
  p.option("seq", "128", "T");
  p.option("steps", "10", "training steps (the first is a warmup, excluded from medians)");
  p.option("threads", "2", "threads for both memwall and PyTorch");
  p.option("torch", "auto", "auto|off: run the PyTorch peer");
  p.flag("json", "print a JSON summary as the last line");
  return mw::cli::run_main(p, "gpt2_bench", argc, argv,
                           [](const mw::cli::Parser& q) { return mw::run(q); });
}
