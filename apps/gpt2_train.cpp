// gpt2_train: trains GPT-2 with the shifted cross-entropy loss, reproducing the ColossalAI
// documents' examples (docs/references.md) and printing their lines: "Model numel", "[i] loss",
// "Time", "Mem usage". Then peak RSS, median step time and throughput; optionally a JSON-lines log
// of every step.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "cli.h"
#include "core/allocator.h"
#include "core/interrupt.h"
#include "core/parallel.h"
#include "data/atomic_save.h"
#include "data/json.h"
#include "data/random_tokens.h"
#include "data/token_shard.h"
#include "models/gpt2/hf_io.h"
#include "models/gpt2/memory_plan.h"
#include "models/gpt2/model.h"
#include "nn/checkpoint.h"
#include "offload/activation/activation_offload.h"
#include "offload/gemini/gemini.h"
#include "optim/hybrid_adam.h"

namespace mw {
namespace {

struct Options {
  std::string model = "small", init_from, data, log, save, optimizer = "hybridadam";
  int64_t batch = 4, seq = 128, steps = 3, threads = 0;
  uint64_t seed = 0;
  double dropout = -1;  // < 0: the config's
  optim::AdamHyper hyper;
  Device device = Device::cpu();
  int64_t sim_capacity_bytes = 0;
  // NVMe offload of the optimizer states (HybridAdam only).
  optim::NvmeOffloadOptions nvme;
  std::string save_optimizer, load_optimizer, nvme_timeline;
  bool update_in_backward = true;
  bool states_on_host = true;
  // Recomputation and activation offload (docs/recompute.md).
  bool checkpoint_every_block = false;
  int64_t checkpoint_segments = -1;  // -1: not segmented; 0: round(sqrt(n_layer))
  bool offload_activations = false;
  // Gemini (docs/gemini.md): "" = off.
  std::string gemini, trace;
  gemini::GeminiOptions gemini_options;
  int64_t gemini_nvme_window_bytes = 0;
  // The memory plan (docs/reliability.md): print it and exit; run without checking it.
  bool plan_only = false, skip_memory_check = false;
};

cli::Parser make_parser() {
  cli::Parser p(
      "gpt2_train",
      "Trains GPT-2 on the CPU (or the simulated accelerator) with HybridAdam; prints the\n"
      "ColossalAI documents' lines (Model numel, [i] loss, Time, Mem usage).");
  p.option("model", "small", "tiny|small|medium|large|xl");
  p.option("init-from", "", "HuggingFace folder (config.json + model.safetensors) to start from");
  p.option("batch", "4", "sequences per step (B)");
  p.option("seq", "128", "tokens per sequence (T)");
  p.option("steps", "3", "training steps");
  p.option("seed", "0", "seed for initialisation, random data and dropout");
  p.option("threads", "0", "worker threads (0 = all cores)");
  p.option("lr", "1e-3", "learning rate");
  p.option("beta1", "0.9", "Adam beta1");
  p.option("beta2", "0.999", "Adam beta2");
  p.option("eps", "1e-8", "Adam epsilon");
  p.option("weight-decay", "0", "decoupled weight decay");
  p.option("dropout", "",
           "dropout probability for embeddings, attention and residuals (default: "
           "the config's, 0.1)");
  p.option("optimizer", "hybridadam", "hybridadam|adamw (adamw is the plain scalar reference)");
  p.option("device", "cpu",
           "cpu | sim[:CAPACITY] (simulated accelerator, e.g. sim:4GiB) | cuda[:N] (a GPU, in a "
           "CUDA build)");
  p.flag("checkpoint-activations", "recompute every block's activations in backward");
  p.option("checkpoint-segments", "",
           "checkpoint_sequential over the blocks with K segments (the "
           "last not checkpointed); 0 = round(sqrt(n_layer))");
  p.flag("offload-activations",
         "copy saved activations to host memory in forward and prefetch them "
         "back in backward (with checkpointing: the checkpoint inputs)");
  p.option("data", "", "llm.c token shard (.bin); default: seeded random tokens");
  p.option("log", "", "write one JSON object per step to this file");
  p.option("save", "", "save the trained model as a HuggingFace folder");
  p.option("offload", "none", "none|nvme: keep HybridAdam's m and v on disk between steps");
  p.option("fraction", "1.0", "with --offload nvme: fraction of parameter elements offloaded");
  p.option("nvme-dir", "", "directory for offloaded states (default: a private temporary one)");
  p.option("nvme-window", "32MiB", "RAM for states in flight (read ahead / update / write back)");
  p.option("save-optimizer", "", "after training, save the optimizer state to this file");
  p.option("load-optimizer", "", "before training, load the optimizer state from this file");
  p.option("update-in-backward", "on",
           "on|off: step each parameter as soon as its gradient is "
           "final, freeing it (Note [Update in backward])");
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
  p.option("host-capacity", "",
           "--gemini: host RAM for chunks and optimizer states; what does not fit goes to disk "
           "under --nvme-dir (three tiers)");
  p.option("host-capacity", "",
           "--gemini: host RAM for chunks and optimizer states; what does not fit goes to disk "
           "under --nvme-dir (three tiers)");
  p.option("trace", "", "write a Chrome/Perfetto trace (JSON) of the run's memory and moves");
  p.flag("plan", "print the memory plan (host, device, disk) and exit without allocating");
  p.flag("skip-memory-check",
         "expert: run even when the memory plan exceeds what the machine has (the plan is an "
         "estimate within about 10%, docs/reliability.md)");
  return p;
}

Options parse_options(const cli::Parser& p) {
  Options o;
  o.init_from = p.str("init-from");
  if (o.init_from.empty()) o.model = p.choice("model", {"tiny", "small", "medium", "large", "xl"});
  o.batch = p.integer("batch", 1, 1 << 20);
  o.seq = p.integer("seq", 2, 1 << 20);
  o.steps = p.integer("steps", 0, int64_t{1} << 40);
  o.seed = static_cast<uint64_t>(p.integer("seed", 0, INT64_MAX));
  o.threads = p.integer("threads", 0, 4096);
  o.hyper.lr = static_cast<float>(p.real("lr", 0, 10));
  o.hyper.beta1 = static_cast<float>(p.real("beta1", 0, 0.999999));
  o.hyper.beta2 = static_cast<float>(p.real("beta2", 0, 0.999999999));
  o.hyper.eps = static_cast<float>(p.real("eps", 0, 1));
  o.hyper.weight_decay = static_cast<float>(p.real("weight-decay", 0, 10));
  if (p.given("dropout")) o.dropout = p.real("dropout", 0, 0.99);
  o.optimizer = p.choice("optimizer", {"hybridadam", "adamw"});
  o.update_in_backward = p.choice("update-in-backward", {"on", "off"}) == "on";
  o.states_on_host = p.choice("optimizer-states", {"host", "device"}) == "host";
  std::string dev = p.str("device");
  std::string kind = dev.substr(0, dev.find(':'));
  if (kind == "sim") {
    o.device = Device::sim(0);
    if (dev.size() > 4) {
      try {
        o.sim_capacity_bytes = parse_bytes(dev.substr(4));
      } catch (const InvalidArgument& e) {
        throw cli::UsageError(str("--device '", dev, "': ", e.what()));
      }
    }
  } else if (kind == "cuda") {
    try {  // a build without CUDA, or no visible GPU, is a clear error now rather than mid-run
      o.device = parse_device(dev);
      allocator_for(o.device);
    } catch (const Error& e) {
      throw cli::UsageError(str("--device '", dev, "': ", e.what()));
    }
  } else if (dev != "cpu") {
    throw cli::UsageError(
        str("--device '", dev, "': expected cpu, sim[:CAPACITY] such as sim:4GiB, or cuda[:N]"));
  }
  o.checkpoint_every_block = p.has("checkpoint-activations");
  if (p.given("checkpoint-segments"))
    o.checkpoint_segments = p.integer("checkpoint-segments", 0, 1 << 20);
  o.offload_activations = p.has("offload-activations");
  o.data = p.str("data");
  o.log = p.str("log");
  o.save = p.str("save");
  const bool nvme = p.choice("offload", {"none", "nvme"}) == "nvme";
  if (nvme) {
    MW_CHECK_T(cli::UsageError, o.optimizer == "hybridadam",
               "--offload nvme needs --optimizer hybridadam");
    o.nvme.fraction = p.real("fraction", 0, 1);
    o.nvme.dir = p.str("nvme-dir");
    o.nvme.window_bytes = p.bytes("nvme-window", 1);
    o.nvme.record_timeline = !p.str("nvme-timeline").empty();
    o.nvme.borrow_gradient_slots = p.choice("nvme-borrow", {"on", "off"}) == "on";
  }
  const std::string policy = p.choice("gemini", {"none", "static", "auto", "const"});
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
    if (p.given("host-capacity")) g.host_capacity_bytes = p.bytes("host-capacity");
    g.nvme_dir = p.str("nvme-dir");
    o.gemini_nvme_window_bytes = p.bytes("nvme-window");
  } else {
    for (const char* name : {"chunk-size", "offload-param-frac", "offload-optim-frac",
                             "const-budget", "auto-margin", "host-capacity"})
      MW_CHECK_T(cli::UsageError, !p.given(name), "--", name, " needs --gemini");
  }
  o.trace = p.str("trace");
  MW_CHECK_T(cli::UsageError, o.trace.empty() || policy != "none", "--trace needs --gemini");
  o.save_optimizer = p.str("save-optimizer");
  o.load_optimizer = p.str("load-optimizer");
  o.nvme_timeline = p.str("nvme-timeline");
  o.plan_only = p.has("plan");
  o.skip_memory_check = p.has("skip-memory-check");
  MW_CHECK_T(cli::UsageError,
             o.optimizer == "hybridadam" || (o.save_optimizer.empty() && o.load_optimizer.empty()),
             "--save-optimizer/--load-optimizer need --optimizer hybridadam");
  return o;
}

// CPU time of the whole process (all threads), in ms. On a shared machine the wall time of a step
// depends on other jobs; its CPU time much less so (docs/recompute.md compares modes by both).
double process_cpu_ms() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto ms = [](const timeval& t) { return t.tv_sec * 1e3 + t.tv_usec * 1e-3; };
  return ms(u.ru_utime) + ms(u.ru_stime);
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

json::Value device_peaks(const Options& o) {
  json::Value peaks = json::Value::object();
  peaks.set("cpu", allocator_for(Device::cpu()).stats().peak_bytes);
  if (!o.device.is_cpu()) peaks.set(o.device.str(), allocator_for(o.device).stats().peak_bytes);
  return peaks;
}

// Prints the memory plan; stops before anything is allocated when it does not fit (Note
// [Activation arithmetic], models/gpt2/memory_plan.h). Returns true for --plan.
bool memory_plan(const Options& o, const gpt2::Config& config) {
  gpt2::PlanInputs in;
  in.config = config;
  in.batch = o.batch, in.seq = o.seq;
  in.adamw = o.optimizer == "adamw";
  in.update_in_backward = o.update_in_backward;
  in.states_on_host = o.states_on_host;
  in.nvme_fraction = o.nvme.fraction;
  in.nvme_window_bytes = o.gemini.empty() ? o.nvme.window_bytes : o.gemini_nvme_window_bytes;
  in.nvme_dir = o.gemini.empty() ? o.nvme.dir : o.gemini_options.nvme_dir;
  in.device = o.device;
  in.device_capacity_bytes = o.sim_capacity_bytes;
  in.checkpoint_every_block = o.checkpoint_every_block;
  in.checkpoint_segments = o.checkpoint_segments;
  in.offload_activations = o.offload_activations;
  in.gemini = !o.gemini.empty();
  in.gemini_options = o.gemini_options;
  const gpt2::MemoryPlan plan = gpt2::plan_memory(in);
  std::printf("%s", plan.table().c_str());
  const gpt2::AvailableMemory avail = gpt2::available_memory(in.nvme_dir);
  std::printf("  available: host %.1f MiB (%s) | disk %.1f MiB at '%s'\n", mib(avail.host_bytes),
              avail.host_source.c_str(), mib(avail.disk_bytes), avail.disk_path.c_str());
  std::fflush(stdout);
  if (o.plan_only) {
    try {
      gpt2::check_plan_fits(plan, in, avail);
    } catch (const OutOfMemory& e) {
      std::printf("  does not fit: %s\n", e.what());
    }
    return true;
  }
  if (o.skip_memory_check)
    std::printf("  --skip-memory-check: not checked against what the machine has\n");
  else
    gpt2::check_plan_fits(plan, in, avail);
  return false;
}

int run(const Options& o) {
  set_num_threads(static_cast<int>(o.threads));
  if (o.device.is_sim()) set_sim_capacity(o.device.index, o.sim_capacity_bytes);

  // Outputs first: a typo in any output path fails now, not after training (docs/reliability.md).
  if (!o.save.empty()) data::check_output_path(o.save, "--save", /*as_directory=*/true);
  for (const auto& [option, path] : {std::pair<const char*, std::string>{"--log", o.log},
                                     {"--save-optimizer", o.save_optimizer},
                                     {"--nvme-timeline", o.nvme_timeline},
                                     {"--trace", o.trace}})
    if (!path.empty()) data::check_output_path(path, option, /*as_directory=*/false);

  gpt2::Config config =
      o.init_from.empty() ? gpt2::Config::preset(o.model) : gpt2::load_hf_config(o.init_from);
  for (const auto& key : config.unknown_fields)
    std::fprintf(stderr,
                 "gpt2_train: warning: %s/config.json: field \"%s\" is not a GPT2Config "
                 "field; ignored\n",
                 o.init_from.c_str(), key.c_str());
  const gpt2::Config saved_config = config;  // what --save records: not the run's --dropout
  if (o.dropout >= 0) config.set_dropout(o.dropout);
  MW_CHECK_T(InvalidArgument, o.seq <= config.n_positions, "--seq ", o.seq, " exceeds the model's ",
             config.n_positions, " positions; lower --seq");
  if (memory_plan(o, config)) return 0;
  default_generator().manual_seed(o.seed);

  // Under Gemini the model is built on the host; Gemini packs it into chunks and places them.
  // Under Gemini the parameters are made in their chunks, which may live on disk (Note [Streaming
  // construction]); otherwise on the device.
  // The documents' unit: 2^30 parameters ("0.116 B" for GPT-2 small's 124,439,808).
  std::printf("Model numel: %.3f B\n",
              static_cast<double>(gpt2::num_parameters(config)) / (1 << 30));
  std::unique_ptr<gemini::Gemini> gemini_owned;
  gpt2::ParameterFactory factory;
  if (!o.gemini.empty()) {
    gemini::GeminiOptions g = o.gemini_options;
    g.search.interval_numel = config.n_embd;  // ColossalAI's hidden_dim
    g.adam = optim::HybridAdamOptions(o.hyper, -1.f, o.nvme);
    g.adam.nvme.window_bytes = o.gemini_nvme_window_bytes;
    std::vector<std::pair<std::string, Shape>> tensors;
    for (const auto& spec : gpt2::tensor_specs(config)) tensors.emplace_back(spec.name, spec.shape);
    gemini_owned = std::make_unique<gemini::Gemini>(g, tensors);
    if (o.init_from.empty()) {  // with --init-from the weights are copied in by attach()
      factory.make = [&](const gpt2::TensorSpec& spec) {
        return gemini_owned->make_parameter(spec.name);
      };
      factory.ready = [&](const gpt2::TensorSpec& spec) {
        gemini_owned->parameter_ready(spec.name);
      };
    }
  }
  gpt2::GPT2 model(config, o.seed, DType::F32, o.gemini.empty() ? o.device : Device::cpu(),
                   factory);
  if (!o.init_from.empty()) gpt2::load_hf_weights(model, o.init_from);

  std::unique_ptr<data::TokenShard> shard;
  if (!o.data.empty()) {
    shard = std::make_unique<data::TokenShard>(o.data);
    shard->check_vocab(config.vocab_size);
  }

  std::unique_ptr<optim::Optimizer> opt;
  gemini::Gemini* gem = nullptr;
  std::unique_ptr<gemini::Trace> trace;
  if (!o.gemini.empty()) {
    gemini_owned->attach(model);
    gem = gemini_owned.get();
    opt = std::move(gemini_owned);
    std::printf("%s\n", gem->describe().c_str());
    if (!o.trace.empty()) {
      trace = std::make_unique<gemini::Trace>();
      gem->set_trace(trace.get());
    }
  } else if (o.optimizer == "adamw") {
    opt = std::make_unique<optim::AdamW>(model.parameters(), o.hyper);
  } else {
    optim::HybridAdamOptions hopts(o.hyper, -1.f, o.nvme);
    hopts.update_in_backward = o.update_in_backward;
    hopts.states_on_host = o.states_on_host;
    opt = std::make_unique<optim::HybridAdam>(model.parameters(), hopts);
  }
  auto* hybrid = gem ? &gem->adam() : dynamic_cast<optim::HybridAdam*>(opt.get());
  if (hybrid && hybrid->nvme())
    std::printf(
        "NVMe offload: %.3f B of %.3f B parameters' Adam states in '%s' (%s), window %.0f MiB\n",
        static_cast<double>(hybrid->offloaded_numel()) / (1 << 30),
        static_cast<double>(model.num_parameters()) / (1 << 30),
        o.nvme.dir.empty() ? "private temporary directory" : o.nvme.dir.c_str(),
        hybrid->nvme()->stats().direct ? "O_DIRECT" : "buffered", mib(o.nvme.window_bytes));
  if (!o.load_optimizer.empty()) {
    hybrid->load_state(o.load_optimizer);
    std::printf("Loaded optimizer state (step %lld) from %s\n",
                static_cast<long long>(hybrid->step_count()), o.load_optimizer.c_str());
  }

  // Activation offload and recomputation: run_block maps block i through its segment.
  std::unique_ptr<offload::ActivationOffloader> offloader;
  if (o.offload_activations) offloader = std::make_unique<offload::ActivationOffloader>();
  if (o.checkpoint_every_block || o.checkpoint_segments >= 0) {
    const int64_t n = static_cast<int64_t>(model.blocks().size());
    std::vector<nn::Segment> plan;
    if (o.checkpoint_segments >= 0) {
      const int64_t k = o.checkpoint_segments == 0 ? nn::sqrt_segments(n) : o.checkpoint_segments;
      MW_CHECK_T(InvalidArgument, k <= n, "--checkpoint-segments ", k, " exceeds the ", n,
                 " blocks; use at most ", n, " (or 0 for sqrt)");
      plan = nn::plan_segments(n, k);
    } else {
      for (int64_t i = 0; i < n; ++i) plan.push_back({i, i + 1, true});
    }
    nn::CheckpointOptions copts;
    if (offloader) {
      copts.pack_input = offloader->pack_hook();
      copts.unpack_input = offloader->unpack_hook();
    }
    std::string desc;
    for (const auto& seg : plan)
      desc += str(" [", seg.begin, ",", seg.end, ")", seg.checkpointed ? "" : "*");
    std::printf("Checkpointing %zu segments:%s (* = not checkpointed)\n", plan.size(),
                desc.c_str());
    auto runner = std::make_shared<nn::SegmentedRunner>(
        std::vector<std::shared_ptr<nn::Module>>(model.blocks().begin(), model.blocks().end()),
        plan, copts);
    model.run_block = [runner](nn::Block&, int64_t i, const Tensor& x) { return (*runner)(i, x); };
  }

  std::unique_ptr<std::ofstream> log;
  if (!o.log.empty()) {
    log = std::make_unique<std::ofstream>(o.log);
    MW_CHECK_T(IoError, log->good(), "--log '", o.log, "' cannot be written: ", errno_text(errno),
               "; pass a path in a writable directory");
  }

  std::vector<int32_t> tokens(static_cast<size_t>(o.batch * o.seq));
  std::vector<double> step_ms, forward_ms, backward_ms, step_cpu_ms;  // forward includes the loss
  std::vector<std::pair<std::string, double>> phase_ms;
  const int64_t first_step = opt->step_count();  // > 0 after --load-optimizer
  model.train();
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  bool log_failed = false;
  for (int64_t step = 0; step < o.steps; ++step) {
    throw_if_stop_requested(str("before step ", step).c_str());
    const auto t0 = clock::now();
    const double cpu0 = process_cpu_ms();
    const int64_t data_step = step + first_step;  // a resumed run continues the data stream
    if (shard)
      shard->batch(data_step, o.batch, o.seq, tokens.data());
    else
      data::random_tokens(o.seed, data_step, o.batch, o.seq, config.vocab_size, tokens.data());
    Tensor ids = Tensor::from_vector(tokens, {o.batch, o.seq}, o.device);

    auto mark = [&](const char* phase) {  // on the offload clock, for --nvme-timeline
      if (hybrid && hybrid->nvme()) phase_ms.emplace_back(phase, hybrid->nvme()->now_ms());
    };
    phase_ms.clear();
    opt->zero_grad();
    mark("forward_start");
    const auto t_fwd = clock::now();
    Tensor logits, loss;
    {
      std::unique_ptr<offload::OffloadScope> offload_scope;
      if (offloader) offload_scope = std::make_unique<offload::OffloadScope>(*offloader);
      logits = model(ids);
      loss = shifted_cross_entropy(logits, ids);
    }
    logits = Tensor();  // the loss node holds the only reference: backward reuses the buffer
    mark("backward_start");
    const auto t_bwd = clock::now();
    backward(loss);
    mark("step_start");
    const auto t_opt = clock::now();
    opt->step();
    mark("step_end");
    forward_ms.push_back(std::chrono::duration<double, std::milli>(t_bwd - t_fwd).count());
    backward_ms.push_back(std::chrono::duration<double, std::milli>(t_opt - t_bwd).count());
    const double loss_value = loss.item();
    MW_CHECK(std::isfinite(loss_value), "the loss is ", loss_value, " at step ", step,
             ": training diverged (lower --lr, check the data and --init-from weights); stopped "
             "without saving, any earlier save is kept");
    const double ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    step_ms.push_back(ms);
    step_cpu_ms.push_back(process_cpu_ms() - cpu0);
    std::printf("[%lld] loss: %.3f\n", static_cast<long long>(step), loss_value);
    std::fflush(stdout);
    if (log) {
      json::Value rec = json::Value::object();
      rec.set("step", step);
      rec.set("loss", loss_value);
      rec.set("step_ms", ms);
      rec.set("forward_ms", forward_ms.back());
      rec.set("backward_ms", backward_ms.back());
      rec.set("step_cpu_ms", step_cpu_ms.back());
      rec.set("rss_mb", mib(current_rss_bytes()));
      rec.set("peak_rss_mb", mib(peak_rss_bytes()));
      rec.set("device_peak_bytes", device_peaks(o));
      if (gem) {
        const gemini::GeminiStats g = gem->take_step_stats();
        rec.set("host_chunk_peak_bytes", g.host_chunk_peak_bytes);
        rec.set("h2d_bytes", g.h2d_bytes);
        rec.set("d2h_bytes", g.d2h_bytes);
        rec.set("nvme_read_bytes", g.nvme_read_bytes);
        rec.set("nvme_write_bytes", g.nvme_write_bytes);
        rec.set("evictions", g.evictions);
        rec.set("prefetch_wait_ms", g.prefetch_wait_ms);
        rec.set("illegal_transitions", gem->illegal_transitions());
      }
      *log << rec.dump() << "\n";
      log->flush();
      if (!log->good() && !log_failed) {  // reported now; the run goes on to save the model
        log_failed = true;
        std::fprintf(stderr,
                     "gpt2_train: error: writing --log '%s' failed at step %lld (%s); "
                     "training continues, the run will exit 1\n",
                     o.log.c_str(), static_cast<long long>(step), errno_text(errno).c_str());
      }
    }
  }
  if (hybrid) hybrid->flush();  // the last write-backs, and any failure among them
  const double total_s = std::chrono::duration<double>(clock::now() - t_start).count();
  if (!o.save.empty()) {  // the model first, before anything optional
    if (gem)              // disk-homed chunks are read in for the save
      gem->with_parameters_readable([&] { gpt2::save_hf(model, o.save, saved_config); });
    else
      gpt2::save_hf(model, o.save, saved_config);
    std::printf("Saved to %s\n", o.save.c_str());
  }
  std::printf("Time: %.3f s\n", total_s);
  std::printf("Mem usage: %.0f MB\n", mib(current_rss_bytes()));
  const double med = cli::median(step_ms);
  std::printf("Peak RSS: %.0f MiB | median step: %.1f ms | %.0f tokens/s | threads: %d\n",
              mib(peak_rss_bytes()), med, med > 0 ? 1000.0 * o.batch * o.seq / med : 0.0,
              num_threads());
  const AllocatorStats host = allocator_for(Device::cpu()).stats();
  std::printf(
      "Host allocator: peak %.0f MiB in use, %.0f MiB in use now, %.0f MiB cached | "
      "optimizer state in memory: %.0f MiB (%s)\n",
      mib(host.peak_bytes), mib(host.current_bytes), mib(host.cached_bytes),
      mib(opt->state_bytes_in_memory()), opt->name().c_str());
  if (o.device.is_sim()) {
    const AllocatorStats sim = allocator_for(o.device).stats();
    std::printf("%s: peak %.0f MiB of %.0f MiB capacity\n", o.device.str().c_str(),
                mib(sim.peak_bytes), mib(sim.capacity_bytes));
  }
  if (gem) {
    const gemini::GeminiStats& g = gem->run_stats();
    std::printf(
        "Gemini: %.1f MiB host->device (%lld gathers), %.1f MiB device->host, %lld evictions, "
        "host chunk peak %.1f MiB, %lld illegal state transitions\n",
        mib(g.h2d_bytes), static_cast<long long>(g.gathers), mib(g.d2h_bytes),
        static_cast<long long>(g.evictions), mib(g.host_chunk_peak_bytes),
        static_cast<long long>(gem->illegal_transitions()));
    if (trace) {
      trace->write(o.trace);
      std::printf("Trace: %zu events in %s\n", trace->size(), o.trace.c_str());
    }
  }
  if (hybrid && hybrid->nvme()) {
    const optim::NvmeStats st = hybrid->nvme()->stats();
    const double gb = 1e9;
    std::printf(
        "NVMe: read %.3f GB, written %.3f GB | %.2f GB/s read, %.2f GB/s written over the "
        "run | updater waited for reads %.0f ms (hidden behind backward), step() waited for the "
        "updater %.0f ms, backward waited for the row split %.0f ms (both exposed) | staging %.0f "
        "MiB, file %.0f MiB, borrowed gradient slots "
        "%.0f MiB, %lld spare-slot slices, %lld transfers into registered slots | row split: %lld "
        "rows, held pages %.1f MiB max | "
        "gradients "
        "waiting for the updater %.0f MiB max\n",
        st.bytes_read / gb, st.bytes_written / gb, st.bytes_read / gb / total_s,
        st.bytes_written / gb / total_s, st.consumer_wait_ms, st.flush_wait_ms, st.join_wait_ms,
        mib(st.staging_bytes), mib(st.file_bytes), mib(st.borrowed_bytes_max),
        static_cast<long long>(st.spare_slices), static_cast<long long>(st.fixed_transfers),
        static_cast<long long>(st.split_rows), mib(st.held_bytes_max),
        mib(st.queued_grad_bytes_max));
    if (!o.nvme_timeline.empty()) {
      std::ofstream csv(o.nvme_timeline);
      MW_CHECK_T(IoError, csv.good(), "--nvme-timeline '", o.nvme_timeline, "' cannot be written");
      csv << "param,offset,numel,read_issue_ms,read_done_ms,compute_start_ms,compute_end_ms,"
             "write_issue_ms,write_done_ms,spare\n";
      for (const auto& t : hybrid->nvme()->last_timeline())
        csv << t.param << ',' << t.offset << ',' << t.numel << ',' << t.read_issue_ms << ','
            << t.read_done_ms << ',' << t.compute_start_ms << ',' << t.compute_end_ms << ','
            << t.write_issue_ms << ',' << t.write_done_ms << ',' << t.spare << '\n';
      for (const auto& [name, ms] : phase_ms) csv << "# " << name << ' ' << ms << '\n';
    }
  }
  if (!o.save_optimizer.empty()) {
    hybrid->save_state(o.save_optimizer);
    std::printf("Saved optimizer state to %s\n", o.save_optimizer.c_str());
  }
  std::printf("Median forward (with loss): %.1f ms | backward: %.1f ms | step CPU time: %.1f ms\n",
              cli::median(forward_ms), cli::median(backward_ms), cli::median(step_cpu_ms));
  if (offloader) {
    offloader->wait_idle();
    auto st = offloader->stats();
    std::printf(
        "Activation offload: %.0f MiB to host, %.0f MiB back | %lld offloaded, %lld kept, "
        "%lld prefetch hits, %lld waits, %lld sync fetches, %lld cancelled | unpack wait "
        "%.0f ms\n",
        mib(st.to_host_bytes), mib(st.to_device_bytes), static_cast<long long>(st.offloaded),
        static_cast<long long>(st.kept), static_cast<long long>(st.prefetch_hits),
        static_cast<long long>(st.prefetch_waits), static_cast<long long>(st.sync_fetches),
        static_cast<long long>(st.cancelled), st.unpack_wait_ms);
  }
  return log_failed ? 1 : 0;
}

}  // namespace
}  // namespace mw

int main(int argc, char** argv) {
  mw::install_stop_signal_handlers();  // Note [Stop signals]
  mw::cli::Parser parser = mw::make_parser();
  bool parsed = false;  // a bad command line is exit 2 with the usage; a failed run is exit 1
  try {
    parser.parse(argc, argv);
    if (parser.help_requested()) {
      std::cout << parser.usage();
      return 0;
    }
    const mw::Options options = mw::parse_options(parser);
    parsed = true;
    return mw::run(options);
  } catch (const mw::Interrupted& e) {
    std::cerr << "gpt2_train: " << e.what() << "\n";
    return e.exit_code();
  } catch (const mw::InvalidArgument& e) {
    if (parsed) {
      std::cerr << "gpt2_train: error: " << e.what() << "\n";
      return 1;
    }
    std::cerr << parser.usage() << "\ngpt2_train: " << e.what() << "\n";
    return 2;
  } catch (const mw::Error& e) {
    std::cerr << "gpt2_train: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "gpt2_train: internal error: " << e.what() << "\n";
    return 1;
  } catch (...) {
    std::cerr << "gpt2_train: internal error: an unknown exception\n";
    return 1;
  }
}
