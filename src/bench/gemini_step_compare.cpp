// compare_gemini_steps (bench/step_compare.h): a plain model against Gemini auto, auto with the
// copy worker (Note [Copy worker]) and static cpu.
#include <chrono>
#include <cstring>
#include <memory>

#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "bench/step_compare.h"
#include "core/allocator.h"
#include "core/numbers.h"
#include "core/parallel.h"
#include "core/random.h"
#include "data/random_tokens.h"
#include "models/gpt2/model.h"
#include "models/gpt2/spec.h"
#include "offload/gemini/gemini.h"
#include "optim/hybrid_adam.h"

namespace mw::bench {

namespace {

using clock_type = std::chrono::steady_clock;
constexpr double kMiB = 1048576.0;

struct Contender {
  std::string name;
  Device device;
  std::unique_ptr<gpt2::GPT2> model;
  std::unique_ptr<optim::Optimizer> opt;
  gemini::Gemini* gem = nullptr;
  std::vector<double> ms, h2d_bytes, wait_ms;
  float loss = 0;
};

double train_step(Contender& c, const std::vector<int32_t>& tokens, int64_t B, int64_t T,
                  DType precision) {
  Tensor ids = Tensor::from_vector(tokens, {B, T}, c.device);
  const auto t0 = clock_type::now();
  c.opt->zero_grad();
  Tensor loss;
  {
    AutocastGuard autocast(precision);
    loss = shifted_cross_entropy((*c.model)(ids), ids);
  }
  backward(loss);
  c.opt->step();
  const auto t1 = clock_type::now();
  c.loss = static_cast<float>(loss.item());
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

// [0] plain on sim:1 (unlimited), [1] Gemini auto on sim:0, [2] Gemini static cpu on sim:2,
// [3] Gemini auto with the copy worker on sim:3.
constexpr int kContenders = 4;
std::vector<Contender> make_contenders(const gpt2::Config& config, int64_t capacity,
                                       DType precision) {
  std::vector<Contender> all(kContenders);
  all[0].name = "plain";
  all[0].device = Device::sim(1);
  set_sim_capacity(1, 0);
  all[0].model = std::make_unique<gpt2::GPT2>(config, 0, DType::F32, all[0].device);
  optim::HybridAdamOptions plain;
  plain.update_in_backward = true;
  all[0].opt = std::make_unique<optim::HybridAdam>(all[0].model->parameters(), plain);
  for (int i = 1; i < kContenders; ++i) {
    Contender& c = all[static_cast<size_t>(i)];
    c.name = i == 1 ? "gemini auto" : i == 2 ? "gemini static cpu" : "gemini auto, copy worker";
    c.device = Device::sim(i == 1 ? 0 : i);
    set_sim_capacity(c.device.index, capacity);
    c.model = std::make_unique<gpt2::GPT2>(config, 0, DType::F32, Device::cpu());
    gemini::GeminiOptions o;
    o.policy = i == 2 ? gemini::Policy::kStatic : gemini::Policy::kAuto;
    o.copy_worker = i == 3;
    o.device = c.device;
    o.offload_param_frac = o.offload_optim_frac = 1.0;
    o.search.interval_numel = config.n_embd;
    o.verbose = i == 1;
    if (precision != DType::F32) {  // Note [16-bit copies], as gpt2_train sets them
      o.low_copies = precision;
      o.low_copy_tensors = gpt2::read_only_by_products(config);
    }
    auto g = std::make_unique<gemini::Gemini>(*c.model, o);
    c.gem = g.get();
    c.opt = std::move(g);
  }
  return all;
}

// One round: every contender's step on the same tokens and dropout masks, in an order that
// rotates with the step. Returns the step times; the line goes to `log`.
std::vector<double> run_round(std::vector<Contender>& all, const StepCompareShape& shape,
                              int64_t step, std::vector<int32_t>& tokens, const LineSink& log) {
  const int64_t B = shape.batch, T = shape.seq;
  data::random_tokens(0, step, B, T, shape.config.vocab_size, tokens.data());
  const RngState rng = default_generator().state();
  std::vector<double> ms(kContenders);
  for (int k = 0; k < kContenders; ++k) {  // rotate the order each step
    const int i = static_cast<int>((k + step) % kContenders);
    default_generator().set_state(rng);
    ms[static_cast<size_t>(i)] =
        train_step(all[static_cast<size_t>(i)], tokens, B, T, shape.precision);
  }
  std::string line = strprintf(
      "[%lld] loss %.6f | plain %.0f ms | auto %.0f ms (%.3f) | static cpu %.0f ms (%.3f) | "
      "auto+worker %.0f ms (%.3f)",
      static_cast<long long>(step), all[0].loss, ms[0], ms[1], ms[1] / ms[0], ms[2], ms[2] / ms[0],
      ms[3], ms[3] / ms[0]);
  for (int i = 1; i < kContenders; ++i) {
    const gemini::GeminiStats s = all[static_cast<size_t>(i)].gem->take_step_stats();
    const char* who = i == 1 ? "auto" : i == 2 ? "cpu" : "worker";
    line += strprintf(" | %s h2d %.0f MiB", who, s.h2d_bytes / kMiB);
    if (i == 3) {
      line += strprintf(" (%lld ahead, waited %.0f ms)", static_cast<long long>(s.prefetches),
                        s.prefetch_wait_ms);
      if (step > 1) all[3].wait_ms.push_back(s.prefetch_wait_ms);
    }
    if (step > 1) all[static_cast<size_t>(i)].h2d_bytes.push_back(static_cast<double>(s.h2d_bytes));
  }
  log(line + "\n");
  return ms;
}

}  // namespace

bool compare_gemini_steps(const StepCompareShape& shape, int64_t capacity, const LineSink& log) {
  std::vector<Contender> all = make_contenders(shape.config, capacity, shape.precision);
  log(strprintf(
      "gemini_step_bench: GPT-2 %s, B%lld T%lld, %lld steps each, rotating, threads %d, "
      "Gemini devices sim:%lld MiB, precision %s\n",
      shape.model.c_str(), static_cast<long long>(shape.batch), static_cast<long long>(shape.seq),
      static_cast<long long>(shape.steps), num_threads(), static_cast<long long>(capacity >> 20),
      precision_name(shape.precision)));
  std::vector<int32_t> tokens(static_cast<size_t>(shape.batch * shape.seq));
  std::vector<double> auto_ratio, static_ratio, worker_ratio;
  bool same = true;
  for (int64_t step = 0; step < shape.steps; ++step) {
    const std::vector<double> ms = run_round(all, shape, step, tokens, log);
    for (auto& c : all) same = same && std::memcmp(&c.loss, &all[0].loss, sizeof(float)) == 0;
    if (step < 2) continue;  // the warmup iteration and the first planned one
    auto_ratio.push_back(ms[1] / ms[0]);
    static_ratio.push_back(ms[2] / ms[0]);
    worker_ratio.push_back(ms[3] / ms[0]);
    for (size_t i = 0; i < all.size(); ++i) all[i].ms.push_back(ms[i]);
  }
  log(
      strprintf("median step: plain %.0f ms, auto %.0f ms, static cpu %.0f ms, auto with the copy "
                "worker %.0f ms (waits %.0f ms) | median per-round ratio to plain: auto %.3f, "
                "static cpu %.3f, auto with the copy worker %.3f over %zu rounds | losses %s\n",
                median(all[0].ms), median(all[1].ms), median(all[2].ms), median(all[3].ms),
                median(all[3].wait_ms), median(auto_ratio), median(static_ratio),
                median(worker_ratio), auto_ratio.size(), same ? "bitwise equal" : "DIFFER"));
  log(strprintf(
      "host->device per step: auto %.1f MiB, static cpu %.1f MiB, auto with the copy "
      "worker %.1f MiB | sim peaks: plain %.0f MiB, auto %.0f MiB, static cpu %.0f MiB, "
      "auto with the copy worker %.0f MiB (capacity %.0f MiB)\n",
      median(all[1].h2d_bytes) / kMiB, median(all[2].h2d_bytes) / kMiB,
      median(all[3].h2d_bytes) / kMiB, allocator_for(all[0].device).stats().peak_bytes / kMiB,
      allocator_for(all[1].device).stats().peak_bytes / kMiB,
      allocator_for(all[2].device).stats().peak_bytes / kMiB,
      allocator_for(all[3].device).stats().peak_bytes / kMiB, capacity / kMiB));
  return same;
}

}  // namespace mw::bench
