// gpt2_bench: GPT-2 training speed and memory, against PyTorch measured in the same run.
//
// Ours: fp32, HybridAdam, dropout 0, random tokens, --steps steps (median step time, peak RSS).
// Peer: tools/torch_gpt2_bench.sh tuned (Debian python3-torch, OMP_WAIT_POLICY=PASSIVE, jemalloc
// with decay off, same threads), run as a subprocess so its RSS is its own. Then the share of our
// step spent in GEMM, against the sgemm rate measured for the very same shapes in this process,
// and the whole step's achieved GFLOP/s as a fraction of that sgemm rate (its ceiling). The
// measurements and the report are bench/gpt2_bench.h. --rounds times both sides that many times,
// alternating which goes first (Note [Alternated rounds]).
#include "bench/gpt2_bench.h"

#include <vector>

#include "cli.h"
#include "core/numbers.h"
#include "core/parallel.h"
#include "optim/adam_cpu.h"

namespace mw {
namespace {

// --device cpu | cuda[:N]; a build without CUDA, or no such GPU, is a usage error before any work.
Device bench_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  MW_CHECK_T(cli::UsageError, text.rfind("cuda", 0) == 0,
             str("--device '", text, "': expected cpu or cuda[:N]"));
  return cli::cuda_device(text);
}

int run(const cli::Parser& p) {
  cli::RunShapeLimits limits;
  limits.max_batch = 1 << 16;
  limits.min_seq = 2;
  limits.max_seq = 1 << 16;
  limits.min_steps = 2;
  limits.max_steps = 1000;
  const cli::RunShape s = cli::run_shape(p, limits);
  set_num_threads(s.threads);
  gpt2::Config config = s.config;
  config.set_dropout(0.0);
  const Device device = bench_device(p.str("device"));
  const bool bf16 = p.choice("precision", {"fp32", "bf16"}) == "bf16";
  const DType precision = bf16 ? DType::BF16 : DType::F32;

  cli::print(bench::strprintf(
      "memwall: GPT-2 %s %s on %s, B%lld T%lld, %lld steps, %d threads, HybridAdam "
      "(%s)\n",
      s.model.c_str(), bf16 ? "bf16 autocast" : "fp32", device.str().c_str(),
      static_cast<long long>(s.batch), static_cast<long long>(s.seq),
      static_cast<long long>(s.steps), num_threads(), optim::isa_name(optim::best_isa())));
  // Note [Alternated rounds]: ours and the peer in turn, the first round ours first; the GEMM
  // ceiling right after each of our runs.
  const bool peer = p.choice("torch", {"auto", "off"}) != "off";
  const int64_t rounds = p.integer("rounds", 1, 20);
  std::vector<bench::Gpt2StepTiming> ours;
  std::vector<bench::TorchPeer> peers;
  std::vector<double> ceiling_ms, ceiling_gflops;
  for (int64_t round = 0; round < rounds; ++round) {
    if (rounds > 1)
      cli::print(bench::strprintf("round %d of %d\n", static_cast<int>(round) + 1,
                                  static_cast<int>(rounds)));
    auto run_ours = [&] {
      ours.push_back(
          bench::time_gpt2_steps(config, s.batch, s.seq, s.steps, device, precision, cli::print));
      const bench::IsolatedGemm iso =
          bench::time_isolated_gemms(config, s.batch, s.seq, device, precision);
      ceiling_ms.push_back(iso.ms_per_step);
      ceiling_gflops.push_back(iso.gflops);
    };
    auto run_peer = [&] {
      if (peer)
        peers.push_back(bench::run_torch_peer(MW_SOURCE_DIR, s.model, s.batch, s.seq, s.steps,
                                              num_threads(), device, precision, cli::print));
    };
    if (round % 2 == 0) {
      run_ours();
      run_peer();
    } else {
      run_peer();
      run_ours();
    }
  }
  const bench::IsolatedGemm isolated{median(ceiling_ms), median(ceiling_gflops)};
  const bench::TorchPeer torch = peer ? bench::pooled(peers, ours) : bench::TorchPeer{};
  cli::print(
      bench::gpt2_bench_report(s.model, bench::pooled(ours), isolated, torch, p.has("json")));
  return 0;
}

}  // namespace
}  // namespace mw

int main(int argc, char** argv) {
  mw::cli::Parser p("gpt2_bench",
                    "GPT-2 training step time and peak RSS against PyTorch, same run.");
  mw::cli::declare_run_shape(
      p, {"10", "training steps (the first is a warmup, excluded from medians)", "2",
          "threads for both memwall and PyTorch"});
  p.option("device", "cpu",
           "cpu | cuda[:N] (a CUDA build; the per-op table is GPU time with "
           "CUDA_LAUNCH_BLOCKING=1)");
  p.option("torch", "auto", "auto|off: run the PyTorch peer");
  p.option("rounds", "3",
           "rounds of our steps and the peer's, alternating which goes first; the step ratio is "
           "the median of the rounds' (Note [Alternated rounds])");
  p.option("precision", "fp32",
           "fp32|bf16: bf16 runs the forward and the loss under autocast on both sides "
           "(docs/precision.md)");
  p.flag("json", "print a JSON summary as the last line");
  return mw::cli::run_main(p, "gpt2_bench", argc, argv,
                           [](const mw::cli::Parser& q) { return mw::run(q); });
}
