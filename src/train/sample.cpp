// The Trainer's inputs besides the model (its data, the optimizer file to load, its tokenizer), its
// evaluations (Note [Evaluation windows]) and its samples during training (Note [Sampling during
// training], trainer.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "autograd/autocast.h"
#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "core/error.h"
#include "optim/adam_state_file.h"
#include "train/data_parallel.h"
#include "train/run_paths.h"
#include "train/trainer.h"

namespace mw::train {

void Trainer::open_inputs() {
  // Before the model is built (xl: half a minute, gigabytes): a missing, short or foreign input
  // file is refused at once (docs/reliability.md).
  std::vector<std::string> train_shards;
  if (!o_.data.empty()) {
    train_shards = resolve_shards(o_.data, "train", "--data");
    train_data_ = std::make_unique<TokenStream>(train_shards, o_.shuffle, o_.data_seed);
    train_data_->check_vocab(config_.vocab_size);
    train_data_->check_length(o_.seq, "--data");
    // The files behind the checkpoint's --data path changed (tokens added, or re-tokenized):
    // batch i is read from another stream (Note [Data position]). Told by the token count, as
    // reading gigabytes to checksum them would delay every resume.
    const json::Value* before =
        resumed_path_.empty() ? nullptr : resumed_state_.run.find("data_tokens");
    if (before && before->is_number() && before->as_double() != train_data_->num_tokens())
      print_(str("gpt2_train: warning: resuming '", resumed_path_, "' with --data holding ",
                 train_data_->num_tokens(), " tokens (the checkpoint's run read ", before->dump(),
                 "): the run goes on from the same batch index, but reads other ",
                 "tokens than the uninterrupted run's\n"));
  }
  if (!o_.val_data.empty()) {
    const std::vector<std::string> val_shards = resolve_shards(o_.val_data, "val", "--val-data");
    val_ = std::make_unique<TokenStream>(val_shards, false, 0, "--val-data");
    val_->check_vocab(config_.vocab_size);
    val_->check_length(o_.seq, "--val-data");
    // Note [Evaluation windows]: an evaluation reads whole --seq windows of --val-data, each at
    // most once (evaluate()).
    val_windows_ = val_->num_tokens() / o_.seq;
    if (o_.eval_batches * o_.batch > val_windows_) {
      const int64_t batches = (val_windows_ + o_.batch - 1) / o_.batch;
      print_(str("Evaluation: all ", val_windows_, " windows of --seq ", o_.seq,
                 " in --val-data's ", val_->num_tokens(), " tokens (the last ",
                 val_->num_tokens() % o_.seq, " unread), in ", batches, " batch",
                 batches > 1 ? "es" : "", " (--eval-batches ", o_.eval_batches,
                 " would read past its end)\n"));
    }
    // A glob such as 'data/*.bin' takes the val_ shards too: the validation loss would be measured
    // on tokens the model trains on, and fall with memorisation.
    for (const std::string& v : val_shards)
      if (std::any_of(train_shards.begin(), train_shards.end(),
                      [&](const std::string& t) { return same_path(t, v); })) {
        print_(str("gpt2_train: warning: the --val-data shard '", v, "' is also a --data shard: ",
                   "the validation loss is measured on training tokens; pass --data only the ",
                   "train shards (e.g. a directory, which reads its train_*.bin)\n"));
        break;
      }
  }
  // Its magic only: its tensors are checked against the optimizer's layout once that exists.
  if (!o_.load_optimizer.empty()) {
    optim::AdamStateReader file(o_.load_optimizer);
    optim::check_magic(file);
  }
}

namespace {
std::string hex64(uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
  return text;
}
}  // namespace

// Note [Shard tokenizer stamp]: the stamped shards of --data and --val-data name one tokenizer,
// and it is this run's (the one --save writes beside the model, and samples decode with).
void Trainer::check_shard_tokenizers() const {
  std::string first_option;
  const data::TokenShard* first = first_stamped_shard(&first_option);
  for (const auto& [stream, option] :
       {std::pair{train_data_.get(), "--data"}, std::pair{val_.get(), "--val-data"}}) {
    if (!stream || !first) continue;
    for (const data::TokenShard& shard : stream->shards()) {
      if (!shard.tokenizer() || &shard == first) continue;
      const data::ShardTokenizer &a = *first->tokenizer(), &b = *shard.tokenizer();
      MW_CHECK_T(InvalidArgument, a == b, "the ", first_option, " shard '", first->path(),
                 "' and the ", option, " shard '", shard.path(), "' were tokenized with different ",
                 "tokenizers (vocabularies of ", a.vocab_size, " and ", b.vocab_size,
                 " tokens, fingerprints ", hex64(a.fingerprint), " and ", hex64(b.fingerprint),
                 "): an id means other text in each; tokenize every shard with one tokenizer");
    }
  }
  if (!first || !tokenizer_) return;
  const data::ShardTokenizer& stamp = *first->tokenizer();
  const std::string& source = tokenizer_files_.source();
  const bool models = o_.vocab.empty() && o_.tokenizer.empty();  // found beside the weights
  MW_CHECK_T(
      InvalidArgument, stamp.fingerprint == tokenizer_->fingerprint(), "the ", first_option,
      " shard '", first->path(), "' was tokenized with another tokenizer (", stamp.vocab_size,
      " tokens, fingerprint ", hex64(stamp.fingerprint), ") than this run's '", source, "' (",
      tokenizer_->vocab_size(), " tokens, fingerprint ", hex64(tokenizer_->fingerprint()),
      models ? ", the model's" : "",
      "): the model would learn ids that mean other text. Tokenize the corpus with it (",
      "gpt2_tokenize ",
      tokenizer_files_.tokenizer_json.empty()
          ? str("--vocab ", tokenizer_files_.vocab_json, " --merges ", tokenizer_files_.merges_txt)
          : str("--tokenizer ", tokenizer_files_.tokenizer_json),
      ")", models ? "" : ", or pass the tokenizer the shards were made with");
}

// Note [Epochs]: --epochs E trains for E passes over --data (a fraction allowed) instead of a
// number of steps, as HF's num_train_epochs does: one pass is N / T sequences of the stream's N
// tokens in order, floor(N / T) windows shuffled (Note [Data position]), and a step reads
// --batch x --grad-accum of them (the global batch under data parallel), so --steps is
// ceil(E x sequences / (batch x grad_accum)); the schedule (--lr-schedule cosine|linear) ends with
// the last pass. Headers only are read here, before the plan and the resume checks that take
// --steps; the count is the same for a resumed run on the same data.
void Trainer::steps_from_epochs() {
  MW_CHECK_T(InvalidArgument, !o_.data.empty(),
             "--epochs counts passes over --data: pass --data (or --steps for random tokens)");
  int64_t tokens = 0;
  for (const std::string& path : resolve_shards(o_.data, "train", "--data"))
    tokens += data::TokenShard(path).num_tokens();
  const double sequences =
      o_.shuffle ? static_cast<double>(tokens / o_.seq) : static_cast<double>(tokens) / o_.seq;
  const double per_step = static_cast<double>(o_.batch * o_.grad_accum);
  const double steps = std::ceil(o_.epochs * sequences / per_step);
  constexpr double kMaxSteps = static_cast<double>(int64_t{1} << 40);  // --steps' own limit
  MW_CHECK_T(InvalidArgument, steps <= kMaxSteps, "--epochs ", o_.epochs, " of --data's ", tokens,
             " tokens is ", steps, " steps, more than the 2^40 a run may take; pass fewer epochs");
  o_.steps = std::max<int64_t>(1, static_cast<int64_t>(steps));
  print_(str("Steps: ", format_thousands(o_.steps), " (", o_.epochs, " epoch",
             o_.epochs == 1 ? "" : "s", " of --data's ", format_thousands(tokens),
             " tokens: ", format_fixed(sequences, 1), " sequences of ", o_.seq, " per epoch, ",
             o_.batch * o_.grad_accum, " per step)\n"));
}

// The first shard of --data, else of --val-data, that names its tokenizer; nullptr when none does.
const data::TokenShard* Trainer::first_stamped_shard(std::string* option) const {
  for (const auto& [stream, name] :
       {std::pair{train_data_.get(), "--data"}, std::pair{val_.get(), "--val-data"}}) {
    if (!stream) continue;
    for (const data::TokenShard& shard : stream->shards())
      if (shard.tokenizer()) {
        if (option) *option = name;
        return &shard;
      }
  }
  return nullptr;
}

// Note [Tokenizer beside the shards]: gpt2_tokenize writes the tokenizer it used into its --out,
// beside the shards (--train-bpe's learned vocab.json + merges.txt, or a copy of the files it was
// given). A run that names no tokenizer, on weights that carry none (a new model, or weights saved
// without one), takes the one beside its first stamped shard when that one's fingerprint is the
// shard's stamp (Note [Shard tokenizer stamp]). Without it, `gpt2_tokenize --train-bpe 8192 --out
// tok my.txt` then `gpt2_train --data tok --save m` saved a model without a tokenizer: its samples
// during training were ids, and `gpt2_generate --model m --prompt ...` failed with "no tokenizer in
// 'm'". Files there of another fingerprint are left alone, and a run that ends with stamped shards
// and no tokenizer says what its saves will lack.
data::TokenizerFiles Trainer::tokenizer_beside_shards() const {
  const data::TokenShard* shard = first_stamped_shard(nullptr);
  if (!shard) return {};
  const std::string dir = std::filesystem::path(shard->path()).parent_path().string();
  data::TokenizerFiles files = data::find_tokenizer_files("", "", "", dir.empty() ? "." : dir);
  if (!files.known()) return {};
  try {
    if (data::load_tokenizer(files)->fingerprint() == shard->tokenizer()->fingerprint) return files;
  } catch (const Error& e) {
    print_(str("gpt2_train: warning: the tokenizer beside the shards cannot be read (", e.what(),
               "); this run uses none\n"));
  }
  return {};
}

void Trainer::load_tokenizer() {
  // --init-from's folder, or the resumed checkpoint's model folder (a save copies the files there).
  tokenizer_files_ = data::find_tokenizer_files(o_.vocab, o_.merges, o_.tokenizer, weights_from_);
  if (!tokenizer_files_.known()) tokenizer_files_ = tokenizer_beside_shards();
  tokenizer_ = data::load_tokenizer(tokenizer_files_);
  tokenizer_bytes_ = data::read_tokenizer_files(tokenizer_files_);
  // A tokenizer by option over the one saved with the --init-from (or resumed) weights: their
  // embeddings learned that one's ids (a new vocabulary on trained weights must re-learn them).
  if (tokenizer_ && (!o_.vocab.empty() || !o_.tokenizer.empty()))
    if (const std::string w = data::other_than_models_tokenizer(*tokenizer_, weights_from_);
        !w.empty())
      print_("gpt2_train: " + w + "\n");
  if (tokenizer_) {
    const std::string& source = tokenizer_files_.source();
    MW_CHECK_T(InvalidArgument, tokenizer_->vocab_size() <= config_.vocab_size, "the tokenizer '",
               source, "' has ", tokenizer_->vocab_size(), " tokens but the model only ",
               config_.vocab_size, "; pass the model's tokenizer (or --vocab-size ",
               tokenizer_->vocab_size(), " for a new model)");
    const std::optional<int32_t> eot = tokenizer_->token_id(data::kEndOfText);
    if (eot && *eot != config_.eos_token_id && o_.init_from.empty() && o_.config_path.empty()) {
      // A new model's end of text is its tokenizer's (one with tokens added after
      // <|endoftext|> has it before the last id, which the vocabulary's size alone would name).
      for (gpt2::Config* c : {&config_, &saved_config_}) c->bos_token_id = c->eos_token_id = *eot;
    } else if (eot && *eot != config_.eos_token_id) {
      print_(str("gpt2_train: warning: the tokenizer's <|endoftext|> is id ", *eot,
                 " but the config's eos_token_id is ", config_.eos_token_id,
                 "; generation_config.json records the config's\n"));
    }
    print_(str("Tokenizer: ", source, " (", tokenizer_->vocab_size(), " tokens; --save and ",
               "checkpoints write it beside the model)\n"));
  }
  check_shard_tokenizers();
  std::string option;
  const data::TokenShard* stamped = first_stamped_shard(&option);
  if (!tokenizer_ && stamped &&
      (!o_.save.empty() || !o_.save_best.empty() || !o_.checkpoint_dir.empty()))
    print_(str("gpt2_train: warning: the ", option, " shard '", stamped->path(), "' was made by a ",
               "tokenizer of ", stamped->tokenizer()->vocab_size, " tokens that this run does not ",
               "know (none given, none beside the shards or the weights): the saved model will ",
               "hold no tokenizer, and gpt2_generate will need --prompt-ids or the tokenizer's ",
               "files; pass --vocab and --merges (or --tokenizer) of the one the shards were made ",
               "with\n"));
  if (o_.sample_every <= 0) return;
  if (!o_.sample_prompt_ids.empty()) {
    sample_prompt_ = o_.sample_prompt_ids;
  } else if (!o_.sample_prompt.empty()) {
    MW_CHECK_T(InvalidArgument, tokenizer_ != nullptr,
               "--sample-prompt is text and this run knows no tokenizer: pass --vocab and --merges "
               "(or --tokenizer), or give the prompt as --sample-prompt-ids");
    sample_prompt_ = tokenizer_->encode_prompt(o_.sample_prompt);
  }
  const bool given = !sample_prompt_.empty();
  if (!given)  // GPT-2's unconditional samples start from <|endoftext|>
    sample_prompt_ = {tokenizer_eot().value_or(static_cast<int32_t>(config_.eos_token_id))};
  // Ids past the tokenizer's (a padded vocabulary's) have no text: refused here, where they
  // stopped the run at its first sample.
  const int64_t ids = tokenizer_ ? tokenizer_->vocab_size() : config_.vocab_size;
  for (int32_t id : sample_prompt_)
    MW_CHECK_T(InvalidArgument, id >= 0 && id < ids, "the sampling prompt holds token ", id,
               given ? ""
                     : " (no prompt given: the config's eos_token_id, for want of a "
                       "<|endoftext|> in the tokenizer)",
               " but the ", tokenizer_ ? "tokenizer" : "model", " has ", ids, " tokens (ids 0..",
               ids - 1, "); pass --sample-prompt or --sample-prompt-ids");
  MW_CHECK_T(InvalidArgument, static_cast<int64_t>(sample_prompt_.size()) < config_.n_positions,
             "the sampling prompt is ", sample_prompt_.size(), " tokens, and the model's context ",
             "holds ", config_.n_positions, ": shorten it so that tokens can follow");
}

bool Trainer::sample_due() const { return o_.sample_every > 0 && step_ % o_.sample_every == 0; }

// As gpt2::generate, one full forward per token (Note [Sampling during training]).
std::vector<int32_t> Trainer::sample_by_forwards() {
  std::optional<gemini::EvalScope> gemini_eval;
  if (gem_) gemini_eval.emplace(*gem_);
  // In f32 at every --precision, as the decoder (Note [Sampling during training]).
  NoGradGuard no_grad;
  model_->eval();
  gpt2::Sampler sampler(o_.sampling);
  std::vector<int32_t> context = sample_prompt_, generated;
  for (int64_t i = 0; i < o_.sample_tokens; ++i) {
    const auto t = static_cast<int64_t>(context.size());
    const Tensor logits = (*model_)(Tensor::from_vector(context, {1, t}, o_.device));
    const std::vector<float> last =
        logits.narrow(1, t - 1, 1).to(Device::cpu()).to(DType::F32).contiguous().to_vector<float>();
    int32_t id = sampler.next(last, context);
    // Every rank draws the same id from the same logits, on equal machines. Where they differ
    // (other GPUs, another GEMM algorithm) one id more or less would unmatch the forwards'
    // gathers and hang the ranks at the end of text: rank 0's id is everyone's.
    if (shards_parameters() && o_.comm && o_.comm->size() > 1)
      id = static_cast<int32_t>(dist::value_from_rank0(*o_.comm, id));
    generated.push_back(id);
    if (ends_sample(id)) break;
    if (t >= config_.n_positions) break;  // the next token would have no position
    context.push_back(id);
  }
  model_->train();
  return generated;
}

// The config's eos ids, as gpt2_generate on the saved model and HF's generate stop (the
// tokenizer's <|endoftext|> stopped it too until session 41, and a vocabulary without one, as
// many HF-trained ones with <s> and </s>, stopped the run at its first sample).
bool Trainer::ends_sample(int32_t id) const { return config_.is_eos(id); }

// A vocabulary may have no <|endoftext|>.

std::optional<int32_t> Trainer::tokenizer_eot() const {
  return tokenizer_ ? tokenizer_->token_id(data::kEndOfText) : std::nullopt;
}

// Note [Evaluation windows]: the first min(--eval-batches x --batch, W) of --val-data's W whole
// --seq windows, in order, the same at every evaluation; a last batch of fewer rows where W runs
// out; the mean over every scored token (T - 1 per window: the shifted cross-entropy's, as HF's
// non-overlapping perplexity recipe; llm.c and nanoGPT read T + 1 tokens per row and score T).
// Until session 38 a --val-data smaller than one batch was read with wrap-around (its first
// tokens counted twice in the mean) and a tail short of a whole batch was left out.
//
// Under data parallel each rank scores its own rows of every batch, as in training (rank r the
// rows [r x B/N, (r + 1) x B/N)), and the ranks add their sums: the same windows, the same mean to
// the last bits or so (another order of the sums), at 1/N of the work and of the logits' memory
// (the per-rank plan holds it). Until session 39 every rank scored the whole batch: N times the
// work, and logits of the global batch on every rank, which the plan did not count. A rank left
// without rows in a short last batch still runs a forward on one row, weighted 0: under ZeRO 3
// and Gemini's sharded chunks the forward's gathers are collectives every rank must join.
EvalResult Trainer::evaluate() {
  MW_CHECK_T(InvalidArgument, val_ != nullptr, "evaluation needs --val-data");
  // Evaluation draws no random numbers in eval mode; the generator is restored anyway, so that
  // evaluating can never change the training run (Note [Exact resume]).
  const RngState rng = default_generator().state();
  last_eval_step_ = step_;
  UncountedScope uncounted(dp_.get());  // not a training step's communication (ZeRO 3 gathers)
  model_->eval();
  EvalResult r;
  const int64_t B = o_.batch, T = o_.seq, local = local_batch();
  const int64_t first_row = dp_ ? dp_->rank() * local : 0;  // this rank's rows of each batch
  const int64_t windows = std::min(o_.eval_batches * B, val_windows_);
  std::vector<int32_t> tokens(static_cast<size_t>(B * T));
  double sum = 0;
  {
    // Note [Evaluation forward] (offload/gemini/deferred.cpp): Gemini's plan is left as it was.
    std::optional<gemini::EvalScope> gemini_eval;
    if (gem_) gemini_eval.emplace(*gem_);
    NoGradGuard no_grad;
    AutocastGuard autocast(o_.precision);
    for (int64_t b = 0; b * B < windows; ++b) {
      throw_if_stop_requested("during evaluation");
      const int64_t rows = std::min(B, windows - b * B);  // of the batch, all ranks together
      const int64_t mine = std::clamp<int64_t>(rows - first_row, 0, local);
      val_->batch(b, B, T, tokens.data());  // rows past `rows` are not used
      const auto from = tokens.begin() + (mine > 0 ? first_row * T : 0);
      Tensor ids =
          Tensor::from_vector(std::vector<int32_t>(from, from + std::max<int64_t>(1, mine) * T),
                              {std::max<int64_t>(1, mine), T}, o_.device);
      const double loss = shifted_cross_entropy((*model_)(ids), ids).item();
      if (mine > 0) sum += loss * static_cast<double>(mine);
      ++r.batches;
    }
  }
  if (dp_) sum = dp_->sum_over_ranks(sum);
  model_->train();
  default_generator().set_state(rng);
  r.loss = sum / static_cast<double>(std::max<int64_t>(1, windows));
  r.perplexity = std::exp(r.loss);
  return r;
}

std::string Trainer::sample() {
  flush();  // the optimizer's last write-backs land first (Note [Sampling during training])
  UncountedScope uncounted(dp_.get());  // ZeRO 3: every rank runs the same forwards (the same
                                        // logits, the same ids), whose gathers are left out
  const std::vector<int32_t> ids =
      (gem_ || o_.device.is_cuda() || shards_parameters())  // ZeRO 3: through the hooks
          ? sample_by_forwards()
          : gpt2::generate(*model_, sample_prompt_, o_.sample_tokens, o_.sampling,
                           [&](int32_t id) { return !ends_sample(id); });
  if (!tokenizer_) {
    std::string line = str("[", step_, "] sample ids:");
    for (size_t i = 0; i < ids.size(); ++i) line += str(i ? "," : " ", ids[i]);
    return line + "\n";
  }
  std::vector<int32_t> text_ids = sample_prompt_;
  const std::optional<int32_t> eot = tokenizer_eot();
  if (text_ids.size() == 1 && text_ids[0] == eot) text_ids.clear();
  for (int32_t id : ids)  // a padded vocabulary's ids past the tokenizer's have no text
    if (id != eot && id < tokenizer_->vocab_size()) text_ids.push_back(id);
  return str("[", step_, "] sample: ", tokenizer_->decode(text_ids), "\n");
}

}  // namespace mw::train
