// The training loop of gpt2_train as a library: a Trainer builds the model, the optimizer
// (AdamW, HybridAdam with NVMe offload, or Gemini), the data streams and the recomputation plan
// from TrainOptions, then runs one optimizer update per train_step(), evaluates, and writes and
// resumes checkpoints. The app (apps/gpt2_train.cpp) parses options and prints; tests drive this
// directly.
//
// Note [Updates after backward]: --grad-clip needs the global gradient norm before any parameter
// is updated, and --grad-accum K needs gradients to survive K backwards. HybridAdam's update in
// backward (Note [Update in backward]) and its NVMe pipeline overlapped with backward (Note
// [Overlapped step contract]) update parameters before the norm is known, so either option turns
// both off: backward keeps every gradient, the norm is computed once over all of them in double,
// and step() applies 1/K and the clip factor as one divisor (div_scale, Note [Adam math]) to
// in-memory and NVMe-offloaded states alike. The memory plan counts the gradients accordingly.
// Gemini defers its chunk updates the same way (Note [Deferred updates] in
// offload/gemini/deferred.cpp): chunk gradient buffers accumulate, the norm is summed in the
// plain run's order, and step() updates every chunk. Accumulation alone needs no norm: its 1/K is
// set before the last micro-batch's backward, which updates in backward again (Note [Updates in
// the last backward], offload/gemini/deferred.cpp; HybridAdam::set_final_backward), the norm's
// parts taken before each update.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "data/output_lock.h"
#include "data/tokenizer_files.h"
#include "dist/communicator.h"
#include "models/gpt2/config.h"
#include "models/gpt2/generate.h"
#include "models/gpt2/model.h"
#include "offload/activation/activation_offload.h"
#include "offload/gemini/gemini.h"
#include "optim/grad_norm.h"
#include "optim/hybrid_adam.h"
#include "optim/loss_scaler.h"
#include "train/checkpoint.h"
#include "train/schedule.h"
#include "train/token_stream.h"

namespace mw::train {

struct TrainOptions {
  // The model: a preset, an HF folder, or a config.json, then any shape overrides (0 = keep).
  std::string model = "small", init_from, config_path;
  int64_t n_layer = 0, n_head = 0, n_embd = 0, vocab_size = 0, n_positions = 0;
  std::string optimizer = "hybridadam";
  int64_t batch = 4, seq = 128, steps = 3, threads = 0;  // seq 0: min(128, n_positions)
  // > 0: passes over `data` instead of `steps` (Note [Epochs]).
  double epochs = 0;
  uint64_t seed = 0;
  double dropout = -1;  // < 0: the config's
  optim::AdamHyper hyper;
  // Note [Weight decay by ranges]: the matrices only (HF Trainer's, nanoGPT's), or all.
  optim::DecayOn decay_on = optim::DecayOn::kMatrices;
  Device device = Device::cpu();
  // sim: the simulated device's capacity; cuda: a cap below the GPU's memory (0: none).
  int64_t device_capacity_limit_bytes = 0;
  // The training loop (Note [LR schedule], Note [Updates after backward]).
  LrScheduleKind lr_schedule = LrScheduleKind::kConstant;
  int64_t warmup_steps = 0;
  double min_lr = 0;
  double grad_clip = 0;  // > 0: clip the global L2 norm to this
  int64_t grad_accum = 1;
  // Data (Note [Data position]): "" = seeded random tokens.
  std::string data, val_data;
  bool shuffle = false;
  uint64_t data_seed = 0;
  int64_t eval_every = 0, eval_batches = 20;
  bool eval_only = false;
  // Note [Best model and early stopping]: the model at the lowest val loss so far, saved there
  // (""); stop after this many evaluations in a row without a lower one (0: never).
  std::string save_best;
  // The dtype of the tensors --save and --save-best write (Note [Saving in bf16 or fp16]).
  DType save_dtype = DType::F32;
  int64_t early_stop = 0;
  // Checkpoints (Note [Checkpoint layout]).
  std::string checkpoint_dir, resume;
  int64_t checkpoint_every = 0, keep = 0;
  std::string log, save;
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
  // Note [16-bit copies] (offload/gemini): under --precision bf16|fp16, Gemini copies the chunks
  // of the blocks' matrices to the device in that dtype (--chunk-copy-dtype auto), and ZeRO 3
  // gathers them in it (Note [16-bit parameter gathers], zero3_low.cpp); off: f32.
  bool gemini_low_copies = true;
  // The memory plan (docs/reliability.md): print it and stop; run without checking it.
  bool plan_only = false, skip_memory_check = false;
  // Mixed precision (docs/precision.md): F32, or the autocast dtype BF16/F16 (F16: loss scaling).
  DType precision = DType::F32;
  optim::LossScalerOptions loss_scaler;  // fp16 (tests set a scale that overflows)
  // The tokenizer (data/tokenizer_files.h): these files, else --init-from's or the resumed
  // checkpoint's, else the one beside the shards (Note [Tokenizer beside the shards]). --save and
  // checkpoints copy it into the model folder.
  std::string vocab, merges, tokenizer;
  // --save records the run's --dropout instead of the config's.
  bool save_run_dropout = false;
  // Note [Sampling during training]: every sample_every updates (0: never).
  int64_t sample_every = 0, sample_tokens = 32;
  std::string sample_prompt;               // text (needs the tokenizer)
  std::vector<int32_t> sample_prompt_ids;  // or ids; neither: <|endoftext|> (the eos id)
  gpt2::SamplingOptions sampling;

  // Data parallel and ZeRO (train/data_parallel.h, docs/distributed.md): the job's communicator
  // (null: this process alone); --batch stays the GLOBAL batch, split across the ranks.
  std::shared_ptr<dist::Communicator> comm;
  int zero_stage = 0;
  // Under Gemini with --zero 2|3: the share of chunks whose parameters are sharded too (Note
  // [Sharded parameters]); < 0: 1 for --zero 3, 0 for --zero 2.
  double shard_param_frac = -1;
  double gemini_shard_param_frac() const {
    return shard_param_frac >= 0 ? shard_param_frac : zero_stage == 3 ? 1.0 : 0.0;
  }
  int64_t bucket_bytes = int64_t{25} << 20;
  // Several ranks, a ZeRO stage, or NCCL (its one rank's collectives are real ones too; and its
  // stand-in, Note [Device memory on the CPU]).
  bool data_parallel() const {
    return comm && (comm->size() > 1 || zero_stage > 0 || comm->required_memory().has_value());
  }

  // True when parameters are updated after backward (Note [Updates after backward]); fp16 too: a
  // step with overflowing gradients must be skippable (Note [Dynamic loss scaling]).
  bool updates_after_backward() const {
    return grad_clip > 0 || grad_accum > 1 || precision == DType::F16;
  }
  // --update-in-backward, where nothing needs every gradient first (under data parallel: Gemini's
  // Note [Updates as reductions complete]).
  bool steps_in_backward() const { return update_in_backward && !updates_after_backward(); }
  // Gemini's Note [Updates in the last backward] (offload/gemini/deferred.cpp): with accumulation
  // alone the divisor (1/K) is known before backward, so each chunk is updated in the step's last
  // backward once complete; clipping and fp16's loss scaling need every gradient first.
  bool updates_in_last_backward() const {
    return update_in_backward && grad_accum > 1 && grad_clip <= 0 && precision != DType::F16;
  }
};

// Note [Sampling during training]: --sample-every N prints a sample from the weights after every
// Nth update. It runs the KV-cache decoder (models/gpt2/generate.h), which reads the parameters in
// place without autograd or dropout and draws from its own SplitMix64 seeded by --sample-seed (the
// same seed each time: samples differ only by the weights). It never touches default_generator()
// (dropout), the data position, the gradients or the optimizer, so a run with sampling gives bit
// for bit the losses and weights of one without (a test checks). With NVMe offload the parameters
// are in RAM (only Adam states are on disk); the optimizer's write-backs are flushed first, as a
// checkpoint does. Under Gemini the parameters live in chunks that move between the device, the
// host and the disk, and on a GPU they are device memory, so the decoder cannot read them in
// place: there each new token costs one no-grad forward of the whole context (batch 1, eval mode,
// inside Gemini's evaluation scope, Note [Evaluation forward]) and the same sampler takes the last
// row of the logits. That is t forwards of up to t positions instead of t decoder steps, fine for
// the few dozen tokens of a progress sample; the logits equal the decoder's up to f32 summation
// order. Both run in f32 at every --precision: the parameters are f32 (Gemini's chunks too), and
// a forward under bf16/fp16 autocast would draw other tokens than the decoder from the same
// weights, so the sample would depend on the placement (found by tools/auto_sweep.py bitwise).
// The training run is untouched either way (tests/apps/train_sampling_test.cpp).

// The model's config from the options: preset / --init-from / --config, then the shape overrides,
// validated. Warnings (unknown config.json fields) go to `warn`.
gpt2::Config resolve_config(const TrainOptions& o, const std::function<void(std::string)>& warn);

using optim::global_grad_norm;  // optim/grad_norm.h

struct StepResult {
  int64_t step = 0;  // 0-based index of the update just made ("[step] loss: ...")
  double loss = 0;   // mean over the micro-batches
  double lr = 0;
  double grad_norm = -1;  // before clipping; < 0 when not computed (updated in backward)
  bool clipped = false;
  bool skipped = false;   // fp16: inf/nan gradients, no update (Note [Dynamic loss scaling])
  double loss_scale = 0;  // fp16: the scale after this step; 0 otherwise
  double step_ms = 0, forward_ms = 0, backward_ms = 0, step_cpu_ms = 0;
  int64_t tokens = 0;  // trained on in this update
  int64_t epoch = 0;   // of the training data (0 for random tokens)
};

struct EvalResult {
  double loss = 0, perplexity = 0;
  int64_t batches = 0;
};

// What an evaluation meant for --save-best and --early-stop (Trainer::keep_best).
struct BestVerdict {
  bool best = false;  // the lowest val loss so far (saved to --save-best when given)
  bool stop = false;  // --early-stop: that many evaluations without a lower loss
  std::string text;   // " | best so far, saved to DIR" or " | best 3.100 at step 300 (...)"
};

class DataParallel;
struct ShardLayout;

// Note [16-bit copies] (offload/gemini/low_copies.cpp): under --precision bf16|fp16 and
// --chunk-copy-dtype auto, the tensors Gemini may copy to the device in 16 bits.
void set_low_copies(const TrainOptions& o, const gpt2::Config& config, gemini::GeminiOptions& g);

class Trainer {
 public:
  using Print = std::function<void(const std::string&)>;
  // Builds everything (printing the setup lines through `print`), or, with plan_only, prints the
  // memory plan and stops (planned_only()). Resumes from options.resume when set.
  Trainer(TrainOptions options, Print print);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  bool planned_only() const { return planned_only_; }
  const TrainOptions& options() const { return o_; }
  const gpt2::Config& config() const { return config_; }
  gpt2::GPT2& model() { return *model_; }
  optim::Optimizer& optimizer() { return *opt_; }
  optim::HybridAdam* hybrid() { return hybrid_; }
  gemini::Gemini* gemini() { return gem_; }

  int64_t step() const { return step_; }  // updates done (continues after a resume)
  int64_t first_step() const { return first_step_; }
  int64_t total_steps() const { return total_steps_; }
  bool done() const { return step_ >= total_steps_; }
  double lr_at(int64_t step) const { return schedule_.lr_at(step); }
  // Tests: the base learning rate from the next step on (an infinite one breaks every update).
  void set_learning_rate_for_testing(double lr) {
    schedule_ = {o_.lr_schedule, lr, o_.min_lr, o_.warmup_steps, total_steps_};
  }

  StepResult train_step();
  bool has_validation() const { return val_ != nullptr; }
  bool eval_due() const;  // after the update just made (and at the end)
  EvalResult evaluate();
  // After each evaluation of a training run: --save-best and --early-stop (Note [Best model and
  // early stopping]). Under data parallel every rank must call it (they agree on the verdict).
  BestVerdict keep_best(const EvalResult& e);
  const BestValidation& best_validation() const { return best_; }
  // "Stopped early after step N (--early-stop K): ..." with its newline.
  std::string early_stop_text() const;
  // A resumed run whose checkpoint's step was due an evaluation that a stop signal skipped (the
  // checkpoint records its run's last evaluation; one of a run that never evaluated, or written
  // before the record existed, makes nothing up: that run may have evaluated there).
  bool missed_evaluation() const {
    return !resumed_path_.empty() && eval_recorded_ && !done() && eval_due();
  }
  bool checkpoint_due() const;
  bool sample_due() const;
  // "[12] sample: <prompt><continuation>" (or "[12] sample ids: 5,17,..." without a tokenizer).
  std::string sample();
  // A sampled id that ends the sample: the config's eos_token_id (as transformers' generate), or
  // the tokenizer's <|endoftext|> (without a tokenizer the samples ran on past it until session
  // 38).
  bool ends_sample(int32_t id) const;
  std::optional<int32_t> tokenizer_eot() const;
  const data::TokenizerFiles& tokenizer_files() const { return tokenizer_files_; }
  // Rank 0 writes the checkpoint; under data parallel every rank must call it (under ZeRO each
  // sends its optimizer states, Note [ZeRO checkpoints]; every rank then waits until rank 0 has
  // put the folder in place). Returns the folder (rank 0's, on every rank).
  std::string save_checkpoint();
  // --save-optimizer, once (later calls return the same line): rank 0 writes the file; under ZeRO
  // every rank must call it. "Saved optimizer state to ...\n", or "" without the option.
  std::string save_optimizer_output();
  // Waits for the optimizer's last write-backs; call after the last step.
  void flush();
  // Rank 0 writes the model; under ZeRO 3 every rank must call it (the parameters are gathered).
  void save_model(const std::string& dir, DType dtype = DType::F32);
  // ZeRO 3: evaluating, sampling and saving are collective (Note [ZeRO stage 3]).
  bool shards_parameters() const;
  // The step's offload counters for the log: Gemini's (chunks) and, where HybridAdam keeps
  // states on disk, the bytes its engine read and wrote since the last call
  // (adam_nvme_read_bytes, adam_nvme_write_bytes). Empty without either.
  json::Value take_offload_step_stats();
  // The closing lines (time, memory per tier, NVMe, Gemini, activation offload), writing the
  // --trace, --nvme-timeline and --save-optimizer outputs on the way.
  std::string finish_report(double total_s);
  // --eval-only's last line: the host allocator's peak and the device's, beside the plan's.
  std::string peaks_text() const;
  // Memory per tier for the progress line: "RSS 1330 MiB | sim:0 peak 736 MiB | NVMe 474 MiB".
  std::string memory_text() const;
  const std::vector<double>& step_ms() const { return step_ms_; }
  // Data parallel (trainer_dist.cpp): null for one process; rank 0 alone prints and writes.
  DataParallel* data_parallel() { return dp_.get(); }
  bool is_root() const;
  // `local` (this rank's stop signal, 0 for none), or under data parallel with --checkpoint-dir,
  // --save-best or --early-stop the ranks' agreement (one 8-byte all_reduce: every rank must call
  // it): a rank's own signal, or SIGTERM when another rank got one. So all of them skip the
  // evaluation's collective verdict, write the checkpoint of the same step and stop together (at
  // ZeRO stage 0 too: mpirun's SIGTERM reaches the ranks at other steps).
  int stop_signal_of_any_rank(int local);
  // Collective under data parallel: returns once rank 0 has written what it saves (a checkpoint,
  // --save, --save-optimizer), so that a rank stopping with 130/143 after it (Note [Stop
  // signals]) cannot have mpirun kill rank 0 mid-write.
  void await_root_saves();
  int64_t local_batch() const;  // this rank's rows of the global --batch
  // "Data parallel: ..." closing lines (communication per step, overlap, per-rank memory); "" for
  // one process.
  std::string data_parallel_report() const;

 private:
  void write_optimizer_output();  // save_optimizer_output's file, in the model's layout
  void build_model();
  void check_updates_finite();  // Note [Non-finite values]
  void build_optimizer();
  void build_recomputation();
  void check_resumable(const std::string& dir);  // --steps and the options the data depends on
  void check_ranks_resume_one_step() const;      // under data parallel (trainer_dist.cpp)
  void resume_from(const std::string& dir);
  // HybridAdam's or AdamW's (one file format, Note [Optimizer checkpoint format]).
  void save_optimizer_state(const std::string& file);
  // saved_layout: the checkpoint's (Note [Optimizer layouts]); null: this run's.
  void load_optimizer_state(const std::string& file, const json::Value* saved_layout = nullptr);
  optim::StateFileMap optimizer_layout() const;  // this run's file layout, over the model's params
  void load_optimizer_state_remapped(const std::string& file, const optim::StateFileMap& saved,
                                     const optim::StateFileMap& now);
  void check_data_parallel_options() const;
  void connect_gemini();  // Note [Gemini under data parallel]
  std::unique_ptr<DataParallel> make_zero3(gpt2::ParameterFactory& factory);
  // Per model parameter, whether o_.decay_on decays it; per stepped tensor (the model's
  // parameters or this rank's pieces), what it leaves alone (weight_decay.cpp).
  std::vector<char> decayed_parameters() const;
  std::vector<optim::NoDecayRanges> optimizer_no_decay() const;
  // ZeRO stages 1-3: the optimizer holds this rank's pieces (trainer_dist.cpp).
  bool shards_optimizer() const;
  ShardLayout gemini_shard_layout() const;                     // Note [Sharded optimizer states]
  void save_sharded_optimizer_state(const std::string& file);  // collective; rank 0 writes
  json::Value run_fingerprint() const;
  // Refuses a resume whose data would differ; warns about any other change that makes the run no
  // longer the uninterrupted one. `step`: the checkpoint's.
  void check_fingerprint(const json::Value& saved, const std::string& path, int64_t step) const;
  void set_step_scalars(double lr, float div_scale);
  void mark_phase(const char* phase);
  double micro_step(int64_t k, std::vector<int32_t>& tokens, StepResult& r);
  bool measure_and_scale_gradients(StepResult& r);
  void micro_batch(int64_t index, std::vector<int32_t>& tokens) const;
  void lock_outputs();                  // Note [One writer per output]
  void load_tokenizer();                // and checks the sampling prompt against it
  void check_shard_tokenizers() const;  // Note [Shard tokenizer stamp]
  const data::TokenShard* first_stamped_shard(std::string* option) const;
  data::TokenizerFiles tokenizer_beside_shards() const;  // Note [Tokenizer beside the shards]
  void open_inputs();                         // --data, --val-data, --load-optimizer's file
  void steps_from_epochs();                   // Note [Epochs]
  std::vector<int32_t> sample_by_forwards();  // Note [Sampling during training]
  void setup_data_parallel();  // checks the options, splits the work, broadcasts the weights
  void keep_rank_rows(std::vector<int32_t>& tokens) const;  // of the global batch's B x T

  TrainOptions o_;
  Print print_;
  bool planned_only_ = false;
  std::vector<data::OutputLock>
      output_locks_;  // --checkpoint-dir, --log (Note [One writer per output])
  gpt2::Config config_, saved_config_;
  LrSchedule schedule_;
  std::string weights_from_;  // --init-from, or the resumed checkpoint's model folder
  std::string resumed_path_;
  TrainState resumed_state_;     // verified (verify_checkpoint) before the model is built
  BestValidation best_;          // Note [Best model and early stopping]
  int64_t last_eval_step_ = -1;  // the step of the last evaluation (a resume does not repeat it)
  bool eval_recorded_ = false;   // the resumed checkpoint recorded last_eval_step
  int64_t val_windows_ = 0;      // whole --seq windows in --val-data (Note [Evaluation windows])
  // Steps the fp16 loss scaler skipped since the optimizer's step 0, in any precision since: the
  // optimizer's step count is step_ minus these (Note [Skipped steps], resume.cpp).
  int64_t skipped_steps_ = 0;
  std::string optimizer_saved_;  // save_optimizer_output's line once written
  std::unique_ptr<gemini::Gemini> gemini_owned_;
  std::unique_ptr<gpt2::GPT2> model_;
  std::unique_ptr<optim::Optimizer> opt_;
  gemini::Gemini* gem_ = nullptr;
  optim::HybridAdam* hybrid_ = nullptr;
  int64_t nvme_read_logged_ = 0, nvme_written_logged_ = 0;  // take_offload_step_stats's totals
  int64_t all_gather_logged_ = 0, reduce_scatter_logged_ = 0;
  std::unique_ptr<gemini::Trace> trace_;
  std::unique_ptr<offload::ActivationOffloader> offloader_;
  std::unique_ptr<optim::DynamicLossScaler> scaler_;  // fp16 only
  std::unique_ptr<TokenStream> train_data_, val_;
  data::TokenizerFiles tokenizer_files_;
  std::unique_ptr<data::BpeTokenizer> tokenizer_;
  std::vector<std::pair<std::string, std::string>> tokenizer_bytes_;  // what a save writes
  std::vector<int32_t> sample_prompt_;
  int64_t step_ = 0, first_step_ = 0, total_steps_ = 0;
  int64_t micro_ = 0;  // next training micro-batch (Note [Data position])
  std::vector<double> step_ms_, forward_ms_, backward_ms_, step_cpu_ms_;
  std::vector<std::pair<std::string, double>> phase_ms_;
  std::unique_ptr<DataParallel> dp_;  // last: destroyed first, before the model it hooks
};

}  // namespace mw::train
