// gpt2_train's placement options (apps/gpt2_train.cpp): the device, HybridAdam's overlap and
// NVMe offload, Gemini's policies and tiers, the trace and the precision; declared on the parser
// and parsed into the TrainOptions. A header of that one app, kept apart by concern.
#pragma once

#include <charconv>
#include <cmath>
#include <string>

#include "cli.h"
#include "core/cuda_stream.h"
#include "core/numbers.h"
#include "core/parallel.h"
#include "dist/communicator.h"
#include "offload/gemini/gemini.h"
#include "optim/loss_scaler.h"
#include "train/trainer.h"

namespace mw {

// HybridAdam's overlap, Gemini's placement and tiers, the trace and the precision.
inline void declare_placement(cli::Parser& p) {
  p.option("update-in-backward", "on",
           "on|off: step each parameter (or Gemini chunk) as soon as its gradient is final, "
           "freeing it (Note [Update in backward]); with --grad-accum, in the last "
           "micro-batch's backward");
  p.option("nvme-borrow", "off",
           "on|off: lend spent gradient buffers as extra read-ahead slots (up to the largest "
           "parameter's m+v of RAM)");
  p.option("optimizer-states", "host",
           "host|device: where HybridAdam keeps m and v of parameters "
           "on the sim device");
  p.option("nvme-timeline", "", "write per-slice read/compute/write times of the last step (CSV)");
  p.option("gemini", "none",
           "none|static|auto|const: chunk-based placement of the parameters between the device "
           "(--device sim:CAPACITY) and the host (docs/gemini.md)");
  p.option("chunk-size", "", "Gemini chunk capacity in elements (default: searched)");
  p.option("offload-param-frac", "0",
           "--gemini static: fraction of chunk bytes whose parameters live on the host");
  p.option("offload-optim-frac", "0",
           "--gemini static: fraction of chunk bytes whose gradients and Adam states live on "
           "the host (1 and 1: ColossalAI's placement_policy='cpu')");
  p.option("const-budget", "512MiB", "--gemini const: cap on chunk bytes gathered on the device");
  p.option("auto-margin", "",
           "--gemini auto: share of the capacity kept free beyond the measured non-model "
           "reserve (default 0.02 on sim, 0.10 on cuda)");
  p.option("gpu-margin-mem-ratio", "0",
           "--gemini auto: share of the device memory the warmup's plan leaves free that chunks "
           "may take for good with their Adam states, stepped on the device (ColossalAI's "
           "gpu_margin_mem_ratio; docs/gemini.md)");
  p.option("copy-worker", "auto",
           "on|off|auto: --gemini auto|const: the chunks the next two ops need are copied to the "
           "device while the current op computes, by a thread on sim, on a copy stream on cuda "
           "(docs/gemini.md); auto: on for sim when --threads is given and below the machine's "
           "cores, off on cuda");
  p.option("chunk-copy-dtype", "auto",
           "auto|fp32: --gemini or --zero 3 with --precision bf16|fp16: the blocks' weight "
           "matrices go to the device, and ZeRO 3's all_gathers carry them, in that dtype (half "
           "the bytes, the same results: docs/gemini.md, docs/distributed.md); fp32: in f32");
  p.option("host-capacity", "",
           "--gemini: host RAM for chunks and optimizer states; what does not fit goes to disk "
           "under --nvme-dir (three tiers)");
  p.option("trace", "", "write a Chrome/Perfetto trace (JSON) of the run's memory and moves");
  p.option("precision", "fp32",
           "fp32|bf16|fp16: matmuls and attention in bf16/fp16 with f32 masters (fp16 with a "
           "dynamic loss scaler, and updates after backward) (docs/precision.md)");
  p.option("initial-loss-scale", "",
           "--precision fp16: the loss scale to start from, a power of two (default 65536; an "
           "overflowing step is skipped, and from the second in a row the scale is halved at "
           "each; doubled after 1000 good steps, up to 2^24)");
}

// --offload nvme (HybridAdam's states on disk) and --gemini (chunks between device, host, disk).
inline void parse_offload(const cli::Parser& p, train::TrainOptions& o, bool nvme,
                          const std::string& policy) {
  if (nvme) {
    MW_CHECK_T(cli::UsageError, o.optimizer == "hybridadam",
               "--offload nvme needs --optimizer hybridadam");
    o.nvme.fraction = p.real("fraction", 0, 1);
    o.nvme.dir = p.str("nvme-dir");
    o.nvme.window_bytes = p.bytes("nvme-window", 1);
    o.nvme.record_timeline = !p.str("nvme-timeline").empty();
    o.nvme.borrow_gradient_slots = p.choice("nvme-borrow", {"on", "off"}) == "on";
  }
  o.gemini_low_copies = p.choice("chunk-copy-dtype", {"auto", "fp32"}) == "auto";
  MW_CHECK_T(cli::UsageError, !p.given("chunk-copy-dtype") || p.str("precision") != "fp32",
             "--chunk-copy-dtype picks the dtype of chunk copies and parameter gathers under "
             "--precision bf16|fp16; under fp32 every copy is f32: drop it, or pass --precision "
             "bf16");
  MW_CHECK_T(cli::UsageError,
             !p.given("chunk-copy-dtype") || policy != "none" || p.integer("zero", 0, 3) == 3,
             "--chunk-copy-dtype picks the dtype of Gemini's chunk copies and of ZeRO 3's "
             "parameter gathers: it needs --gemini or --zero 3");
  if (policy != "none") {
    MW_CHECK_T(cli::UsageError, !o.device.is_cpu(),
               "--gemini needs a device to place chunks on: --device sim:CAPACITY");
    MW_CHECK_T(cli::UsageError, o.optimizer == "hybridadam",
               "--gemini needs --optimizer hybridadam");
    o.gemini = policy;
    auto& g = o.gemini_options;
    g.policy = gemini::parse_policy(policy);
    g.device = o.device;
    if (p.given("chunk-size")) g.chunk_numel = p.integer("chunk-size", 1, int64_t{1} << 40);
    g.offload_param_frac = p.real("offload-param-frac", 0, 1);
    g.offload_optim_frac = p.real("offload-optim-frac", 0, 1);
    g.const_budget_bytes = p.bytes("const-budget");
    if (p.given("auto-margin")) g.auto_margin = p.real("auto-margin", 0, 0.9);
    g.gpu_margin_mem_ratio = p.real("gpu-margin-mem-ratio", 0, 1);
    // Each policy's own knobs do nothing under the others (issue #12: refused, not ignored).
    MW_CHECK_T(
        cli::UsageError,
        policy == "static" || !(p.given("offload-param-frac") || p.given("offload-optim-frac")),
        "--offload-param-frac and --offload-optim-frac place chunks under --gemini static "
        "only; with --gemini ",
        policy, " drop them");
    MW_CHECK_T(cli::UsageError, policy == "const" || !p.given("const-budget"),
               "--const-budget caps gathered chunks under --gemini const only; with --gemini ",
               policy, " drop it");
    MW_CHECK_T(cli::UsageError, policy == "auto" || !p.given("auto-margin"),
               "--auto-margin is --gemini auto's share of the device kept free; with --gemini ",
               policy, " drop it");
    const std::string worker = p.choice("copy-worker", {"auto", "on", "off"});
    MW_CHECK_T(cli::UsageError, worker != "on" || policy != "static",
               "--copy-worker on copies the chunks a plan needs next: it works under --gemini "
               "auto|const; with --gemini static drop it");
    g.copy_worker =
        worker == "on" || (worker == "auto" && policy != "static" && !o.device.is_cuda() &&
                           o.threads > 0 && o.threads < available_cores());
    if (p.given("host-capacity")) {
      g.host_capacity_bytes = p.bytes("host-capacity");
      // Three tiers: a disk-homed chunk passes through RAM whole, so RAM in flight grows with the
      // chunk; the disk is at full speed well below ColossalAI's 32-64M elements: search from 8M
      // (docs/gemini.md: GPT-2 medium's peak RSS 2491 -> 1877 MiB, xl's 3612 -> 3252 MiB).
      if (!p.given("chunk-size"))
        g.search.min_chunk_numel = g.search.search_range_numel = int64_t{8} << 20;
    }
    g.nvme_dir = p.str("nvme-dir");
    o.gemini_nvme_window_bytes = p.bytes("nvme-window");
    gemini::check_gpu_margin(g);  // before the model is built
  } else {
    for (const char* name :
         {"chunk-size", "offload-param-frac", "offload-optim-frac", "const-budget", "auto-margin",
          "gpu-margin-mem-ratio", "host-capacity", "copy-worker"})
      MW_CHECK_T(cli::UsageError, !p.given(name), "--", name, " needs --gemini");
  }
}

// --precision, and fp16's --initial-loss-scale: a power of two (Note [Dynamic loss scaling]).
inline void parse_precision_options(const cli::Parser& p, train::TrainOptions& o) {
  o.precision = parse_precision(p.choice("precision", {"fp32", "bf16", "fp16"}));
  if (!p.given("initial-loss-scale")) return;
  MW_CHECK_T(cli::UsageError, o.precision == DType::F16,
             "--initial-loss-scale needs --precision fp16");
  o.loss_scaler.initial_scale = p.real("initial-loss-scale", 1, 1e30);
  const int power = static_cast<int>(std::floor(std::log2(o.loss_scaler.initial_scale)));
  auto two_to = [](int k) {  // whole digits up to 2^62, then every digit the double needs
    if (k < 63) return str(int64_t{1} << k, " (2^", k, ")");
    char digits[32];
    const auto end = std::to_chars(digits, digits + sizeof digits, std::ldexp(1.0, k)).ptr;
    return str(std::string(digits, end), " (2^", k, ")");
  };
  MW_CHECK_T(cli::UsageError, optim::is_power_of_two(o.loss_scaler.initial_scale),
             "--initial-loss-scale ", p.str("initial-loss-scale"),
             ": expected a power of two, such as ", two_to(power),
             power + 1 <= 99 ? " or " + two_to(power + 1) : std::string(),
             ": unscaling by one is exact (Note [Dynamic loss scaling])");
}

// --device cpu | sim[:CAPACITY] | cuda[:N][:CAPACITY].
inline void parse_device_option(const cli::Parser& p, train::TrainOptions& o) {
  std::string dev = p.str("device");
  std::string kind = dev.substr(0, dev.find(':'));
  auto capacity = [&](const std::string& text) {
    try {
      o.device_capacity_limit_bytes = parse_bytes(text);
    } catch (const InvalidArgument& e) {
      throw cli::UsageError(str("--device '", dev, "': ", e.what()));
    }
  };
  if (kind == "sim") {
    o.device = Device::sim(0);
    if (dev.size() > 4) capacity(dev.substr(4));
  } else if (kind == "cuda") {  // cuda[:N][:CAPACITY]: a last part that is not an index caps it
    const size_t last = dev.rfind(':');
    std::string spec = dev;
    if (last != std::string::npos &&
        dev.find_first_not_of("0123456789", last + 1) != std::string::npos) {
      capacity(dev.substr(last + 1));
      spec = dev.substr(0, last);
    }
    // Under a launcher, plain "cuda" is this rank's GPU, as the NCCL backend picks it (its local
    // rank modulo the devices it sees): no rank touches another's (a context costs memory).
    if (spec == "cuda" && dist::launcher_world_size() > 1 && dist::launcher_local_rank() >= 0 &&
        cuda_device_count() > 0)
      spec = str("cuda:", dist::launcher_local_rank() % cuda_device_count());
    o.device = cli::cuda_device(spec, dev);
  } else if (dev != "cpu") {
    throw cli::UsageError(str("--device '", dev,
                              "': expected cpu, sim[:CAPACITY] such as sim:4GiB, or "
                              "cuda[:N][:CAPACITY] such as cuda:0 or cuda:768MiB"));
  }
}

}  // namespace mw
