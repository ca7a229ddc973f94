// gpt2_train: trains GPT-2 with the shifted cross-entropy loss, reproducing the ColossalAI documents'
// examples (REFERENCES.md) and printing their lines: "Model numel", "[i] loss", "Time", "Mem usage".
// Then peak RSS, median step time and throughput; optionally a JSON-lines log of every step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>

#include <sys/resource.h>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "cli.h"
#include "core/allocator.h"
#include "core/parallel.h"
#include "data/json.h"
#include "data/random_tokens.h"
#include "data/token_shard.h"
#include "models/gpt2/hf_io.h"
#include "models/gpt2/model.h"
#include "nn/checkpoint.h"
#include "offload/activation/activation_offload.h"
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
  // Recomputation and activation offload (docs/recompute.md).
  bool checkpoint_every_block = false;
  int64_t checkpoint_segments = -1;  // -1: not segmented; 0: round(sqrt(n_layer))
  bool offload_activations = false;
};

cli::Parser make_parser() {
  cli::Parser p("gpt2_train",
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
  p.option("dropout", "", "dropout probability for embeddings, attention and residuals (default: "
                          "the config's, 0.1)");
  p.option("optimizer", "hybridadam", "hybridadam|adamw (adamw is the plain scalar reference)");
  p.option("device", "cpu", "cpu | sim[:CAPACITY] (simulated accelerator, e.g. sim:4GiB)");
  p.flag("checkpoint-activations", "recompute every block's activations in backward");
  p.option("checkpoint-segments", "", "checkpoint_sequential over the blocks with K segments (the "
                                      "last not checkpointed); 0 = round(sqrt(n_layer))");
  p.flag("offload-activations", "copy saved activations to host memory in forward and prefetch them "
                                "back in backward (with checkpointing: the checkpoint inputs)");
  p.option("data", "", "llm.c token shard (.bin); default: seeded random tokens");
  p.option("log", "", "write one JSON object per step to this file");
  p.option("save", "", "save the trained model as a HuggingFace folder");
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
  } else if (dev != "cpu") {
    throw cli::UsageError(str("--device '", dev, "': expected cpu or sim[:CAPACITY] such as sim:4GiB"));
  }
  o.checkpoint_every_block = p.has("checkpoint-activations");
  if (p.given("checkpoint-segments")) o.checkpoint_segments = p.integer("checkpoint-segments", 0, 1 << 20);
  o.offload_activations = p.has("offload-activations");
  o.data = p.str("data");
  o.log = p.str("log");
  o.save = p.str("save");
  return o;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
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
  if (o.device.is_sim()) peaks.set(o.device.str(), allocator_for(o.device).stats().peak_bytes);
  return peaks;
}

int run(const Options& o) {
  set_num_threads(static_cast<int>(o.threads));
  if (o.device.is_sim()) set_sim_capacity(o.device.index, o.sim_capacity_bytes);

  gpt2::Config config = o.init_from.empty() ? gpt2::Config::preset(o.model)
                                            : gpt2::load_hf_config(o.init_from);
  if (o.dropout >= 0) config.set_dropout(o.dropout);
  MW_CHECK_T(InvalidArgument, o.seq <= config.n_positions, "--seq ", o.seq, " exceeds the model's ",
             config.n_positions, " positions; lower --seq");
  default_generator().manual_seed(o.seed);

  gpt2::GPT2 model(config, o.seed, DType::F32, o.device);
  if (!o.init_from.empty()) gpt2::load_hf_weights(model, o.init_from);
  std::printf("Model numel: %.3f B\n", static_cast<double>(model.num_parameters()) / (1 << 30));

  std::unique_ptr<data::TokenShard> shard;
  if (!o.data.empty()) {
    shard = std::make_unique<data::TokenShard>(o.data);
    shard->check_vocab(config.vocab_size);
  }

  std::unique_ptr<optim::Optimizer> opt;
  if (o.optimizer == "adamw") opt = std::make_unique<optim::AdamW>(model.parameters(), o.hyper);
  else opt = std::make_unique<optim::HybridAdam>(model.parameters(), optim::HybridAdamOptions{o.hyper});

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
    std::printf("Checkpointing %zu segments:%s (* = not checkpointed)\n", plan.size(), desc.c_str());
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
  model.train();
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  for (int64_t step = 0; step < o.steps; ++step) {
    const auto t0 = clock::now();
    const double cpu0 = process_cpu_ms();
    if (shard) shard->batch(step, o.batch, o.seq, tokens.data());
    else data::random_tokens(o.seed, step, o.batch, o.seq, config.vocab_size, tokens.data());
    Tensor ids = Tensor::from_vector(tokens, {o.batch, o.seq}, o.device);

    opt->zero_grad();
    const auto t_fwd = clock::now();
    Tensor logits, loss;
    {
      std::unique_ptr<offload::OffloadScope> offload_scope;
      if (offloader) offload_scope = std::make_unique<offload::OffloadScope>(*offloader);
      logits = model(ids);
      loss = shifted_cross_entropy(logits, ids);
    }
    logits = Tensor();  // the loss node holds the only reference: backward reuses the buffer
    const auto t_bwd = clock::now();
    backward(loss);
    const auto t_opt = clock::now();
    opt->step();
    forward_ms.push_back(std::chrono::duration<double, std::milli>(t_bwd - t_fwd).count());
    backward_ms.push_back(std::chrono::duration<double, std::milli>(t_opt - t_bwd).count());
    const double loss_value = loss.item();
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
      *log << rec.dump() << "\n";
      log->flush();
    }
  }
  const double total_s = std::chrono::duration<double>(clock::now() - t_start).count();
  std::printf("Time: %.3f s\n", total_s);
  std::printf("Mem usage: %.0f MB\n", mib(current_rss_bytes()));
  const double med = median(step_ms);
  std::printf("Peak RSS: %.0f MiB | median step: %.1f ms | %.0f tokens/s | threads: %d\n",
              mib(peak_rss_bytes()), med, med > 0 ? 1000.0 * o.batch * o.seq / med : 0.0,
              num_threads());
  std::printf("Median forward (with loss): %.1f ms | backward: %.1f ms | step CPU time: %.1f ms\n",
              median(forward_ms), median(backward_ms), median(step_cpu_ms));
  std::printf("Device peaks: %s | optimizer state in memory: %.0f MiB (%s)\n",
              device_peaks(o).dump().c_str(), mib(opt->state_bytes_in_memory()),
              opt->name().c_str());
  if (offloader) {
    offloader->wait_idle();
    auto st = offloader->stats();
    std::printf("Activation offload: %.0f MiB to host, %.0f MiB back | %lld offloaded, %lld kept, "
                "%lld prefetch hits, %lld waits, %lld sync fetches, %lld cancelled | unpack wait "
                "%.0f ms\n",
                mib(st.to_host_bytes), mib(st.to_device_bytes), static_cast<long long>(st.offloaded),
                static_cast<long long>(st.kept), static_cast<long long>(st.prefetch_hits),
                static_cast<long long>(st.prefetch_waits), static_cast<long long>(st.sync_fetches),
                static_cast<long long>(st.cancelled), st.unpack_wait_ms);
  }
  if (!o.save.empty()) {
    gpt2::save_hf(model, o.save);
    std::printf("Saved to %s\n", o.save.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace mw

int main(int argc, char** argv) {
  mw::cli::Parser parser = mw::make_parser();
  mw::Options options;
  try {
    parser.parse(argc, argv);
    if (parser.help_requested()) {
      std::cout << parser.usage();
      return 0;
    }
    options = mw::parse_options(parser);
  } catch (const mw::InvalidArgument& e) {
    std::cerr << parser.usage() << "\ngpt2_train: " << e.what() << "\n";
    return 2;
  }
  try {
    return mw::run(options);
  } catch (const mw::Error& e) {
    std::cerr << "gpt2_train: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "gpt2_train: internal error: " << e.what() << "\n";
    return 1;
  }
}
