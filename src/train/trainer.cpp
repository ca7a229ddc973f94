// The Trainer: setup, one optimizer update, evaluation, checkpoints and resume (trainer.h).
#include "train/trainer.h"

#include <sys/resource.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "autograd/autocast.h"
#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "core/allocator.h"
#include "core/interrupt.h"
#include "core/numbers.h"
#include "core/parallel.h"
#include "data/random_tokens.h"
#include "dist/launch.h"
#include "models/gpt2/hf_io.h"
#include "models/gpt2/spec.h"
#include "nn/checkpoint.h"
#include "optim/grad_norm.h"
#include "train/data_parallel.h"
#include "train/memory_plan.h"
#include "train/save_room.h"

namespace mw::train {

namespace {

using clock = std::chrono::steady_clock;

double ms_since(clock::time_point t) {
  return std::chrono::duration<double, std::milli>(clock::now() - t).count();
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

// The ranks of this job on this machine, from the launcher (Note [Launchers], dist/launch.h);
// unknown: all of them, the safe answer for the host check on one machine.
int64_t ranks_on_this_host(int64_t ranks) {
  const int64_t n = dist::launch_from_environment().local_size;
  return n >= 1 && n <= ranks ? n : ranks;
}

// The memory plan's view of the run.
PlanInputs plan_inputs(const TrainOptions& o, const gpt2::Config& config) {
  PlanInputs in;
  in.config = config;
  in.batch = o.batch, in.seq = o.seq;
  in.precision = o.precision;
  in.adamw = o.optimizer == "adamw";
  // Under data parallel only Gemini steps in backward (Note [Updates as reductions complete]).
  in.update_in_backward = o.steps_in_backward() && (!o.data_parallel() || !o.gemini.empty());
  in.micro_batches = o.grad_accum;
  in.states_on_host = o.states_on_host;
  in.nvme_fraction = o.nvme.fraction;
  in.nvme_window_bytes = o.gemini.empty() ? o.nvme.window_bytes : o.gemini_nvme_window_bytes;
  in.nvme_slice_numel = o.nvme.slice_numel;
  in.nvme_dir = o.gemini.empty() ? o.nvme.dir : o.gemini_options.nvme_dir;
  in.device = o.device;
  // A GPU's capacity is its memory as its allocator reports it (cudaMemGetInfo's total).
  in.device_capacity_bytes = o.device.is_cuda() ? allocator_for(o.device).stats().capacity_bytes
                                                : o.device_capacity_limit_bytes;
  in.checkpoint_every_block = o.checkpoint_every_block;
  in.checkpoint_segments = o.checkpoint_segments;
  in.offload_activations = o.offload_activations;
  in.eval_only = o.eval_only;
  in.gemini = !o.gemini.empty();
  in.gemini_options = o.gemini_options;
  set_low_copies(o, config, in.gemini_options);  // Note [16-bit copies]
  if (o.sample_every > 0) {                      // a text prompt has at most one token per byte
    in.sample_tokens = o.sample_tokens;
    const size_t prompt = !o.sample_prompt_ids.empty()
                              ? o.sample_prompt_ids.size()
                              : std::max<size_t>(1, o.sample_prompt.size());
    in.sample_context = static_cast<int64_t>(prompt) + o.sample_tokens;
  }
  if (o.data_parallel()) {
    in.ranks = o.comm->size();
    in.zero_stage = o.zero_stage;
    in.gemini_options.shard_param_frac = o.gemini_shard_param_frac();
    in.bucket_bytes = o.bucket_bytes;
    in.ranks_on_host = ranks_on_this_host(in.ranks);
    in.collectives_on_device = o.comm->required_memory().has_value();
  }
  in.offload_in_flight_bytes = offload_window_bytes(in);  // Note [Offload window]
  return in;
}

// Prints the memory plan; stops before anything is allocated when it does not fit (Note
// [Activation arithmetic], train/memory_plan.h). Returns true for --plan.
bool memory_plan(const TrainOptions& o, const gpt2::Config& config, const Trainer::Print& print) {
  const PlanInputs in = plan_inputs(o, config);
  const MemoryPlan plan = plan_memory(in);
  const AvailableMemory avail = available_memory(in.nvme_dir);
  const std::vector<SaveNeed> saves = save_needs(o, config);  // Note [Room for the saves]
  const auto check = [&] {
    check_plan_fits(plan, in, avail);
    check_save_room(saves, avail.disk_path, plan.disk_bytes * plan.ranks_on_host);
  };
  print(plan.table() + save_needs_text(saves) + available_text(avail, plan.disk_bytes));
  if (o.plan_only) {
    try {
      check();
    } catch (const OutOfMemory& e) {
      print(str("  does not fit: ", e.what(), "\n"));
    }
    return true;
  }
  if (o.skip_memory_check)
    print("  --skip-memory-check: not checked against what the machine has\n");
  else
    check();
  return false;
}

// Why updates wait for the step, for the line that says so (it blamed --grad-clip/fp16 when
// --update-in-backward off, with --grad-accum, was the reason).
std::string why_updates_wait(const TrainOptions& o, bool data_parallel) {
  if (o.grad_clip > 0 || o.precision == DType::F16)
    return "--grad-clip/fp16 need every gradient first";
  if (data_parallel) return "data parallel averages the gradients first";
  return "--update-in-backward off";
}

}  // namespace

gpt2::Config resolve_config(const TrainOptions& o, const std::function<void(std::string)>& warn) {
  gpt2::Config c = !o.init_from.empty()     ? gpt2::load_hf_config(o.init_from, "--init-from")
                   : !o.config_path.empty() ? gpt2::Config::from_json_file(o.config_path)
                                            : gpt2::Config::preset(o.model);
  const std::string source = !o.init_from.empty() ? o.init_from + "/config.json" : o.config_path;
  for (const auto& key : c.unknown_fields)
    warn(str("warning: ", source, ": field \"", key, "\" is not a GPT2Config field; ignored"));
  const int64_t last_token = c.vocab_size - 1;  // before --vocab-size
  int64_t vocab = o.vocab_size;  // Note [A new model's vocabulary] (train/token_stream.h)
  if (vocab <= 0 && o.init_from.empty() && o.config_path.empty())
    if (const auto v = stamped_vocab_size(o.data); v && *v != c.vocab_size) {
      vocab = *v;
      warn(str("the --data shards' tokenizer has ", vocab, " tokens: a new model of ", vocab,
               " (--vocab-size overrides)"));
    }
  if (o.n_layer > 0) c.n_layer = o.n_layer;
  if (o.n_head > 0) c.n_head = o.n_head;
  if (o.n_embd > 0) c.n_embd = o.n_embd;
  if (vocab > 0) c.vocab_size = vocab;
  if (o.n_positions > 0) c.n_positions = o.n_positions;
  if (vocab > 0) {  // the last token is <|endoftext|>, as GPT-2's 50256
    for (int64_t* id : {&c.bos_token_id, &c.eos_token_id})
      *id = *id == last_token ? vocab - 1 : std::min(*id, vocab - 1);
    c.more_eos_token_ids.clear();  // ids of a vocabulary this model no longer has
  }
  c.validate();
  return c;
}

Trainer::Trainer(TrainOptions options, Print print) : o_(std::move(options)), print_(print) {
  if (!print_) print_ = [](const std::string&) {};
  set_num_threads(static_cast<int>(o_.threads));
  if (o_.device.is_sim()) set_sim_capacity(o_.device.index, o_.device_capacity_limit_bytes);
  if (o_.device.is_cuda() && o_.device_capacity_limit_bytes > 0)
    limit_cuda_memory(o_.device.index, o_.device_capacity_limit_bytes);

  config_ = resolve_config(o_, [&](const std::string& w) { print_("gpt2_train: " + w + "\n"); });
  saved_config_ = config_;  // what --save records: not the run's --dropout, unless asked
  if (o_.dropout >= 0) config_.set_dropout(o_.dropout);
  if (o_.save_run_dropout) saved_config_ = config_;
  if (o_.seq == 0) o_.seq = std::min<int64_t>(128, config_.n_positions);  // every preset runs
  if (o_.epochs > 0) steps_from_epochs();
  MW_CHECK_T(InvalidArgument, o_.seq <= config_.n_positions, "--seq ", o_.seq,
             " exceeds the model's ", config_.n_positions, " positions; lower --seq");
  MW_CHECK_T(InvalidArgument, o_.checkpoint_segments <= config_.n_layer, "--checkpoint-segments ",
             o_.checkpoint_segments, " exceeds the ", config_.n_layer, " blocks; use at most ",
             config_.n_layer, " (or 0 for sqrt)");
  MW_CHECK_T(InvalidArgument, !o_.checkpoint_every_block || o_.checkpoint_segments < 0,
             "--checkpoint-activations (every block) and --checkpoint-segments (K segments) are "
             "two recomputation plans; give one of them");
  if (o_.data_parallel()) check_data_parallel_options();  // before the plan, which is per rank
  if (memory_plan(o_, config_, print_)) {
    planned_only_ = true;
    return;
  }
  if (!o_.resume.empty()) {
    resumed_path_ = find_checkpoint(o_.resume);
    // Before its weights are read: a damaged checkpoint is named as such, with what to do.
    resumed_state_ = verify_checkpoint(resumed_path_);
    check_resumable(resumed_path_);  // before the model is built: the options it needs the same
    check_ranks_resume_one_step();
    weights_from_ = (std::filesystem::path(resumed_path_) / "model").string();
  } else {
    weights_from_ = o_.init_from;
  }
  lock_outputs();  // before the folder's checkpoints are looked at: another run may be writing
  if (!o_.checkpoint_dir.empty() && !o_.eval_only)
    check_checkpoint_dir_is_this_runs(o_.checkpoint_dir, resumed_state_.step, !o_.resume.empty());
  open_inputs();
  load_tokenizer();  // after the inputs: a new model's may be the one beside its shards
  default_generator().manual_seed(o_.seed);
  // The documents' unit: 2^30 parameters ("0.116 B" for GPT-2 small's 124,439,808).
  const int64_t numel = gpt2::num_parameters(config_);
  print_(str("Model numel: ", format_fixed(static_cast<double>(numel) / (1 << 30), 3), " B\n"));
  print_(str("Parameters: ", format_thousands(numel), " (B above is 2^30 parameters, the ",
             "ColossalAI documents' unit)\n"));
  build_model();
  if (o_.data_parallel()) setup_data_parallel();
  build_optimizer();
  build_recomputation();
  if (o_.precision == DType::F16)  // Note [Loss scale over ranks]
    scaler_ = std::make_unique<optim::DynamicLossScaler>(o_.loss_scaler,
                                                         o_.data_parallel() ? o_.comm->size() : 1);
  if (o_.precision != DType::F32)
    print_(str(
        "Precision: ", precision_name(o_.precision),
        " autocast (matmuls and attention), f32 masters",
        scaler_ ? str(", dynamic loss scale from ", format_fixed(o_.loss_scaler.initial_scale, 0),
                      o_.resume.empty() ? "" : " (a resumed fp16 run: the checkpoint's)")
                : "",
        "\n"));
  // > 0 after --load-optimizer; under Gemini the step count is its HybridAdam's.
  first_step_ = step_ = hybrid_ ? hybrid_->step_count() : opt_->step_count();
  micro_ = step_ * o_.grad_accum;
  // --steps is this run's count after --load-optimizer (which restores no data position), and the
  // run's total with --resume (resume_from).
  total_steps_ = step_ + o_.steps;
  if (!resumed_path_.empty()) resume_from(resumed_path_);
  schedule_ = {o_.lr_schedule, o_.hyper.lr, o_.min_lr, o_.warmup_steps, total_steps_};
  model_->train();
}

Trainer::~Trainer() {
  if (dp_) set_dropout_batch_shard({});  // process-wide (Note [Dropout under data parallel])
}

void Trainer::build_model() {
  // Under Gemini the parameters are made in their chunks, which may live on disk (Note [Streaming
  // construction]); otherwise on the device.
  gpt2::ParameterFactory factory;
  if (!o_.gemini.empty()) {
    gemini::GeminiOptions g = o_.gemini_options;
    g.search.interval_numel = config_.n_embd;  // ColossalAI's hidden_dim
    g.adam = optim::HybridAdamOptions(o_.hyper, -1.f, o_.nvme);
    g.adam.nvme.window_bytes = o_.gemini_nvme_window_bytes;
    g.adam.nvme.dir = o_.gemini_options.nvme_dir;  // the states beside the chunks (--nvme-dir)
    g.tensor_decays = decayed_parameters();        // Note [Weight decay by ranges]
    set_low_copies(o_, config_, g);                // Note [16-bit copies]
    g.keeps_gradients_until_step |= !o_.steps_in_backward();  // set_deferred_updates below
    if (o_.data_parallel())  // chunks that leave RAM as filled take rank 0's values first
      g.broadcast_from_rank0 = [comm = o_.comm](const Tensor& t) {  // Note [Staged collectives]
        dist::staged_broadcast(*comm, t, 0).wait();
      };
    if (o_.data_parallel() && o_.zero_stage >= 2) {  // Note [Sharded optimizer states]
      g.shard_rank = o_.comm->rank();
      g.shard_ranks = o_.comm->size();
      g.verbose = g.verbose && o_.comm->rank() == 0;
      // Note [Sharded parameters]: --zero 3 shards every chunk's parameters unless told less.
      g.shard_param_frac = o_.gemini_shard_param_frac();
    }
    std::vector<std::pair<std::string, Shape>> tensors;
    for (const auto& spec : gpt2::tensor_specs(config_))
      tensors.emplace_back(spec.name, spec.shape);
    gemini_owned_ = std::make_unique<gemini::Gemini>(g, tensors);
    factory.make = [this](const gpt2::TensorSpec& spec) {
      return gemini_owned_->make_parameter(spec.name);
    };
    factory.ready = [this](const gpt2::TensorSpec& spec) {
      gemini_owned_->parameter_ready(spec.name);
    };
  } else if (o_.data_parallel() && o_.zero_stage == 3) {
    dp_ = make_zero3(factory);  // Note [ZeRO stage 3]: built one bucket at a time
  }
  // Weights stream from the file into each parameter as the model is built (Note [Streaming
  // load], models/gpt2/hf_io.h); the file is checked against the config first.
  std::unique_ptr<gpt2::HfWeights> weights;
  if (!weights_from_.empty()) {
    weights = std::make_unique<gpt2::HfWeights>(weights_from_, config_);
    factory.fill = weights->filler();
  }
  model_ = std::make_unique<gpt2::GPT2>(config_, o_.seed, DType::F32,
                                        o_.gemini.empty() ? o_.device : Device::cpu(), factory);
  if (dp_) dp_->adopt(*model_);
}

void Trainer::build_optimizer() {
  if (gemini_owned_) {
    gemini_owned_->attach(*model_);
    gem_ = gemini_owned_.get();
    opt_ = std::move(gemini_owned_);
    print_(gem_->describe() + "\n");
    if (!o_.trace.empty()) {
      trace_ = std::make_unique<gemini::Trace>();
      gem_->set_trace(trace_.get());
    }
    hybrid_ = &gem_->adam();
    if (o_.updates_after_backward() || dp_) {  // data parallel: the gradients are reduced first
      gem_->set_deferred_updates(true);
      if (o_.updates_in_last_backward())
        print_(
            "Gemini: chunk gradients accumulate over the micro-batches, each chunk updated in the "
            "last micro-batch's backward once complete (Note [Updates in the last backward])\n");
      else if (o_.updates_after_backward())
        print_(str("Gemini: updates deferred to after backward (", why_updates_wait(o_, false),
                   "): chunk gradients accumulate over the micro-batches (Note [Deferred "
                   "updates])\n"));
      // Note [Updates as reductions complete], Note [Updates in the last backward]
      gem_->set_updates_as_reduced(o_.steps_in_backward() || o_.updates_in_last_backward());
    }
    if (dp_) connect_gemini();
  } else if (o_.optimizer == "adamw") {
    opt_ = std::make_unique<optim::AdamW>(dp_ ? dp_->optimizer_params() : model_->parameters(),
                                          o_.hyper, optimizer_no_decay());
  } else {
    optim::HybridAdamOptions h(o_.hyper, -1.f, o_.nvme);
    h.update_in_backward = o_.steps_in_backward() || o_.updates_in_last_backward();
    // The NVMe updater steps parameters in backward too: off with the in-memory updates, where
    // something needs every gradient first or --update-in-backward is off (the step then logs
    // the norm of gradients it still holds; before, the updater had released them: norm 0).
    h.nvme.overlap_backward = h.update_in_backward;
    if (dp_) h.update_in_backward = h.nvme.overlap_backward = false;  // gradients averaged first
    h.states_on_host = o_.states_on_host;
    h.no_decay = optimizer_no_decay();  // Note [Weight decay by ranges]
    auto owned = std::make_unique<optim::HybridAdam>(
        dp_ ? dp_->optimizer_params() : model_->parameters(), h);
    owned->set_record_grad_norm(o_.updates_in_last_backward());
    hybrid_ = owned.get();
    opt_ = std::move(owned);
  }
  if (o_.updates_after_backward() && o_.optimizer == "hybridadam" && !gem_)
    print_(o_.updates_in_last_backward() && !dp_
               ? "--grad-accum: parameters updated in the last micro-batch's backward (Note "
                 "[Updates in the last backward])\n"
               : str("Updates after backward: ", why_updates_wait(o_, dp_ != nullptr),
                     ", so update in backward and the NVMe overlap with backward are off (Note "
                     "[Updates after backward])\n"));
  const std::string& nvme_dir = o_.gemini.empty() ? o_.nvme.dir : o_.gemini_options.nvme_dir;
  if (hybrid_ && hybrid_->nvme())
    print_(str("NVMe offload: ",
               format_fixed(static_cast<double>(hybrid_->offloaded_numel()) / (1 << 30), 3),
               " B of ", format_fixed(static_cast<double>(model_->num_parameters()) / (1 << 30), 3),
               " B parameters' Adam states in '",
               nvme_dir.empty() ? "private temporary directory" : nvme_dir, "' (",
               hybrid_->nvme()->stats().direct ? "O_DIRECT" : "buffered", "), window ",
               format_fixed(mib(hybrid_->nvme()->stats().staging_bytes), 0), " MiB\n"));
  if (!o_.load_optimizer.empty()) {
    load_optimizer_state(o_.load_optimizer);
    print_(str("Loaded optimizer state (step ",
               (hybrid_ ? hybrid_->step_count() : opt_->step_count()), ") from ", o_.load_optimizer,
               "\n"));
  }
}

void Trainer::build_recomputation() {
  // Activation offload and recomputation: run_block maps block i through its segment. Forward's
  // pending copies held to the prefetch's bytes, the plan's in-flight row (Note [Offload window]).
  offload::ActivationOffloadOptions offload;
  offload.prefetch_bytes = plan_inputs(o_, config_).offload_in_flight_bytes;
  offload.max_pending_bytes = offload.prefetch_bytes;
  if (o_.offload_activations) offloader_ = std::make_unique<offload::ActivationOffloader>(offload);
  if (!o_.checkpoint_every_block && o_.checkpoint_segments < 0) return;
  const int64_t n = static_cast<int64_t>(model_->blocks().size());
  std::vector<nn::Segment> plan;
  if (o_.checkpoint_segments >= 0) {
    const int64_t k = o_.checkpoint_segments == 0 ? nn::sqrt_segments(n) : o_.checkpoint_segments;
    plan = nn::plan_segments(n, k);
  } else {
    for (int64_t i = 0; i < n; ++i) plan.push_back({i, i + 1, true});
  }
  nn::CheckpointOptions copts;
  if (offloader_) {
    copts.pack_input = offloader_->pack_hook();
    copts.unpack_input = offloader_->unpack_hook();
  }
  std::string desc;
  bool any = false;
  for (const auto& seg : plan) {
    desc += str(" [", seg.begin, ",", seg.end, ")", seg.checkpointed ? "" : "*");
    any = any || seg.checkpointed;
  }
  print_(str("Checkpointing ", plan.size(), " segments:", desc, " (* = not checkpointed)\n"));
  if (!any)
    print_(str("gpt2_train: warning: --checkpoint-segments ", o_.checkpoint_segments, " over ", n,
               " blocks recomputes nothing (the last segment is never checkpointed, as in "
               "PyTorch's checkpoint_sequential); give 2 or more segments\n"));
  auto runner = std::make_shared<nn::SegmentedRunner>(
      std::vector<std::shared_ptr<nn::Module>>(model_->blocks().begin(), model_->blocks().end()),
      plan, copts);
  model_->run_block = [runner](nn::Block&, int64_t i, const Tensor& x) { return (*runner)(i, x); };
}

void Trainer::micro_batch(int64_t index, std::vector<int32_t>& tokens) const {
  tokens.resize(static_cast<size_t>(o_.batch * o_.seq));
  if (train_data_)
    train_data_->batch(index, o_.batch, o_.seq, tokens.data());
  else
    data::random_tokens(o_.seed, index, o_.batch, o_.seq, config_.vocab_size, tokens.data());
  if (dp_) keep_rank_rows(tokens);
}

void Trainer::set_step_scalars(double lr, float div_scale) {
  if (hybrid_) {
    hybrid_->set_lr(static_cast<float>(lr));
    hybrid_->set_div_scale(div_scale);
  } else if (auto* adamw = dynamic_cast<optim::AdamW*>(opt_.get())) {
    adamw->set_lr(static_cast<float>(lr));
    adamw->set_div_scale(div_scale);
  }
}

void Trainer::mark_phase(const char* phase) {  // on the offload clock, for --nvme-timeline
  if (hybrid_ && hybrid_->nvme()) phase_ms_.emplace_back(phase, hybrid_->nvme()->now_ms());
}

// Micro-batch k of K: forward and backward; returns its loss.
double Trainer::micro_step(int64_t k, std::vector<int32_t>& tokens, StepResult& r) {
  micro_batch(micro_, tokens);
  if (train_data_) r.epoch = train_data_->epoch_of(micro_, o_.batch, o_.seq);
  ++micro_;
  Tensor ids = Tensor::from_vector(tokens, {local_batch(), o_.seq}, o_.device);
  mark_phase("forward_start");
  const auto t_fwd = clock::now();
  Tensor logits, loss;
  {
    std::unique_ptr<offload::OffloadScope> scope;
    if (offloader_) scope = std::make_unique<offload::OffloadScope>(*offloader_);
    AutocastGuard autocast(o_.precision);
    logits = (*model_)(ids);
    loss = shifted_cross_entropy(logits, ids);
  }
  logits = Tensor();  // the loss node holds the only reference: backward reuses the buffer
  r.forward_ms += ms_since(t_fwd);
  mark_phase("backward_start");
  const auto t_bwd = clock::now();
  if (gem_) gem_->set_final_backward(k + 1 == o_.grad_accum);
  if (hybrid_ && !gem_) hybrid_->set_final_backward(k + 1 == o_.grad_accum);
  if (dp_ && k == o_.grad_accum - 1) dp_->arm();  // Note [Gradient buckets]
  backward(loss, scaler_ ? scaler_->backward_seed(loss) : Tensor());
  r.backward_ms += ms_since(t_bwd);
  return loss.item();
}

// Note [Non-finite values]: a non-finite loss stops the run at its step, in every precision (a
// forward overflow repeats at any loss scale, so skipping would only hide it), checked before the
// updates that wait for the step. The gradient norm is measured where the updates wait for it
// (--grad-clip, --grad-accum > 1, fp16, --optimizer adamw, data parallel, --update-in-backward
// off): in fp32 a non-finite norm stops the run before the update; under fp16 loss scaling the
// step is skipped and the scale lowered. Where parameters are stepped during backward (HybridAdam's
// and Gemini's default fp32 paths) there is no norm: HybridAdam's CPU kernels check each element
// they write, while it is in cache (adam_update_parallel), and a NaN or Inf, which a non-finite
// gradient always leaves, stops the run at this step naming the parameter
// (check_updates_finite). That parameter and those stepped before it hold it, so nothing is
// saved; save_hf refuses non-finite weights anyway. (On CUDA the kernels do not check: the next
// step's loss stops the run.)
//
// Note [Updates after backward]: 1/K and the clip factor become one divisor of the gradients.
// fp16: gradients are unscaled in place (and checked) before they are measured or used. Returns
// false when they are not finite (the step is skipped).
//
// Note [Loss scaling under Gemini]: Gemini's gradients are in chunk buffers, not .grad, and fp16
// defers its updates (Note [Deferred updates]). The buffers stay scaled: a non-finite value makes
// the squared norm non-finite, which is the check; the norm is divided by the gradients' scale
// (Note [Loss scale over ranks]), which joins 1/K and the clip factor in the update's divisor. It
// is a power of two, so dividing once by K x scale rounds as unscaling and then dividing by K
// does: the norm, the clip decision and the weights are the plain fp16 run's bit for bit. A
// skipped step drops the buffers (Gemini::skip_step) with nothing stepped.
bool Trainer::measure_and_scale_gradients(StepResult& r) {
  const bool grads_kept = o_.optimizer == "adamw" ||
                          (o_.gemini.empty() && !o_.update_in_backward) ||
                          o_.updates_after_backward() || dp_ != nullptr;
  bool finite = !scaler_ || gem_ || scaler_->unscale_and_check(opt_->params());
  // Under ZeRO each rank checks only its shard of the gradients: the ranks skip together.
  if (scaler_ && dp_ && dp_->zero_stage() > 0)
    finite = dp_->mean_over_ranks(finite ? 1.0 : 0.0) == 1.0;
  if (!grads_kept || !finite) return finite;
  // Gemini keeps gradients in chunk buffers; its norm sums in the same order (Note [Norm order]).
  // Under ZeRO each rank holds a shard of the reduced gradients (Note [Gradient buckets]).
  const auto t_norm = clock::now();  // under data parallel Gemini waits for its reductions here
  // HybridAdam updating in the last micro-batch's backward took the norm's parts first.
  double sum_norm = gem_                           ? gem_->grad_norm()
                    : dp_ && dp_->zero_stage() > 0 ? dp_->grad_norm()
                    : hybrid_                      ? hybrid_->step_grad_norm()
                                                   : global_grad_norm(opt_->params());
  if (gem_ && dp_) dp_->add_backward_end_wait_ms(ms_since(t_norm));
  // fp32 (no scaler): a non-finite gradient cannot be skipped as an overflow; stop before it
  // reaches the weights (Note [Non-finite values]).
  // (Under --grad-accum alone the last micro-batch's backward has stepped already, Note [Updates
  // in the last backward]: the weights hold it, and nothing is saved either.)
  MW_CHECK(scaler_ || std::isfinite(sum_norm), "the gradient norm is ", sum_norm, " at step ",
           step_, ": training diverged (lower --lr, set --grad-clip, check the data and ",
           "--init-from weights); stopped ",
           o_.updates_in_last_backward() ? "after the update in backward" : "before the update",
           ", without saving; any earlier save is kept");
  double divisor = static_cast<double>(o_.grad_accum);
  if (gem_ && scaler_) {
    if (!std::isfinite(sum_norm)) return false;
    sum_norm /= scaler_->gradient_scale();
    divisor *= scaler_->gradient_scale();
  }
  r.grad_norm = sum_norm / static_cast<double>(o_.grad_accum);
  // torch.nn.utils.clip_grad_norm_: g *= max_norm / (norm + 1e-6) when that is below 1.
  const double clip_coef = o_.grad_clip > 0 ? o_.grad_clip / (r.grad_norm + 1e-6) : 1.0;
  if (clip_coef < 1.0) {
    r.clipped = true;
    divisor /= clip_coef;
  }
  set_step_scalars(r.lr, divisor != 1.0 ? static_cast<float>(divisor) : -1.f);
  return true;
}

// Note [Non-finite values]: where nothing measured the gradients before they were stepped (during
// backward), HybridAdam's kernels check each parameter as they write it; a NaN or Inf stops the
// run at this step. (Data parallel measures the norm on every rank first.)
void Trainer::check_updates_finite() {
  if (!hybrid_ || dp_) return;
  const int64_t i = hybrid_->take_non_finite();
  if (i < 0) return;
  const auto named = model_->named_parameters();
  const std::string what = !gem_ && static_cast<size_t>(i) < named.size()
                               ? named[static_cast<size_t>(i)].first
                               : str(gem_ ? "chunk " : "parameter ", i, " of the optimizer");
  throw Error(str("the update of ", what, " at step ", step_,
                  " left a NaN or Inf in it (its gradient was not finite, and it was stepped "
                  "during backward, before any norm): training diverged (lower --lr, set "
                  "--grad-clip, check the data and --init-from weights); stopped without saving, "
                  "any earlier save is kept"));
}

StepResult Trainer::train_step() {
  throw_if_stop_requested(str("before step ", step_).c_str());
  StepResult r;
  r.step = step_;
  r.lr = schedule_.lr_at(step_);
  const auto t0 = clock::now();
  const double cpu0 = process_cpu_ms();
  // The LR is set before backward: updates in backward (and Gemini's chunks) use it there, and
  // 1/K for updates in the last micro-batch's backward (measure_and_scale_gradients sets it again).
  set_step_scalars(r.lr, o_.updates_in_last_backward() ? static_cast<float>(o_.grad_accum) : -1.f);
  phase_ms_.clear();
  opt_->zero_grad();
  std::vector<int32_t> tokens;
  double loss_sum = 0;
  for (int64_t k = 0; k < o_.grad_accum; ++k) loss_sum += micro_step(k, tokens, r);
  r.loss = loss_sum / static_cast<double>(o_.grad_accum);
  if (dp_) {
    dp_->finish_gradients();
    r.loss = dp_->mean_over_ranks(r.loss);
  }
  // Before any update that waits for the step (Note [Non-finite values]).
  MW_CHECK(std::isfinite(r.loss), "the loss is ", r.loss, " at step ", step_,
           ": training diverged (lower --lr, check the data and --init-from weights); stopped "
           "without saving, any earlier save is kept");
  const bool finite = measure_and_scale_gradients(r);
  mark_phase("step_start");
  if (finite) {
    opt_->step();
    check_updates_finite();
    if (dp_) dp_->gather_parameters();  // ZeRO: every rank's updated pieces to every rank
  } else {  // Note [Dynamic loss scaling]: no parameter changes, the gradients are dropped
    if (gem_)
      gem_->skip_step();
    else
      opt_->zero_grad();
    r.skipped = true;
    ++skipped_steps_;
  }
  if (scaler_) {
    scaler_->update(!finite);
    r.loss_scale = scaler_->scale();
  }
  mark_phase("step_end");
  r.step_ms = ms_since(t0);
  r.step_cpu_ms = process_cpu_ms() - cpu0;
  r.tokens = o_.batch * o_.seq * o_.grad_accum;
  step_ms_.push_back(r.step_ms);
  forward_ms_.push_back(r.forward_ms);
  backward_ms_.push_back(r.backward_ms);
  step_cpu_ms_.push_back(r.step_cpu_ms);
  ++step_;
  return r;
}

bool Trainer::eval_due() const {
  if (!val_ || last_eval_step_ == step_) return false;  // done at this step (before a resume)
  return (o_.eval_every > 0 && step_ % o_.eval_every == 0) || step_ == total_steps_;
}

void Trainer::flush() {
  if (hybrid_) hybrid_->flush();  // the last write-backs, and any failure among them
}

}  // namespace mw::train
