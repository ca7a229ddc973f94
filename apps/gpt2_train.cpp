// gpt2_train: trains GPT-2 with the shifted cross-entropy loss, reproducing the ColossalAI
// documents' examples (docs/references.md) and printing their lines: "Model numel", "[i] loss",
// "Time", "Mem usage". The loop itself is the library's (train/trainer.h): this file parses the
// options, checks the outputs, drives a Trainer and prints its progress, evaluations and
// checkpoints, with an optional JSON-lines log of every step.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include "adam_options.h"
#include "autograd/autocast.h"
#include "cli.h"
#include "core/allocator.h"
#include "core/convert.h"
#include "core/cpu/fast_math.h"
#include "core/cpu/gemm_bf16.h"
#include "core/interrupt.h"
#include "core/process_limits.h"
#include "data/atomic_save.h"
#include "data/json.h"
#include "dist/communicator.h"
#include "dist_options.h"
#include "models/gpt2/hf_io.h"
#include "models/gpt2/spec.h"
#include "optim/adam_cpu.h"
#include "placement_options.h"
#include "test_hooks.h"
#include "train/json_log.h"
#include "train/progress.h"
#include "train/run_paths.h"
#include "train/trainer.h"

namespace mw {
namespace {

using train::TrainOptions;
using Options = train::TrainOptions;

// A warning about the command line, printed once: under mpirun by the process the launcher
// numbers 0 alone (options are parsed before the communicator exists; every rank printed them).
void warn(const std::string& text) {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (const char* rank = std::getenv(name); rank && std::atoi(rank) != 0) return;
  std::fprintf(stderr, "gpt2_train: warning: %s\n", text.c_str());
}

// --n-layer ... --n-positions: a GPT-2 of any shape from random weights (with --model or --config
// as the base).
const std::pair<const char*, const char*> kShapeOptions[] = {
    {"n-layer", "override the number of blocks"},
    {"n-head", "override the number of attention heads"},
    {"n-embd", "override the embedding width (a multiple of --n-head)"},
    {"vocab-size", "override the vocabulary size (the last id is <|endoftext|>)"},
    {"n-positions", "override the context length"}};

// "tiny (13,760 parameters) | small (124,439,808) | ...", from the presets themselves.
std::string preset_help() {
  std::string h = "preset:";
  for (const char* name : {"tiny", "small", "medium", "large", "xl"})
    h += str(std::string(name) == "tiny" ? " " : " | ", name, " (",
             format_thousands(gpt2::num_parameters(gpt2::Config::preset(name))),
             std::string(name) == "tiny" ? " parameters)" : ")");
  return h;
}

void parse_shape(const cli::Parser& p, Options& o) {
  int64_t* fields[] = {&o.n_layer, &o.n_head, &o.n_embd, &o.vocab_size, &o.n_positions};
  for (size_t i = 0; i < std::size(kShapeOptions); ++i) {
    const char* name = kShapeOptions[i].first;
    if (!p.given(name)) continue;
    MW_CHECK_T(cli::UsageError, o.init_from.empty(), "--", name,
               " changes the model's shape, so the --init-from weights would not fit; use it "
               "with --model or --config");
    *fields[i] = p.integer(name, 1, int64_t{1} << 24);
  }
}

// The schedule, clipping, accumulation and checkpoints (Note [LR schedule], Note [Updates after
// backward], Note [Checkpoint layout]).
void parse_loop(const cli::Parser& p, Options& o) {
  o.lr_schedule =
      train::parse_lr_schedule(p.choice("lr-schedule", {"constant", "cosine", "linear"}));
  o.warmup_steps = p.integer("warmup-steps", 0, int64_t{1} << 40);
  if (p.given("min-lr")) {
    MW_CHECK_T(cli::UsageError, o.lr_schedule != train::LrScheduleKind::kConstant,
               "--min-lr needs --lr-schedule cosine or linear (a constant schedule never decays)");
    o.min_lr = p.real("min-lr", 0, o.hyper.lr);
  }
  if (p.given("grad-clip")) o.grad_clip = p.real("grad-clip", 1e-12, 1e12);
  o.grad_accum = p.integer("grad-accum", 1, 1 << 20);
  o.checkpoint_dir = p.str("checkpoint-dir");
  o.resume = p.str("resume");
  for (const char* name : {"checkpoint-every", "keep"})
    MW_CHECK_T(cli::UsageError, !p.given(name) || !o.checkpoint_dir.empty(), "--", name,
               " needs --checkpoint-dir");
  if (p.given("checkpoint-every"))
    o.checkpoint_every = p.integer("checkpoint-every", 1, int64_t{1} << 40);
  if (p.given("keep")) o.keep = p.integer("keep", 1, 1 << 20);
}

void parse_data(const cli::Parser& p, Options& o) {
  o.data = p.str("data");
  o.shuffle = p.has("shuffle");
  MW_CHECK_T(cli::UsageError, !o.shuffle || !o.data.empty(),
             "--shuffle needs --data (random tokens have no order to shuffle)");
  MW_CHECK_T(cli::UsageError, !p.given("data-seed") || o.shuffle, "--data-seed needs --shuffle");
  o.data_seed =
      p.given("data-seed") ? static_cast<uint64_t>(p.integer("data-seed", 0, INT64_MAX)) : o.seed;
  o.val_data = p.str("val-data");
  o.eval_only = p.has("eval-only");
  MW_CHECK_T(
      cli::UsageError,
      !o.val_data.empty() || !(p.given("eval-every") || p.given("eval-batches") || o.eval_only),
      "--eval-every, --eval-batches and --eval-only need --val-data");
  MW_CHECK_T(cli::UsageError,
             !o.eval_only || !p.str("init-from").empty() || !p.str("resume").empty(),
             "--eval-only evaluates a trained model: pass --init-from DIR (a model folder, or a "
             "checkpoint's DIR/step_NNNNNN/model)");
  if (p.given("eval-every")) o.eval_every = p.integer("eval-every", 1, int64_t{1} << 40);
  o.eval_batches = p.integer("eval-batches", 1, 1 << 20);
  o.save_best = p.str("save-best");  // Note [Best model and early stopping]
  if (p.given("early-stop")) o.early_stop = p.integer("early-stop", 1, 1 << 20);
  MW_CHECK_T(
      cli::UsageError, !o.val_data.empty() || (o.save_best.empty() && o.early_stop == 0),
      "--save-best and --early-stop compare evaluations: pass --val-data (and --eval-every)");
  MW_CHECK_T(cli::UsageError, o.early_stop == 0 || o.eval_every > 0,
             "--early-stop counts evaluations: pass --eval-every N (without it the run evaluates "
             "once, after the last step)");
  // --eval-only with a training command's options (--resume asks for the first run's): the
  // outputs of training are not written, and saying so beats an output silently missing.
  std::string unwritten;
  MW_CHECK_T(cli::UsageError, !p.given("save-dtype") || p.given("save") || p.given("save-best"),
             "--save-dtype is the dtype of --save's and --save-best's weights: pass one of them");
  const std::string save_dtype = p.choice("save-dtype", {"fp32", "bf16", "fp16"});
  o.save_dtype = save_dtype == "bf16"   ? DType::BF16
                 : save_dtype == "fp16" ? DType::F16
                                        : DType::F32;
  for (const char* name : {"save", "save-optimizer", "checkpoint-dir", "trace", "nvme-timeline",
                           "sample-every", "save-best", "early-stop"})
    if (o.eval_only && p.given(name)) unwritten += str(unwritten.empty() ? "" : ", ", "--", name);
  if (!unwritten.empty())
    warn(str("--eval-only evaluates and exits: ", unwritten, " not acted on"));
}

// The tokenizer and --sample-every (Note [Sampling during training]).
void parse_tokenizer_and_sampling(const cli::Parser& p, Options& o) {
  o.vocab = p.str("vocab"), o.merges = p.str("merges"), o.tokenizer = p.str("tokenizer");
  o.save_run_dropout = p.has("save-run-dropout");
  MW_CHECK_T(cli::UsageError, !o.save_run_dropout || p.given("dropout"),
             "--save-run-dropout records --dropout: pass --dropout too");
  for (const char* name :
       {"sample-tokens", "sample-prompt", "sample-prompt-ids", "sample-temperature", "sample-seed"})
    MW_CHECK_T(cli::UsageError, !p.given(name) || p.given("sample-every"), "--", name,
               " needs --sample-every");
  if (!p.given("sample-every")) return;
  o.sample_every = p.integer("sample-every", 1, int64_t{1} << 40);
  o.sample_tokens = p.integer("sample-tokens", 1, 1 << 20);
  MW_CHECK_T(cli::UsageError, !p.given("sample-prompt") || !p.given("sample-prompt-ids"),
             "--sample-prompt and --sample-prompt-ids exclude each other");
  o.sample_prompt = p.str("sample-prompt");
  if (const std::string w = cli::escaped_newline_warning("sample-prompt", o.sample_prompt);
      !w.empty())
    warn(w);
  if (p.given("sample-prompt-ids"))
    o.sample_prompt_ids = cli::token_ids("sample-prompt-ids", p.str("sample-prompt-ids"));
  o.sampling.temperature = p.real("sample-temperature", 0, 100);
  o.sampling.seed = static_cast<uint64_t>(p.integer("sample-seed", 0, INT64_MAX));
}

// Options that would do nothing in the chosen mode are errors (issue #12: they were silently
// ignored).
void check_mode_options(const cli::Parser& p, const Options& o, bool nvme, bool gemini) {
  for (const char* name : {"fraction", "nvme-borrow", "nvme-timeline"})
    MW_CHECK_T(cli::UsageError, !p.given(name) || nvme, "--", name,
               " has no effect without --offload nvme");
  for (const char* name : {"nvme-dir", "nvme-window"})
    MW_CHECK_T(cli::UsageError, !p.given(name) || nvme || gemini, "--", name,
               " has no effect without --offload nvme or --gemini");
  MW_CHECK_T(cli::UsageError, !p.given("optimizer-states") || !gemini,
             "--optimizer-states has no effect with --gemini, whose policy places each chunk's "
             "Adam states (--offload-optim-frac, --gpu-margin-mem-ratio)");
  if (p.given("optimizer-states") && !o.device.is_sim())
    warn("--optimizer-states has no effect without --device sim");
}

// The model, the run's shape, the schedule and the optimizer.
void declare_model_and_loop(cli::Parser& p) {
  p.option("model", "small", preset_help());
  p.option("config", "",
           "a GPT-2 config.json (HF GPT2Config) to start from random weights; any shape");
  for (const auto& [name, help] : kShapeOptions) p.option(name, "", help);
  p.option("init-from", "", "HuggingFace folder (config.json + model.safetensors) to start from");
  p.option("batch", "4",
           "sequences per step (B); under mpirun the GLOBAL batch, split across the ranks (a "
           "multiple of their number)");
  p.option("seq", "", "tokens per sequence (T; default 128, or n_positions when smaller)");
  p.option("steps", "3", "training steps (with --resume: the run's total, as first given)");
  p.option("epochs", "",
           "instead of --steps: passes over --data (a fraction allowed); steps = ceil(epochs x "
           "sequences in --data / (batch x grad-accum))");
  p.option("seed", "0", "seed for initialisation, random data and dropout");
  p.option("threads", "0",
           "worker threads (0 = all cores this process may use: affinity, CPU quota)");
  p.option("lr", "1e-3", "learning rate (the peak of a schedule)");
  p.option("lr-schedule", "constant",
           "constant|cosine|linear: linear warmup from 0 over --warmup-steps, then constant, or "
           "decay to --min-lr at --steps (as HF transformers' schedules)");
  p.option("warmup-steps", "0", "steps of linear warmup from 0 to --lr");
  p.option("min-lr", "", "--lr-schedule cosine|linear: the learning rate reached at --steps (0)");
  p.option("grad-clip", "",
           "clip the global L2 norm of all gradients to this (torch clip_grad_norm_)");
  p.option("grad-accum", "1", "micro-batches of --batch per step (their loss averaged)");
  declare_adam(p);
  p.option("dropout", "",
           "dropout probability for embeddings, attention and residuals (default: "
           "the config's, 0.1)");
  p.option("optimizer", "hybridadam", "hybridadam|adamw (adamw is the plain scalar reference)");
  p.option("device", "cpu",
           "cpu | sim[:CAPACITY] (simulated accelerator, e.g. sim:4GiB) | cuda[:N][:CAPACITY] (a "
           "GPU, in a CUDA build; CAPACITY caps what the run may use of it, e.g. cuda:768MiB)");
}

// Activation memory, the data, evaluation, checkpoints, outputs and NVMe offload.
void declare_memory_data_and_outputs(cli::Parser& p) {
  p.flag("checkpoint-activations", "recompute every block's activations in backward");
  p.option("checkpoint-segments", "",
           "checkpoint_sequential over the blocks with K segments (the "
           "last not checkpointed); 0 = round(sqrt(n_layer))");
  p.flag("offload-activations",
         "copy saved activations to host memory in forward and prefetch them "
         "back in backward (with checkpointing: the checkpoint inputs)");
  p.option("data", "",
           "training tokens: an llm.c shard, a directory of train_*.bin shards or a glob, read in "
           "order for as many epochs as needed (default: seeded random tokens)");
  p.flag("shuffle", "read --data in a random order of --seq windows, a new one each epoch");
  p.option("data-seed", "", "--shuffle: the seed of the order (default --seed)");
  p.option("val-data", "", "validation tokens: a shard, a directory of val_*.bin, or a glob");
  p.option("eval-every", "",
           "with --val-data: evaluate every N steps (and after the last; default: only then)");
  p.option("eval-batches", "20", "with --val-data: batches of --batch x --seq per evaluation");
  p.flag("eval-only", "evaluate the model (--init-from DIR) on --val-data and exit");
  p.option("save-best", "",
           "with --val-data: after each evaluation with the lowest val loss so far, save the model "
           "there (a HuggingFace folder)");
  p.option("early-stop", "",
           "with --eval-every: stop after N evaluations in a row without a lower val loss");
  p.option("checkpoint-dir", "",
           "write resumable checkpoints DIR/step_NNNNNN (model, optimizer, data position, RNG)");
  p.option("checkpoint-every", "", "with --checkpoint-dir: every N steps (and after the last)");
  p.option("keep", "", "with --checkpoint-dir: keep only the newest K checkpoints");
  p.option("resume", "",
           "resume from the newest checkpoint in DIR (or a step_NNNNNN folder), bit for bit; pass "
           "the first run's options");
  p.option("log", "", "write one JSON object per step to this file");
  p.option("save", "", "save the trained model as a HuggingFace folder");
  p.option("save-dtype", "fp32",
           "fp32|bf16|fp16: the dtype of the weights --save and --save-best write (half the "
           "bytes in bf16/fp16, rounded once; checkpoints stay fp32)");
  p.option("offload", "none", "none|nvme: keep HybridAdam's m and v on disk between steps");
  p.option("fraction", "1.0", "with --offload nvme: fraction of parameter elements offloaded");
  p.option("nvme-dir", "", "directory for offloaded states (default: a private temporary one)");
  p.option("nvme-window", "32MiB", "RAM for states in flight (read ahead / update / write back)");
  p.option("save-optimizer", "", "after training, save the optimizer state to this file");
  p.option("load-optimizer", "", "before training, load the optimizer state from this file");
}

// The tokenizer, sampling during training, data parallel, and the memory plan.
void declare_tokenizer_sampling_and_checks(cli::Parser& p) {
  p.option("vocab", "",
           "the tokenizer's vocab.json, with --merges (default: --init-from's, or the one "
           "gpt2_tokenize wrote beside the --data shards)");
  p.option("merges", "", "the tokenizer's merges.txt, with --vocab");
  p.option("tokenizer", "", "the tokenizer's tokenizer.json (instead of --vocab/--merges)");
  p.flag("save-run-dropout", "--save records the run's --dropout (default: the config's)");
  p.option("sample-every", "", "print a sample from the model every N steps");
  p.option("sample-tokens", "32", "with --sample-every: new tokens per sample");
  p.text_option("sample-prompt", "",
                "with --sample-every: text to continue (needs a tokenizer; default <|endoftext|>)");
  p.option("sample-prompt-ids", "", "with --sample-every: token ids to continue, e.g. 464,3290");
  p.option("sample-temperature", "1.0", "with --sample-every: softmax temperature; 0 is greedy");
  p.option("sample-seed", "0", "with --sample-every: the sampler's seed (apart from --seed)");
  p.flag("plan", "print the memory plan (host, device, disk) and exit without allocating");
  p.flag("skip-memory-check",
         "expert: run even when the memory plan exceeds what the machine has (the plan is an "
         "estimate within about 10%, docs/reliability.md)");
}

cli::Parser make_parser() {
  cli::Parser p(
      "gpt2_train",
      "Trains GPT-2 on the CPU, a CUDA GPU or the simulated accelerator, alone or under mpirun;\n"
      "prints the ColossalAI documents' lines (Model numel, [i] loss, Time, Mem usage).");
  declare_model_and_loop(p);
  declare_memory_data_and_outputs(p);
  declare_placement(p);
  declare_tokenizer_sampling_and_checks(p);
  declare_dist(p);
  return p;
}

// Options that cannot work together, found once everything is parsed.
void check_combinations(const Options& o) {
  MW_CHECK_T(cli::UsageError, o.resume.empty() || o.load_optimizer.empty(),
             "--resume restores the optimizer itself; drop --load-optimizer");
  MW_CHECK_T(cli::UsageError, o.gemini_options.gpu_margin_mem_ratio == 0 || o.zero_stage < 2,
             "--gpu-margin-mem-ratio does not work with --zero 2|3 (sharded chunks stay homed "
             "where ZeRO puts them); drop one of them");
}

Options parse_options(const cli::Parser& p) {
  Options o;
  o.init_from = p.str("init-from");
  o.config_path = p.str("config");
  o.model = p.choice("model", {"tiny", "small", "medium", "large", "xl"});
  MW_CHECK_T(cli::UsageError, o.init_from.empty() || o.config_path.empty(),
             "--init-from and --config both choose the model: pass one of them");
  if (p.given("model") && (!o.init_from.empty() || !o.config_path.empty()))
    warn(str("--model is ignored: the model comes from ",
             o.init_from.empty() ? "--config" : "--init-from"));
  parse_shape(p, o);
  o.batch = p.integer("batch", 1, 1 << 20);
  o.seq = p.given("seq") ? p.integer("seq", 2, 1 << 20) : 0;  // 0: the Trainer's default
  o.steps = p.integer("steps", 0, int64_t{1} << 40);
  if (p.given("epochs")) {  // Note [Epochs]
    MW_CHECK_T(cli::UsageError, !p.given("steps"),
               "--epochs and --steps both set the run's length: pass one of them");
    o.epochs = p.real("epochs", 1e-9, 1e9);
    MW_CHECK_T(cli::UsageError, p.given("data"),
               "--epochs counts passes over --data: pass --data (or --steps for random tokens)");
  }
  o.seed = static_cast<uint64_t>(p.integer("seed", 0, INT64_MAX));
  o.threads = p.integer("threads", 0, 4096);
  o.hyper.lr = static_cast<float>(p.real("lr", 0, 10));
  // The default is the ColossalAI example's rate for random weights, ten to a hundred times the
  // rates fine-tuning recipes use on pretrained ones.
  if (!p.given("lr") && p.given("init-from") && !p.has("eval-only"))
    warn(
        "--init-from without --lr trains at the default 1e-3, the ColossalAI example's rate for "
        "random weights; fine-tuning pretrained weights usually takes 1e-5 to 1e-4 (HF Trainer's "
        "default is 5e-5): pass --lr");
  parse_loop(p, o);
  parse_adam(p, o);
  if (p.given("dropout")) o.dropout = p.real("dropout", 0, 0.99);
  o.optimizer = p.choice("optimizer", {"hybridadam", "adamw"});
  o.update_in_backward = p.choice("update-in-backward", {"on", "off"}) == "on";
  o.states_on_host = p.choice("optimizer-states", {"host", "device"}) == "host";
  parse_device_option(p, o);
  o.checkpoint_every_block = p.has("checkpoint-activations");
  if (p.given("checkpoint-segments"))
    o.checkpoint_segments = p.integer("checkpoint-segments", 0, 1 << 20);
  o.offload_activations = p.has("offload-activations");
  if (o.offload_activations && o.device.is_cpu())  // every activation stays, as without it
    warn(
        "--offload-activations has no effect on --device cpu: activations are in host memory "
        "already (--checkpoint-activations saves memory there)");
  parse_data(p, o);
  o.log = p.str("log");
  o.save = p.str("save");
  const bool nvme = p.choice("offload", {"none", "nvme"}) == "nvme";
  const std::string policy = p.choice("gemini", {"none", "static", "auto", "const"});
  check_mode_options(p, o, nvme, policy != "none");
  parse_offload(p, o, nvme, policy);
  o.trace = p.str("trace");
  MW_CHECK_T(cli::UsageError, o.trace.empty() || policy != "none", "--trace needs --gemini");
  o.save_optimizer = p.str("save-optimizer");
  o.load_optimizer = p.str("load-optimizer");
  o.nvme_timeline = p.str("nvme-timeline");
  o.plan_only = p.has("plan");
  o.skip_memory_check = p.has("skip-memory-check");
  parse_precision_options(p, o);
  parse_tokenizer_and_sampling(p, o);
  check_combinations(o);
  return o;
}

bool g_print = true;  // false on ranks other than 0: rank 0 alone prints

void print(const std::string& text) {
  if (!g_print) return;
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

// "val loss 5.123 | perplexity 167.8 (20 batches)", logged as {"step", "val_loss", "val_ppl"};
// in training, --save-best and --early-stop follow. True: --early-stop ends the run.
bool report_eval(train::Trainer& t, train::JsonLog& log, bool tty, bool training = true) {
  const train::EvalResult e = t.evaluate();
  const train::BestVerdict best = training ? t.keep_best(e) : train::BestVerdict{};
  print(str(tty ? "\n" : "", "[", t.step(), "] val loss: ", format_fixed(e.loss, 3),
            " | perplexity: ", format_fixed(e.perplexity, 2), " (", e.batches,
            e.batches == 1 ? " batch)" : " batches)", best.text, "\n"));
  json::Value record = train::eval_record(t.step(), e);
  if (best.best) record.set("best", true);  // saved by --save-best (tools/loss_curve_svg.py)
  log.write(record, t.step());
  if (!training) print(t.peaks_text());  // --eval-only: beside its plan's
  return best.stop;
}

// Under Gemini in one process --update-in-backward only chooses whether --grad-accum updates
// chunks in the last micro-batch's backward (Note [Updates in the last backward]) or at the step;
// under data parallel it also chooses whether chunks are updated as their reductions complete
// (Note [Updates as reductions complete]), so the warning waits for the communicator (it said "no
// effect" under mpirun, where there was one, and from every rank).
void warn_if_update_in_backward_is_inert(const cli::Parser& p, const Options& o) {
  const bool gemini = !o.gemini.empty();
  if (!p.given("update-in-backward")) return;
  if (o.optimizer == "adamw" || (gemini && o.grad_accum == 1 && !o.data_parallel()))
    warn(str("--update-in-backward has no effect with ",
             gemini ? "--gemini in one process without --grad-accum (it steps chunks)"
                    : "--optimizer adamw"));
}

// After a step: the checkpoint due, or the stop a signal asked for (with --checkpoint-dir, after
// writing that step's checkpoint). Under data parallel the ranks agree whether any of them was
// asked to stop (Note [Stop signals]; docs/distributed.md), so that all of them stop after, and
// checkpoint, the same step. `last`: --early-stop ends the run after this step.
// `sig`: the stop signal the ranks agreed on after this step (Trainer::stop_signal_of_any_rank).
void checkpoint_or_stop(train::Trainer& t, const Options& o, int64_t step, bool tty, int sig,
                        bool last) {
  if (!t.checkpoint_due() && sig == 0 && !last) return;
  // Without --checkpoint-dir there is nothing to write: stop after the step. (The checkpoint
  // went to the current directory, where the signal interrupted its own first write.) After the
  // last step the run's saves follow, and a stop signal lets them finish (run()).
  if (o.checkpoint_dir.empty() && (t.done() || last)) return;
  if (o.checkpoint_dir.empty())
    throw Interrupted(str("interrupted by ", signal_name(sig), " after step ", step,
                          " (no --checkpoint-dir: nothing saved); temporary files removed, "
                          "earlier saves left as they were"),
                      sig);
  // Rank 0 writes it; under ZeRO the other ranks send it their optimizer states.
  const std::string path = t.save_checkpoint();
  print(str(tty ? "\n" : "", "Checkpoint: ", path, "\n"));
  if (t.done() || last) return;  // the saves follow
  if (const int now = sig != 0 ? sig : t.stop_signal_of_any_rank(stop_signal()))
    throw Interrupted(str("interrupted by ", signal_name(now), " during step ", step,
                          ": finished it and wrote the checkpoint ", path,
                          "; continue with the same options and --resume ", o.checkpoint_dir),
                      now);
}

// Before anything is built. Outputs first: a typo in any output path, or two outputs on one path,
// or an output on an input, fails now, not after training (Note [Outputs apart];
// docs/reliability.md). The kernels' overrides (MW_F32_ISA, MW_ADAM_ISA, MW_CONVERT_ISA,
// MW_BF16_GEMM) are read
// now too: a typo in one failed at the model's first op.
void check_before_building(const Options& o) {
  train::check_run_paths(o);
  (void)ops::f32_isa();
  (void)optim::best_isa();
  (void)best_convert_isa();
  (void)ops::bf16_gemm_kernel();
}

int run(const Options& o) {
  check_before_building(o);
  g_print = !o.comm || o.comm->rank() == 0;
  train::Trainer t(o, print);
  if (t.planned_only()) return 0;
  const bool root = t.is_root();  // alone writes the log, checkpoints and --save
  train::JsonLog log(root ? o.log : "", t.first_step());
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  if (o.eval_only) {
    report_eval(t, log, false, false);
    return log.failed() ? 1 : 0;
  }
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  throw_if_stop_requested("before the first step");
  // Note [Stop signals]: with checkpoints, a stop signal lets the step under way finish.
  std::optional<StopDeferral> deferral;
  if (!o.checkpoint_dir.empty()) deferral.emplace();
  // --steps 0 (or a resume with none left): the evaluation "after the last step" is of the model
  // as it starts (it was skipped with the loop, silently).
  if (t.done() && t.eval_due()) report_eval(t, log, tty);
  // A resume from a step whose evaluation a stop signal skipped makes it up (Note [Stop signals]).
  bool stopped = t.missed_evaluation() && report_eval(t, log, tty);
  if (stopped) print(t.early_stop_text());
  while (!stopped && !t.done()) {
    const train::StepResult r = t.train_step();
    exit_if_test_asks(o.comm ? o.comm->rank() : 0, r.step);
    const std::string line =
        train::progress_text(r, t.total_steps(), cli::median(t.step_ms()), t.memory_text());
    if (tty)  // redrawn in place; "\033[K" clears what a longer line left
      print("\r" + line + "\033[K");
    else
      print(str("[", r.step, "] loss: ", format_fixed(r.loss, 3), "\n", line, "\n"));
    if (r.skipped)
      print(str(tty ? "\n" : "", "[", r.step, "] skipped: inf/nan gradients; weights unchanged, ",
                "loss scale now ", format_fixed(r.loss_scale, 0), "\n"));
    log.write(train::step_record(t, r), r.step);
    // Collective: ZeRO 3's evaluating and sampling, --save-best's and --early-stop's verdict. The
    // ranks skip them on the signal they agree on (alone, one paired its agreement with their
    // verdict: a worse model saved as the best, the checkpoint lost; until session 38).
    const int sig = t.stop_signal_of_any_rank(stop_signal());
    const bool go_on = sig == 0 || t.shards_parameters();
    const bool early = t.eval_due() && go_on && report_eval(t, log, tty);
    if (t.sample_due() && go_on) print(str(tty ? "\n" : "", t.sample()));
    checkpoint_or_stop(t, o, r.step, tty, sig, early);
    if (early) {
      print(t.early_stop_text());
      break;
    }
  }
  // Note [Stop signals]: the trained model is the run's product. A first stop signal after the
  // last step (or in it, with --checkpoint-dir) or during the saves lets --save and
  // --save-optimizer finish (a second exits at once, as ever); the run then exits 128 + the
  // signal without its report. It discarded them: a cluster's SIGTERM at the time limit, after
  // hours of training, left nothing without --checkpoint-dir.
  if (!deferral) deferral.emplace();
  if (tty) print("\n");
  t.flush();
  const double total_s = std::chrono::duration<double>(clock::now() - t_start).count();
  if (!o.save.empty()) {  // the model first, before anything optional; rank 0 writes it
    t.save_model(o.save, o.save_dtype);
    const char* dtype = o.save_dtype == DType::BF16 ? " (bf16 weights)" : " (fp16 weights)";
    print(str("Saved to ", o.save, o.save_dtype == DType::F32 ? "" : dtype, "\n"));
  }
  if (const train::BestValidation& b = t.best_validation(); !o.save_best.empty() && b.step >= 0)
    print(str("Best model: val loss ", format_fixed(b.loss, 3), " at step ", b.step, ", in ",
              o.save_best, "\n"));
  t.save_optimizer_output();  // under ZeRO every rank sends its optimizer states to rank 0
  t.await_root_saves();
  deferral.reset();
  if (const int sig = stop_signal())
    throw Interrupted(str("interrupted by ", signal_name(sig), " after the last step: finished ",
                          o.save.empty() && o.save_optimizer.empty() ? "the run" : "its saves",
                          " first; the report is left out"),
                      sig);
  if (!root) return 0;
  print(t.finish_report(total_s));
  print(t.data_parallel_report());
  return log.failed() ? 1 : 0;
}

}  // namespace
}  // namespace mw

int main(int argc, char** argv) {
  mw::install_stop_signal_handlers();  // Note [Stop signals]
  mw::raise_open_file_limit();         // Note [Open files]: a shard per file, all open
  mw::cli::Parser parser = mw::make_parser();
  bool parsed = false;  // a bad command line is exit 2 with the usage; a failed run is exit 1
  std::shared_ptr<mw::dist::Communicator> comm;
  // On any failure: this rank's collectives are given up (Note [Collective timeouts]) and its
  // messages name the rank when there are several.
  auto failing = [&]() -> std::string {
    if (!comm || comm->size() == 1) return "";
    comm->abandon();
    return "rank " + std::to_string(comm->rank()) + ": ";
  };
  // One write per message: std::cerr writes each << at once, and under mpirun the ranks' pieces
  // interleaved in the launcher's output ("gpt2_train: rank 0: gpt2_train: interrupted...").
  auto say = [](const std::string& line) {
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
  };
  try {
    parser.parse(argc, argv);
    if (parser.help_requested()) {
      std::cout << parser.usage();
      return 0;
    }
    mw::Options options = mw::parse_options(parser);
    const mw::dist::CommOptions comm_options = mw::parse_dist(parser, options);
    parsed = true;
    comm = mw::dist::make_communicator(comm_options);
    options.comm = comm;
    mw::warn_if_update_in_backward_is_inert(parser, options);
    for (const std::string& w : mw::one_process_dist_warnings(parser, options)) mw::warn(w);
    return mw::run(options);
  } catch (const mw::Interrupted& e) {
    say("gpt2_train: " + failing() + e.what() + "\n");
    return e.exit_code();
  } catch (const mw::InvalidArgument& e) {
    if (parsed) {
      say("gpt2_train: " + failing() + "error: " + e.what() + "\n");
      return 1;
    }
    say(parser.usage() + "\ngpt2_train: " + e.what() + "\n");
    return 2;
  } catch (const mw::Error& e) {
    say("gpt2_train: " + failing() + "error: " + e.what() + "\n");
    return 1;
  } catch (const std::exception& e) {
    say("gpt2_train: " + failing() + "internal error: " + e.what() + "\n");
    return 1;
  } catch (...) {
    say("gpt2_train: " + failing() + "internal error: an unknown exception\n");
    return 1;
  }
}
