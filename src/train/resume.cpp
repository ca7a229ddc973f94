// The Trainer's checkpoints: writing one, and resuming from one exactly (Note [Exact resume],
// checkpoint.h).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>

#include "autograd/autocast.h"
#include "core/error.h"
#include "models/gpt2/hf_io.h"
#include "optim/adam_state_file.h"
#include "train/data_parallel.h"
#include "train/trainer.h"
#include "train/zero_state_file.h"

namespace mw::train {

namespace {

// Options that decide which tokens each update sees: a different value cannot resume. --data is
// not among them: the same shards staged to another path (a node's scratch) resume with a
// warning, as do shards of another token count (open_inputs); the seeds are recorded only where
// they decide the data (Note [Exact resume]).
constexpr const char* kMustMatch[] = {"batch", "seq", "grad_accum", "shuffle", "data_seed", "seed"};

// The model's shape: it must match too (the checkpoint's weights have it).
bool is_shape_key(const std::string& key) {
  return key == "n_layer" || key == "n_head" || key == "n_embd" || key == "n_inner" ||
         key == "vocab_size" || key == "n_positions";
}

// Recorded since session 38: absent from older checkpoints, which then say nothing about them.
bool recorded_since_session_38(const std::string& key) {
  return key == "layer_norm_epsilon" || key == "attn_pdrop" || key == "embd_pdrop" ||
         key == "val_data" || key == "eval_batches" || is_shape_key(key);
}

// The same file or folder however it is spelled ("data/" through a link, "./data").
bool same_path(const json::Value& a, const json::Value& b) {
  if (!a.is_string() || !b.is_string()) return false;
  std::error_code ec1, ec2;
  const auto x = std::filesystem::weakly_canonical(a.as_string(), ec1);
  const auto y = std::filesystem::weakly_canonical(b.as_string(), ec2);
  return !ec1 && !ec2 && x == y;
}

// A fingerprint value as the user typed it: the float hyperparameters are stored widened to double
// (0.001f is 0.0010000000474974513), so a number a float holds exactly prints as that float's
// shortest form ("0.001"), any other number as the double's.
std::string describe(const json::Value* v) {
  if (!v) return "(absent)";
  if (!v->is_number()) return v->dump();
  const double d = v->as_double();
  char buf[64];
  const auto f = static_cast<float>(d);
  const auto end = static_cast<double>(f) == d ? std::to_chars(buf, buf + sizeof buf, f).ptr
                                               : std::to_chars(buf, buf + sizeof buf, d).ptr;
  return std::string(buf, end);
}

// The options that shape the learning-rate schedule and nothing else.
bool is_schedule_key(const std::string& key) {
  return key == "steps" || key == "lr_schedule" || key == "lr" || key == "warmup_steps" ||
         key == "min_lr";
}

// Whether the updates before `step` had the same learning rates (as the optimizer receives them,
// floats) under the checkpoint's schedule as under this run's `now`: changed schedule options
// then changed nothing the run has done so far.
bool same_rates_so_far(const json::Value& saved, const LrSchedule& now, int64_t step) {
  try {
    const LrSchedule before{parse_lr_schedule(saved.at("lr_schedule").as_string()),
                            saved.at("lr").as_double(), saved.at("min_lr").as_double(),
                            saved.at("warmup_steps").as_int(), saved.at("steps").as_int()};
    for (int64_t s = 0; s < step; ++s)
      if (static_cast<float>(before.lr_at(s)) != static_cast<float>(now.lr_at(s))) return false;
    return true;
  } catch (const Error&) {  // a fingerprint without them: each change is warned about
    return false;
  }
}

template <typename T>
json::Value int_array(const std::vector<T>& xs) {
  json::Value a = json::Value::array();
  for (T x : xs) a.push_back(static_cast<int64_t>(x));
  return a;
}

json::Value layout_json(const optim::StateFileMap& m) {
  json::Value v = json::Value::object();
  v.set("file_numels", int_array(m.file_numels));
  v.set("param", int_array(m.param));
  v.set("offset", int_array(m.offset));
  return v;
}

optim::StateFileMap layout_from_json(const json::Value& v, const std::string& path) {
  optim::StateFileMap m;
  try {
    for (const json::Value& x : v.at("file_numels").elements()) m.file_numels.push_back(x.as_int());
    for (const json::Value& x : v.at("param").elements())
      m.param.push_back(static_cast<size_t>(x.as_int()));
    for (const json::Value& x : v.at("offset").elements()) m.offset.push_back(x.as_int());
  } catch (const Error& e) {
    throw FormatError(str("checkpoint '", path, "': trainer.json's optimizer_layout is malformed (",
                          e.what(), "); resume from another checkpoint"));
  }
  return m;
}

}  // namespace

json::Value Trainer::run_fingerprint() const {
  json::Value r = json::Value::object();
  r.set("batch", o_.batch);
  r.set("seq", o_.seq);
  r.set("grad_accum", o_.grad_accum);
  r.set("data", o_.data.empty() ? "random tokens" : o_.data);
  // Set once the data is open: absent when check_fingerprint runs, checked in open_inputs.
  if (train_data_) r.set("data_tokens", train_data_->num_tokens());
  r.set("shuffle", o_.shuffle);
  // The seeds where they decide the data: --data-seed the order under --shuffle, --seed the
  // random tokens without --data (elsewhere it drew the first weights, replaced by the
  // checkpoint's, and dropout's generator, restored from it). Until session 38 both were always
  // compared, and the refusal asked for a --data-seed that needs --shuffle.
  if (o_.shuffle) r.set("data_seed", std::to_string(o_.data_seed));
  if (o_.data.empty()) r.set("seed", std::to_string(o_.seed));
  r.set("steps", total_steps_);
  r.set("lr_schedule", lr_schedule_name(o_.lr_schedule));
  r.set("lr", static_cast<double>(o_.hyper.lr));
  r.set("warmup_steps", o_.warmup_steps);
  r.set("min_lr", o_.min_lr);
  r.set("grad_clip", o_.grad_clip);
  r.set("precision", precision_name(o_.precision));
  r.set("beta1", static_cast<double>(o_.hyper.beta1));
  r.set("beta2", static_cast<double>(o_.hyper.beta2));
  r.set("eps", static_cast<double>(o_.hyper.eps));
  r.set("weight_decay", static_cast<double>(o_.hyper.weight_decay));
  r.set("weight_decay_on", o_.decay_on == optim::DecayOn::kAll ? "all" : "matrices");
  // The model's shape, named before its weights are read: another --n-embd was "tensor 'wte' has
  // shape [1024, 64], expected [1024, 128] (does config.json match the weights?)", and another
  // --n-head, which changes no shape, went through silently.
  r.set("n_layer", config_.n_layer);
  r.set("n_head", config_.n_head);
  r.set("n_embd", config_.n_embd);
  r.set("n_inner", config_.mlp_width());
  r.set("vocab_size", config_.vocab_size);
  r.set("n_positions", config_.n_positions);
  r.set("dropout", config_.resid_pdrop);
  r.set("attn_pdrop", config_.attn_pdrop);
  r.set("embd_pdrop", config_.embd_pdrop);
  r.set("layer_norm_epsilon", config_.layer_norm_epsilon);  // a --config's
  r.set("val_data", o_.val_data);  // what --save-best and --early-stop compare with
  r.set("eval_batches", o_.eval_batches);
  r.set("optimizer", o_.gemini.empty() ? o_.optimizer : "gemini");
  return r;
}

void Trainer::check_fingerprint(const json::Value& saved, const std::string& path,
                                int64_t step) const {
  const json::Value now = run_fingerprint();
  const bool same_rates = same_rates_so_far(
      saved, {o_.lr_schedule, o_.hyper.lr, o_.min_lr, o_.warmup_steps, o_.steps}, step);
  for (int64_t i = 0; i < now.size(); ++i) {
    const std::string& key = now.key(i);
    const json::Value* before = saved.find(key);
    if (before && *before == now.value(i)) continue;
    if (!before && recorded_since_session_38(key)) continue;
    // A seed not recorded decided nothing in the checkpoint's run; the data it would decide is
    // compared by its own key (below, and "shuffle").
    if (!before && (key == "seed" || key == "data_seed")) continue;
    // Random tokens for a run on --data, or the other way round: not the same data at all.
    if (before && key == "data" &&
        (*before == json::Value("random tokens")) != (now.value(i) == json::Value("random tokens")))
      throw InvalidArgument(str("--resume '", path, "': the checkpoint's run trained on ",
                                describe(before), " and this one on ", describe(&now.value(i)),
                                "; pass the same --data to resume"));
    if (before && (key == "data" || key == "val_data") && same_path(*before, now.value(i)))
      continue;
    // AdamW, HybridAdam and Gemini's HybridAdam make the same update bit for bit (docs/
    // architecture.md), so moving among them, a memory choice, keeps the uninterrupted run.
    if (before && key == "optimizer") continue;
    // Training on with more --steps (under a constant schedule, or in a decay's warmup) is the
    // uninterrupted run of the new total when every update so far had the rate it has now.
    if (same_rates && is_schedule_key(key)) continue;
    // Without a decay the rule changes nothing; runs that did not record it decayed everything.
    if (key == "weight_decay_on" &&
        (o_.hyper.weight_decay == 0 || (!before && o_.decay_on == optim::DecayOn::kAll)))
      continue;
    bool must = is_shape_key(key);
    for (const char* k : kMustMatch) must = must || key == k;
    std::string option = "--" + key;  // grad_accum: --grad-accum
    std::replace(option.begin(), option.end(), '_', '-');
    if (must)
      throw InvalidArgument(str(
          "--resume '", path, "': the checkpoint was written with ", key, " = ", describe(before),
          " and this run has ", describe(&now.value(i)), "; pass the same ", option,
          is_shape_key(key) ? " to resume (the checkpoint's model has that shape)"
                            : " to resume (it decides the data of every step)"));
    print_(str("gpt2_train: warning: resuming '", path, "' with ", key, " = ",
               describe(&now.value(i)), " (the checkpoint's run had ", describe(before),
               key == "data"
                   ? "): the run goes on from the same batch index; it is the "
                     "uninterrupted run's only if these are the same shards\n"
                   : "): the run goes on, but it is no longer the uninterrupted run's\n"));
  }
}

void Trainer::save_optimizer_state(const std::string& file) {
  if (shards_optimizer())
    save_sharded_optimizer_state(file);
  else if (hybrid_)
    hybrid_->save_state(file);
  else
    dynamic_cast<optim::AdamW&>(*opt_).save_state(file);
}

namespace {

// The layout of a file written without Gemini: the model's parameters, each whole.
optim::StateFileMap model_layout(const std::vector<Tensor>& params) {
  optim::StateFileMap m;
  for (size_t p = 0; p < params.size(); ++p) {
    m.file_numels.push_back(params[p].numel());
    m.param.push_back(p);
    m.offset.push_back(0);
  }
  return m;
}

// Whether `file`'s header lists tensors of exactly these sizes.
bool file_has_tensors(const std::string& file, const std::vector<int64_t>& numels) {
  optim::AdamStateReader reader(file);
  int64_t step = 0;
  try {
    optim::read_segments(reader, numels, step);
    return true;
  } catch (const FormatError&) {
    return false;
  }
}

bool same_layout(const optim::StateFileMap& a, const optim::StateFileMap& b) {
  return a.file_numels == b.file_numels && a.param == b.param && a.offset == b.offset;
}

}  // namespace

// Note [Optimizer layouts]: Gemini's file parameters are its chunks; otherwise the model's own.
optim::StateFileMap Trainer::optimizer_layout() const {
  const std::vector<Tensor> params = model_->parameters();
  if (!gem_) return model_layout(params);
  optim::StateFileMap m;
  m.param.resize(params.size());
  m.offset.resize(params.size());
  for (const auto& c : gem_->chunks()) {
    for (const gemini::ChunkMember& member : c->members()) {
      m.param[member.tensor] = m.file_numels.size();
      m.offset[member.tensor] = member.offset;
    }
    m.file_numels.push_back(c->numel());
  }
  return m;
}

// A checkpoint written in another layout: each optimizer parameter (a chunk, a model parameter, or
// this rank's piece of either under ZeRO) reads its runs of the model's parameters from the file.
void Trainer::load_optimizer_state_remapped(const std::string& file,
                                            const optim::StateFileMap& saved,
                                            const optim::StateFileMap& now) {
  std::vector<int64_t> numels;
  for (const Tensor& p : model_->parameters()) numels.push_back(p.numel());
  std::vector<size_t> piece_param;
  std::vector<int64_t> piece_offset, piece_numel;
  if (shards_optimizer()) {
    const ShardLayout shards = gem_ ? gemini_shard_layout() : shard_layout(*dp_);
    for (const ShardPiece& piece : shards.pieces[static_cast<size_t>(dp_->rank())]) {
      piece_param.push_back(piece.param);
      piece_offset.push_back(piece.offset);
      piece_numel.push_back(piece.numel);
    }
  } else {
    for (size_t q = 0; q < now.file_numels.size(); ++q) {
      piece_param.push_back(q);
      piece_offset.push_back(0);
      piece_numel.push_back(now.file_numels[q]);
    }
  }
  const optim::StateFileMap map =
      optim::remap_state_file(saved, now, numels, piece_param, piece_offset, piece_numel);
  if (hybrid_)
    hybrid_->load_state(file, &map);
  else
    dynamic_cast<optim::AdamW&>(*opt_).load_state(file, &map);
}

void Trainer::load_optimizer_state(const std::string& file, const json::Value* saved_layout) {
  const optim::StateFileMap now = optimizer_layout();
  optim::StateFileMap saved = now;
  if (saved_layout && !saved_layout->is_null()) {
    saved = layout_from_json(*saved_layout, file);
  } else if (gem_) {  // --load-optimizer: a file of the model's own layout is told by its sizes
    const optim::StateFileMap plain = model_layout(model_->parameters());
    if (!file_has_tensors(file, now.file_numels) && file_has_tensors(file, plain.file_numels))
      saved = plain;
  }
  if (!same_layout(saved, now)) return load_optimizer_state_remapped(file, saved, now);
  if (shards_optimizer() && gem_)  // Note [Sharded optimizer states]: pieces of the chunks
    load_zero_state(gemini_shard_layout(), dp_->rank(), gem_->adam(), file);
  else if (shards_optimizer())
    load_zero_state(*dp_, *opt_, file);  // this rank's pieces (Note [ZeRO checkpoints])
  else if (hybrid_)
    hybrid_->load_state(file);
  else
    dynamic_cast<optim::AdamW&>(*opt_).load_state(file);
}

void Trainer::check_resumable(const std::string& path) {
  const TrainState& state = resumed_state_;
  // The total is this run's --steps: check_fingerprint compares it with the checkpoint's.
  MW_CHECK_T(InvalidArgument, o_.steps >= state.step, "--resume '", path,
             "': the checkpoint is at step ", state.step, ", past --steps ", o_.steps,
             " (with --resume, the run's total); pass --steps above ", state.step,
             " to train on from it");
  total_steps_ = o_.steps;
  check_fingerprint(state.run, path, state.step);
}

void Trainer::resume_from(const std::string& path) {
  const TrainState& state = resumed_state_;
  total_steps_ = o_.steps;  // the run's total (check_resumable)
  // Weights came in with the model (weights_from_); now the optimizer, the data and the RNG.
  load_optimizer_state((std::filesystem::path(path) / "optimizer.bin").string(),
                       &state.optimizer_layout);
  // Note [Skipped steps]: a step the fp16 loss scaler skipped counts in the run's steps (the
  // schedule, the data, step_) but not in the optimizer's (Adam's bias correction), as in torch's
  // GradScaler, so the two differ by the skips, and they do for good, whatever precision a later
  // resume runs in: trainer.json's skipped_steps carries them in every precision. Until session
  // 38 the counts had to be equal (every checkpoint after an fp16 run's first skip was refused),
  // and then a run resumed in bf16 wrote skipped_steps 0 (its checkpoints were refused again).
  // Under Gemini the states and their step count are its HybridAdam's.
  const int64_t loaded_step = hybrid_ ? hybrid_->step_count() : opt_->step_count();
  const int64_t skipped = state.scaler.skipped_steps;
  MW_CHECK_T(FormatError, loaded_step + skipped == state.step, "checkpoint '", path,
             "': optimizer.bin is at step ", loaded_step, " but trainer.json at step ", state.step,
             skipped > 0 ? str(" with ", skipped, " skipped by the fp16 loss scaler") : "",
             "; the checkpoint is inconsistent, resume from another one");
  first_step_ = step_ = state.step;
  skipped_steps_ = skipped;
  micro_ = state.micro_batch;
  default_generator().set_state(state.dropout_rng);
  // The scale goes on from the checkpoint's only where that run had one: an fp32 or bf16 run
  // resumed in fp16 starts from --initial-loss-scale (it took the defaults written without one).
  const json::Value* precision = state.run.find("precision");
  if (scaler_ && precision && *precision == json::Value("fp16")) scaler_->load_state(state.scaler);
  best_ = state.best;
  last_eval_step_ = state.last_eval_step;
  eval_recorded_ = state.last_eval_step >= 0;
  // Off the --eval-every grid only the old run's last step is evaluated: trained on past it, its
  // evaluation stays in the record of --save-best and --early-stop, which the uninterrupted run
  // of the new total never made (found by review; the losses are the same).
  if (last_eval_step_ == step_ && step_ < total_steps_ && o_.eval_every > 0 &&
      step_ % o_.eval_every != 0 && (!o_.save_best.empty() || o_.early_stop > 0))
    print_(str("gpt2_train: warning: resuming '", path, "' past its run's last step ", step_,
               ", whose evaluation (off --eval-every ", o_.eval_every, ") is in the record of ",
               "--save-best and --early-stop: they may keep another model and stop at another ",
               "step than one run of --steps ", total_steps_, "\n"));
  // Note [Best model and early stopping]: a run that stopped early stays stopped (it trained on,
  // and wrote over --save, when resumed by a requeued job); a larger --early-stop goes on.
  if (o_.early_stop > 0 && best_.evals_since >= o_.early_stop && step_ < total_steps_) {
    print_(str("The checkpoint's run had stopped early (--early-stop ", o_.early_stop, ": ",
               best_.evals_since, " evaluations without a val loss below ",
               format_fixed(best_.loss, 3), "); nothing to train: raise --early-stop to go on\n"));
    total_steps_ = step_;
  }
  print_(str("Resumed from ", path, " at step ", step_, " (", total_steps_ - step_,
             " steps to go)\n"));
}

void Trainer::save_model(const std::string& dir, DType dtype) {
  if (gem_ && gem_->shards_parameters()) {  // every rank gathers, rank 0 writes (stream_sharded)
    UncountedScope uncounted(dp_.get());    // not a training step's communication
    gem_->with_parameters_streamed([&](const gemini::Gemini::Touch& touch) {
      gpt2::save_hf(*model_, dir, saved_config_, touch, tokenizer_bytes_, dtype);
    });
    return;
  }
  if (shards_parameters()) {  // one bucket at a time; the other ranks gather with rank 0
    dp_->stream_parameters([&](const DataParallel::Touch& touch) {
      gpt2::save_hf(*model_, dir, saved_config_, touch, tokenizer_bytes_, dtype);
    });
    return;
  }
  if (!is_root()) return;
  if (gem_)  // disk-homed chunks are read in one at a time (Note [Streaming save])
    gem_->with_parameters_streamed([&](const gemini::Gemini::Touch& touch) {
      gpt2::save_hf(*model_, dir, saved_config_, touch, tokenizer_bytes_, dtype);
    });
  else
    gpt2::save_hf(*model_, dir, saved_config_, {}, tokenizer_bytes_, dtype);
}

// Note [One writer per output]: rank 0 alone writes the checkpoints and the log.
// (Before setup_data_parallel: the job's communicator says which rank this is.)
void Trainer::lock_outputs() {
  if (o_.comm && o_.comm->rank() != 0) return;
  if (!o_.checkpoint_dir.empty() && !o_.eval_only) {
    output_locks_.emplace_back(o_.checkpoint_dir, true, "--checkpoint-dir",
                               "would overwrite and prune each other's checkpoints");
    remove_stale_checkpoint_temporaries(o_.checkpoint_dir);  // no other run writes there now
  }
  if (!o_.log.empty())
    output_locks_.emplace_back(o_.log, false, "--log", "would write over each other's lines");
}

bool Trainer::checkpoint_due() const {
  if (o_.checkpoint_dir.empty()) return false;
  return (o_.checkpoint_every > 0 && step_ % o_.checkpoint_every == 0) || step_ == total_steps_;
}

std::string Trainer::save_checkpoint() {
  flush();  // the offloaded states' last write-backs land before they are streamed out
  const std::string path = [&] {
    if (!is_root()) {  // under ZeRO its optimizer states go to rank 0, which writes them
      if (shards_parameters()) save_model("");  // the gathers of rank 0's model save
      if (shards_optimizer()) save_sharded_optimizer_state("");
      return o_.checkpoint_dir + "/" + checkpoint_name(step_);  // the folder rank 0 writes
    }
    TrainState s;
    s.step = step_;
    s.micro_batch = micro_;
    s.dropout_rng = default_generator().state();
    if (scaler_) s.scaler = scaler_->state();
    s.scaler.skipped_steps = skipped_steps_;  // Note [Skipped steps]: also without a scaler now
    s.best = best_;
    s.last_eval_step = last_eval_step_;
    s.run = run_fingerprint();
    s.optimizer_layout = layout_json(optimizer_layout());
    const std::string written = write_checkpoint(
        o_.checkpoint_dir, s, [&](const std::string& dir) { save_model(dir); },
        [&](const std::string& file) { save_optimizer_state(file); });
    prune_checkpoints(o_.checkpoint_dir, o_.keep);
    return written;
  }();
  // Under data parallel no rank returns before rank 0 has put the folder in place: a rank that
  // then stops (Note [Stop signals]) and exits first would have mpirun kill rank 0 mid-write.
  await_root_saves();
  return path;
}

}  // namespace mw::train
