// gpt2_bench's measurements and report (bench/gpt2_bench.h).
#include "bench/gpt2_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "core/allocator.h"
#include "core/cuda_stream.h"
#include "core/numbers.h"
#include "core/ops.h"
#include "data/json.h"
#include "data/random_tokens.h"
#include "models/gpt2/model.h"
#include "optim/hybrid_adam.h"

extern "C" char* openblas_get_corename();

namespace mw::bench {

namespace {
using clock_type = std::chrono::steady_clock;

double ms_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Waits for the work queued on a CUDA device (memwall's kernels run on its legacy default stream),
// so that a host clock read after it sees that work done; nothing to wait for on the cpu.
void synchronize(Device device) {
  if (device.is_cuda()) CudaStream::borrow(device.index, nullptr).synchronize();
}
}  // namespace

Gpt2StepTiming time_gpt2_steps(const gpt2::Config& config, int64_t B, int64_t T, int64_t steps,
                               Device device, DType precision, const LineSink& log) {
  gpt2::GPT2 model(config, 0, DType::F32, device);
  optim::HybridAdamOptions hopts;
  hopts.update_in_backward = true;  // gpt2_train's default (Note [Update in backward])
  optim::HybridAdam opt(model.parameters(), hopts);
  std::vector<int32_t> tokens(static_cast<size_t>(B * T));
  std::vector<double> ms;
  Gpt2StepTiming r;
  int64_t gemm_ns = 0, gemm_flops = 0;
  for (int64_t step = 0; step < steps; ++step) {
    data::random_tokens(0, step, B, T, config.vocab_size, tokens.data());
    Tensor ids = Tensor::from_vector(tokens, {B, T}).to(device);
    if (step == 1) profile::enable(true);  // the measured steps
    ops::reset_gemm_stats();
    synchronize(device);
    const auto t0 = clock_type::now();
    opt.zero_grad();
    Tensor loss;
    {
      AutocastGuard autocast(precision);
      loss = shifted_cross_entropy(model(ids), ids);
    }
    synchronize(device);
    const auto t1 = clock_type::now();
    const int64_t gemm_fwd_ns = ops::gemm_stats().nanoseconds;
    backward(loss);
    synchronize(device);
    const auto t2 = clock_type::now();
    const int64_t gemm_bwd_ns = ops::gemm_stats().nanoseconds - gemm_fwd_ns;
    opt.step();
    synchronize(device);
    const auto t3 = clock_type::now();
    if (step > 0) {
      r.forward_ms.push_back(ms_between(t0, t1));
      r.backward_ms.push_back(ms_between(t1, t2));
      r.optimizer_ms.push_back(ms_between(t2, t3));
      r.forward_other_ms.push_back(ms_between(t0, t1) - gemm_fwd_ns / 1e6);
      r.backward_other_ms.push_back(ms_between(t1, t2) - gemm_bwd_ns / 1e6);
    }
    r.losses.push_back(loss.item());
    ms.push_back(ms_between(t0, clock_type::now()));
    auto g = ops::gemm_stats();
    if (step > 0) {  // the first step faults in every buffer; it is reported but not in the medians
      gemm_ns += g.nanoseconds;
      gemm_flops += g.flops;
    }
    log(strprintf("  ours [%lld] loss %.4f  %.0f ms (GEMM %.0f ms)\n", static_cast<long long>(step),
                  r.losses.back(), ms.back(), g.nanoseconds / 1e6));
  }
  r.ops = profile::take();
  profile::enable(false);
  r.measured_steps = steps - 1;
  if (ms.size() > 1) ms.erase(ms.begin());
  r.median_ms = median(ms);
  r.step_ms = ms;
  r.peak_rss_bytes = peak_rss_bytes();
  r.device = device;
  r.precision = precision;
  if (device.is_cuda()) {
    r.device_peak_bytes = allocator_for(device).stats().peak_bytes;
    const char* blocking = std::getenv("CUDA_LAUNCH_BLOCKING");
    r.ops_timed = blocking != nullptr && std::strcmp(blocking, "1") == 0;
  }
  const double measured_steps = static_cast<double>(std::max<int64_t>(1, steps - 1));
  r.gemm_ms_per_step = gemm_ns / 1e6 / measured_steps;
  r.gemm_flops_per_step = static_cast<int64_t>(gemm_flops / measured_steps);
  r.gemm_gflops = gemm_ns > 0 ? static_cast<double>(gemm_flops) / gemm_ns : 0;
  return r;
}

Gpt2StepTiming pooled(const std::vector<Gpt2StepTiming>& rounds) {
  MW_CHECK(!rounds.empty(), "pooled() needs at least one round");
  Gpt2StepTiming all = rounds.front();
  double gemm_ms = all.gemm_ms_per_step * static_cast<double>(all.measured_steps);
  for (size_t i = 1; i < rounds.size(); ++i) {
    const Gpt2StepTiming& r = rounds[i];
    for (auto [to, from] : {std::pair{&all.forward_ms, &r.forward_ms},
                            {&all.backward_ms, &r.backward_ms},
                            {&all.optimizer_ms, &r.optimizer_ms},
                            {&all.forward_other_ms, &r.forward_other_ms},
                            {&all.backward_other_ms, &r.backward_other_ms},
                            {&all.step_ms, &r.step_ms},
                            {&all.losses, &r.losses}})
      to->insert(to->end(), from->begin(), from->end());
    for (const profile::OpTime& op : r.ops) {
      auto same = std::find_if(all.ops.begin(), all.ops.end(),
                               [&](const profile::OpTime& o) { return o.name == op.name; });
      if (same == all.ops.end()) {
        all.ops.push_back(op);
      } else {
        same->calls += op.calls;
        same->ms += op.ms;
        same->gemm_ms += op.gemm_ms;
      }
    }
    gemm_ms += r.gemm_ms_per_step * static_cast<double>(r.measured_steps);
    all.measured_steps += r.measured_steps;
    all.peak_rss_bytes = std::max(all.peak_rss_bytes, r.peak_rss_bytes);
    all.device_peak_bytes = std::max(all.device_peak_bytes, r.device_peak_bytes);
  }
  std::sort(all.ops.begin(), all.ops.end(),
            [](const profile::OpTime& a, const profile::OpTime& b) { return a.ms > b.ms; });
  all.median_ms = median(all.step_ms);
  const double steps = static_cast<double>(std::max<int64_t>(1, all.measured_steps));
  all.gemm_ms_per_step = gemm_ms / steps;  // the FLOPs per step are the same every round
  all.gemm_gflops =
      gemm_ms > 0 ? static_cast<double>(all.gemm_flops_per_step) / (gemm_ms / steps) / 1e6 : 0;
  return all;
}

TorchPeer pooled(const std::vector<TorchPeer>& peers, const std::vector<Gpt2StepTiming>& ours) {
  MW_CHECK(!peers.empty() && peers.size() == ours.size(), "pooled(): one peer per round");
  TorchPeer all;
  std::vector<double> medians;
  for (size_t i = 0; i < peers.size(); ++i) {
    if (!peers[i].ok) return peers[i];  // its note says why
    medians.push_back(peers[i].median_ms);
    all.round_ratios.push_back(ours[i].median_ms / peers[i].median_ms);
    all.peak_rss_mb = std::max(all.peak_rss_mb, peers[i].peak_rss_mb);
    all.device_peak_mb = std::max(all.device_peak_mb, peers[i].device_peak_mb);
  }
  all.ok = true;
  all.median_ms = median(medians);
  return all;
}

namespace {
// Median time of 5 runs of f on `device`, in ms.
template <typename F>
double median_of_five_ms(Device device, F&& f) {
  std::vector<double> t;
  for (int rep = 0; rep < 5; ++rep) {
    synchronize(device);
    auto t0 = clock_type::now();
    f();
    synchronize(device);
    t.push_back(ms_between(t0, clock_type::now()));
  }
  return median(t);
}
}  // namespace

IsolatedGemm time_isolated_gemms(const gpt2::Config& c, int64_t B, int64_t T, Device device,
                                 DType precision) {
  const int64_t R = B * T, C = c.n_embd, V = c.vocab_size, L = c.n_layer;
  struct Shape {
    int64_t M, K, N;  // forward: [M, K] @ [K, N]
    int64_t count;
  };
  const std::vector<Shape> forward = {
      {R, C, 3 * C, L}, {R, C, C, L}, {R, C, 4 * C, L}, {R, 4 * C, C, L}, {R, C, V, 1}};
  double total_ms = 0, total_flops = 0;
  for (const Shape& s : forward) {
    const DType t = precision;
    Tensor x = Tensor::full({s.M, s.K}, 0.01, t, device);
    Tensor w = Tensor::full({s.K, s.N}, 0.02, t, device);
    Tensor y = Tensor::empty({s.M, s.N}, t, device);
    Tensor dy = Tensor::full({s.M, s.N}, 0.03, t, device);
    Tensor dx = Tensor::empty({s.M, s.K}, t, device), dw = Tensor::empty({s.K, s.N}, t, device);
    // forward, grad wrt input, grad wrt weight: the three products of a linear layer
    double ms = median_of_five_ms(device, [&] { ops::gemm(x, false, w, false, y, false); }) +
                median_of_five_ms(device, [&] { ops::gemm(dy, false, w, true, dx, false); }) +
                median_of_five_ms(device, [&] { ops::gemm(x, true, dy, false, dw, false); });
    total_ms += ms * static_cast<double>(s.count);
    total_flops += 3.0 * 2.0 * s.M * s.K * s.N * static_cast<double>(s.count);
  }
  return {total_ms, total_flops / (total_ms * 1e6)};
}

TorchPeer run_torch_peer(const std::string& source_dir, const std::string& model, int64_t B,
                         int64_t T, int64_t steps, int threads, Device device, DType precision,
                         const LineSink& log) {
  TorchPeer r;
  const std::string shape =
      str(" --model ", model, " --batch ", B, " --seq ", T, " --steps ", steps, " --threads ",
          threads, precision == DType::BF16 ? " --precision bf16" : "", " --json 2>&1");
  const std::string cmd =
      device.is_cuda()
          ? str("python3 ", shell_quote(source_dir + "/tools/torch_gpt2_bench.py"), " --device ",
                device.str(), shape)
          : str("bash ", shell_quote(source_dir + "/tools/torch_gpt2_bench.sh"), " tuned", shape);
  log(strprintf("peer: %s\n", cmd.c_str()));
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
      log(strprintf("  torch %s", line.c_str()));
  }
  int status = pclose(pipe);
  if (status != 0 || last_json.empty()) {
    r.note = device.is_cuda()
                 ? "the PyTorch peer failed (does the python3 on PATH have a CUDA-enabled torch? "
                   "its output is above)"
                 : "the PyTorch peer failed (is python3-torch installed? apt-get install "
                   "python3-torch libjemalloc2)";
    return r;
  }
  json::Value v = json::parse(last_json, "torch_gpt2_bench.py output");
  r.median_ms = v.get_double("median_step_ms");
  r.peak_rss_mb = v.get_double("peak_rss_mb");
  if (device.is_cuda()) r.device_peak_mb = v.get_double("device_peak_mb");
  r.ok = true;
  return r;
}

namespace {
constexpr double kMiB = 1024.0 * 1024.0;

// Note [Alternated rounds]: the median of the rounds' ratios, not the ratio of pooled medians.
double step_ratio(const Gpt2StepTiming& ours, const TorchPeer& torch) {
  return torch.round_ratios.empty() ? ours.median_ms / torch.median_ms : median(torch.round_ratios);
}

std::string rounds_line(const TorchPeer& torch) {
  if (torch.round_ratios.size() < 2) return "";
  std::string out = "step ratio per round (memwall / PyTorch; odd rounds memwall first):";
  for (const double r : torch.round_ratios) out += strprintf(" %.2f", r);
  return out + strprintf(" -> median %.2f\n", median(torch.round_ratios));
}

std::string comparison_table(const Gpt2StepTiming& ours, const TorchPeer& torch) {
  std::string out = strprintf("\n%-28s %12s %12s %8s\n", "", "memwall", "PyTorch", "ratio");
  if (torch.ok) {
    out += strprintf("%-28s %12.0f %12.0f %8.2f%s\n", "median step (ms)", ours.median_ms,
                     torch.median_ms, step_ratio(ours, torch),
                     torch.round_ratios.size() > 1 ? " (the rounds' median)" : "");
    out += strprintf("%-28s %12.0f %12.0f %8.2f\n", "peak RSS (MiB)", ours.peak_rss_bytes / kMiB,
                     torch.peak_rss_mb, (ours.peak_rss_bytes / kMiB) / (torch.peak_rss_mb));
    if (ours.device.is_cuda())  // ours: the allocator's peak in use; torch's max_memory_allocated
      out += strprintf("%-28s %12.0f %12.0f %8.2f\n", "device peak (MiB)",
                       ours.device_peak_bytes / kMiB, torch.device_peak_mb,
                       (ours.device_peak_bytes / kMiB) / torch.device_peak_mb);
  } else {
    out += strprintf("%-28s %12.0f %12s\n", "median step (ms)", ours.median_ms, "-");
    out += strprintf("%-28s %12.0f %12s\n", "peak RSS (MiB)", ours.peak_rss_bytes / kMiB, "-");
    out += strprintf("(no PyTorch comparison: %s)\n",
                     torch.note.empty() ? "--torch off" : torch.note.c_str());
  }
  return out + rounds_line(torch);
}

std::string json_summary(const std::string& model, const Gpt2StepTiming& ours,
                         const IsolatedGemm& iso, const TorchPeer& torch, double step_gflops) {
  json::Value v = json::Value::object();
  v.set("model", model);
  v.set("median_step_ms", ours.median_ms);
  v.set("peak_rss_mb", ours.peak_rss_bytes / kMiB);
  v.set("ops_timed", ours.ops_timed);  // false: gemm_ms_per_step is launch time (CUDA)
  v.set("gemm_ms_per_step", ours.gemm_ms_per_step);
  v.set("gemm_gflops", ours.gemm_gflops);
  v.set("isolated_gemm_ms", iso.ms_per_step);
  v.set("isolated_gemm_gflops", iso.gflops);
  v.set("step_gflops", step_gflops);
  v.set("fraction_of_sgemm", step_gflops / iso.gflops);
  if (torch.ok) {
    v.set("torch_median_step_ms", torch.median_ms);
    v.set("torch_peak_rss_mb", torch.peak_rss_mb);
    v.set("step_ratio", step_ratio(ours, torch));
    json::Value rounds = json::Value::array();
    for (const double r : torch.round_ratios) rounds.push_back(r);
    v.set("round_step_ratios", rounds);
    v.set("rss_ratio", (ours.peak_rss_bytes / kMiB) / (torch.peak_rss_mb));
  }
  if (ours.device.is_cuda()) {
    v.set("device", ours.device.str());
    v.set("device_peak_mb", ours.device_peak_bytes / kMiB);
    if (torch.ok) v.set("torch_device_peak_mb", torch.device_peak_mb);
  }
  return v.dump() + "\n";
}
}  // namespace

// Note [Op profile]: the ops that take at least 0.5% of the step, per step, and what is left.
std::string op_profile_table(const Gpt2StepTiming& ours) {
  if (ours.measured_steps <= 0 || ours.ops.empty()) return "";
  const double n = static_cast<double>(ours.measured_steps);
  double step = 0;  // mean over the measured steps
  for (const std::vector<double>* phase : {&ours.forward_ms, &ours.backward_ms, &ours.optimizer_ms})
    for (const double ms : *phase) step += ms / n;
  std::string out = strprintf(
      "per-op profile (mean of %lld steps, %.0f ms; exclusive times, Note [Op profile]):\n"
      "  %-28s %7s %9s %9s %9s %7s\n",
      static_cast<long long>(ours.measured_steps), step, "op", "calls", "ms", "GEMM ms", "other ms",
      "share");
  double all = 0, small = 0;
  auto row = [&](const std::string& name, const std::string& calls, double ms,
                 const std::string& gemm, const std::string& other) {
    out += strprintf("  %-28s %7s %9.1f %9s %9s %6.1f%%\n", name.c_str(), calls.c_str(), ms,
                     gemm.c_str(), other.c_str(), 100.0 * ms / step);
  };
  for (const profile::OpTime& t : ours.ops) {
    all += t.ms / n;
    if (t.ms / n < 0.005 * step) {
      small += t.ms / n;
      continue;
    }
    row(t.name, strprintf("%.0f", t.calls / n), t.ms / n, strprintf("%.1f", t.gemm_ms / n),
        strprintf("%.1f", (t.ms - t.gemm_ms) / n));
  }
  row("(ops under 0.5% each)", "", small, "", "");
  row("(outside any op)", "", step - all, "", "");
  return out;
}

std::string gpt2_bench_report(const std::string& model, const Gpt2StepTiming& ours,
                              const IsolatedGemm& iso, const TorchPeer& torch, bool json) {
  std::string out = comparison_table(ours, torch);
  if (ours.ops_timed) {
    out += strprintf(
        "GEMM in a step: %.0f ms = %.0f%% of the step, at %.1f GFLOP/s (%.1f GFLOP/step)\n",
        ours.gemm_ms_per_step, 100.0 * ours.gemm_ms_per_step / ours.median_ms, ours.gemm_gflops,
        ours.gemm_flops_per_step / 1e9);
    out += strprintf(
        "phases (median ms): forward %.0f (non-GEMM %.0f), backward %.0f (non-GEMM %.0f), "
        "optimizer step() %.0f (the updates run inside backward)\n",
        median(ours.forward_ms), median(ours.forward_other_ms), median(ours.backward_ms),
        median(ours.backward_other_ms), median(ours.optimizer_ms));
  } else {
    out += strprintf(
        "GEMM in a step: %.1f GFLOP; its time and the per-op table need CUDA_LAUNCH_BLOCKING=1 "
        "(launches return before the GPU runs them)\nphases (median ms): forward %.0f, "
        "backward %.0f, optimizer step() %.0f\n",
        ours.gemm_flops_per_step / 1e9, median(ours.forward_ms), median(ours.backward_ms),
        median(ours.optimizer_ms));
  }
  out += strprintf(
      "same GEMM shapes run alone: %.0f ms at %.1f GFLOP/s (the floor for this step's GEMMs)\n",
      iso.ms_per_step, iso.gflops);
  if (ours.ops_timed) out += op_profile_table(ours);
  // The ceiling line (#13 item 5): the whole step's rate next to the sgemm rate of this run.
  const double step_gflops = ours.gemm_flops_per_step / 1e9 / (ours.median_ms / 1e3);
  out += strprintf(
      "achieved: %.1f GFLOP/s over the whole step (its GEMM FLOPs / median step) = %.0f%% of the "
      "%.1f GFLOP/s %s GEMM ceiling measured in this run (OpenBLAS kernels: %s, Note "
      "[OpenBLAS kernels])\n",
      step_gflops, 100.0 * step_gflops / iso.gflops, iso.gflops,
      ours.precision == DType::F32 ? "f32" : dtype_name(ours.precision), openblas_get_corename());
  if (json) out += json_summary(model, ours, iso, torch, step_gflops);
  return out;
}

}  // namespace mw::bench
