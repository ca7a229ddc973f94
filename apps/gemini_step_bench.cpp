// gemini_step_bench: Gemini's step-time cost and its traffic, measured side by side in one process.
//
// Three identical GPT-2 models train on the same tokens and dropout masks: a plain one on an
// unlimited sim device (HybridAdam, updates inside backward: gpt2_train's default), one with
// Gemini auto and one with Gemini static cpu (offload_param_frac = offload_optim_frac = 1), each on
// its own capped sim device. Their steps rotate, so all see the same machine load from one minute
// to the next (this shared machine's load moves step times by +-20% over minutes), and the reported
// figures are medians of per-round ratios. Losses must be equal bit for bit.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>

#include "autograd/functions.h"
#include "cli.h"
#include "core/allocator.h"
#include "core/parallel.h"
#include "core/random.h"
#include "data/random_tokens.h"
#include "models/gpt2/model.h"
#include "offload/gemini/gemini.h"

namespace mw {
namespace {

using clock_type = std::chrono::steady_clock;

struct Contender {
  std::string name;
  Device device;
  std::unique_ptr<gpt2::GPT2> model;
  std::unique_ptr<optim::Optimizer> opt;
  gemini::Gemini* gem = nullptr;
  std::vector<double> ms, h2d_bytes, d2h_bytes;
  float loss = 0;
};

double train_step(Contender& c, const std::vector<int32_t>& tokens, int64_t B, int64_t T) {
  Tensor ids = Tensor::from_vector(tokens, {B, T}, c.device);
  const auto t0 = clock_type::now();
  c.opt->zero_grad();
  Tensor logits = (*c.model)(ids);
  Tensor loss = shifted_cross_entropy(logits, ids);
  logits = Tensor();
  backward(loss);
  c.opt->step();
  const auto t1 = clock_type::now();
  c.loss = static_cast<float>(loss.item());
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

int run(const cli::Parser& p) {
  const gpt2::Config config = gpt2::Config::preset(p.str("model"));
  const int64_t B = p.integer("batch", 1, 4096), T = p.integer("seq", 1, config.n_positions);
  const int64_t steps = p.integer("steps", 3, 100000);
  const int64_t capacity = p.bytes("capacity");
  set_num_threads(static_cast<int>(p.integer("threads", 0, 4096)));

  std::vector<Contender> all(3);
  all[0].name = "plain";
  all[0].device = Device::sim(1);
  set_sim_capacity(1, 0);
  all[0].model = std::make_unique<gpt2::GPT2>(config, 0, DType::F32, all[0].device);
  optim::HybridAdamOptions plain;
  plain.update_in_backward = true;
  all[0].opt = std::make_unique<optim::HybridAdam>(all[0].model->parameters(), plain);
  for (int i = 1; i <= 2; ++i) {
    Contender& c = all[static_cast<size_t>(i)];
    c.name = i == 1 ? "gemini auto" : "gemini static cpu";
    c.device = Device::sim(i == 1 ? 0 : 2);
    set_sim_capacity(c.device.index, capacity);
    c.model = std::make_unique<gpt2::GPT2>(config, 0, DType::F32, Device::cpu());
    gemini::GeminiOptions o;
    o.policy = i == 1 ? gemini::Policy::kAuto : gemini::Policy::kStatic;
    o.device = c.device;
    o.offload_param_frac = o.offload_optim_frac = 1.0;
    o.search.interval_numel = config.n_embd;
    o.verbose = i == 1;
    auto g = std::make_unique<gemini::Gemini>(*c.model, o);
    c.gem = g.get();
    c.opt = std::move(g);
  }
  std::printf(
      "gemini_step_bench: GPT-2 %s, B%lld T%lld, %lld steps each, rotating, threads %d, "
      "Gemini devices sim:%lld MiB\n",
      p.str("model").c_str(), static_cast<long long>(B), static_cast<long long>(T),
      static_cast<long long>(steps), num_threads(), static_cast<long long>(capacity >> 20));
  std::vector<int32_t> tokens(static_cast<size_t>(B * T));
  std::vector<double> auto_ratio, static_ratio;
  bool same = true;
  for (int64_t step = 0; step < steps; ++step) {
    data::random_tokens(0, step, B, T, config.vocab_size, tokens.data());
    const RngState rng = default_generator().state();
    double ms[3];
    for (int k = 0; k < 3; ++k) {  // rotate the order each step
      const int i = static_cast<int>((k + step) % 3);
      default_generator().set_state(rng);
      ms[i] = train_step(all[static_cast<size_t>(i)], tokens, B, T);
    }
    for (auto& c : all) same = same && std::memcmp(&c.loss, &all[0].loss, sizeof(float)) == 0;
    std::printf(
        "[%lld] loss %.6f | plain %.0f ms | auto %.0f ms (%.3f) | static cpu %.0f ms "
        "(%.3f)",
        static_cast<long long>(step), all[0].loss, ms[0], ms[1], ms[1] / ms[0], ms[2],
        ms[2] / ms[0]);
    for (int i = 1; i <= 2; ++i) {
      const gemini::GeminiStats s = all[static_cast<size_t>(i)].gem->take_step_stats();
      std::printf(" | %s h2d %.0f MiB", i == 1 ? "auto" : "cpu", s.h2d_bytes / 1048576.0);
      if (step > 1)
        all[static_cast<size_t>(i)].h2d_bytes.push_back(static_cast<double>(s.h2d_bytes));
    }
    std::printf("\n");
    std::fflush(stdout);
    if (step < 2) continue;  // the warmup iteration and the first planned one
    auto_ratio.push_back(ms[1] / ms[0]);
    static_ratio.push_back(ms[2] / ms[0]);
    for (int i = 0; i < 3; ++i) all[static_cast<size_t>(i)].ms.push_back(ms[i]);
  }
  std::printf(
      "median step: plain %.0f ms, auto %.0f ms, static cpu %.0f ms | median per-round "
      "ratio to plain: auto %.3f, static cpu %.3f over %zu rounds | losses %s\n",
      cli::median(all[0].ms), cli::median(all[1].ms), cli::median(all[2].ms),
      cli::median(auto_ratio), cli::median(static_ratio), auto_ratio.size(),
      same ? "bitwise equal" : "DIFFER");
  std::printf(
      "host->device per step: auto %.1f MiB, static cpu %.1f MiB | sim peaks: plain %.0f "
      "MiB, auto %.0f MiB, static cpu %.0f MiB (capacity %.0f MiB)\n",
      cli::median(all[1].h2d_bytes) / 1048576.0, cli::median(all[2].h2d_bytes) / 1048576.0,
      allocator_for(all[0].device).stats().peak_bytes / 1048576.0,
      allocator_for(all[1].device).stats().peak_bytes / 1048576.0,
      allocator_for(all[2].device).stats().peak_bytes / 1048576.0, capacity / 1048576.0);
  return same ? 0 : 1;
}

}  // namespace
}  // namespace mw

int main(int argc, char** argv) {
  mw::cli::Parser p("gemini_step_bench",
                    "Step time and traffic of Gemini auto and static cpu against a plain run, "
                    "rotating steps of three identical models in one process.");
  p.option("model", "small", "tiny|small|medium|large|xl");
  p.option("batch", "4", "B");
  p.option("seq", "128", "T");
  p.option("steps", "8", "steps per model (the first two are excluded from medians)");
  p.option("capacity", "768MiB", "capacity of each Gemini model's sim device");
  p.option("threads", "0", "worker threads (0 = all cores)");
  return mw::cli::run_main(p, "gemini_step_bench", argc, argv,
                           [](const mw::cli::Parser& q) { return mw::run(q); });
}
