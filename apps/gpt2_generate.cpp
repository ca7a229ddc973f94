// gpt2_generate: samples text from a GPT-2 in a HuggingFace folder with a KV cache
// (models/gpt2/generate.h), streaming each token as it comes.
//
// Text mode: --prompt is encoded with the folder's tokenizer (vocab.json + merges.txt, or
// tokenizer.json; or --vocab/--merges/--tokenizer), the prompt is echoed and the continuation
// streamed, stopping at <|endoftext|>, or before a --stop string (Note [Stop strings],
// models/gpt2/stop_strings.h). Without a prompt, sampling starts from <|endoftext|> (GPT-2's
// unconditional samples). Ids mode (--prompt-ids 1,2,3 --print-ids): no tokenizer is needed, and
// one line "ids: 5,17,..." lists the generated ids without the prompt.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "cli.h"
#include "data/bpe.h"
#include "data/file_io.h"
#include "data/tokenizer_files.h"
#include "models/gpt2/generate.h"
#include "models/gpt2/generation_config.h"
#include "models/gpt2/hf_io.h"
#include "models/gpt2/stop_strings.h"

using namespace mw;

namespace {

// The tokenizer named by the flags or found in the model folder; nullptr when there is none.
// A tokenizer by option other than the folder's own is warned about (Note [Shard tokenizer stamp]).
std::unique_ptr<data::BpeTokenizer> find_tokenizer(const cli::Parser& p, const std::string& dir) {
  std::unique_ptr<data::BpeTokenizer> tok = data::load_tokenizer(
      data::find_tokenizer_files(p.str("vocab"), p.str("merges"), p.str("tokenizer"), dir));
  if (tok && (!p.str("vocab").empty() || !p.str("tokenizer").empty()))
    if (const std::string w = data::other_than_models_tokenizer(*tok, dir); !w.empty())
      std::fprintf(stderr, "gpt2_generate: %s\n", w.c_str());
  return tok;
}

// The options as given, else the folder's generation_config.json (Note [Generation defaults]),
// else the options' own defaults.
gpt2::SamplingOptions sampling_options(const cli::Parser& p, const gpt2::GenerationDefaults& d) {
  auto real = [&](const char* name, const std::optional<double>& from_file, double lo, double hi) {
    return p.given(name) || !from_file ? p.real(name, lo, hi) : *from_file;
  };
  gpt2::SamplingOptions o;
  o.temperature = real("temperature", d.temperature, 0, 100);
  o.top_k = p.given("top-k") || !d.top_k ? p.integer("top-k", 0, INT32_MAX) : *d.top_k;
  o.top_p = real("top-p", d.top_p, 0, 1);
  o.seed = static_cast<uint64_t>(p.integer("seed", 0, INT64_MAX));
  o.repetition_penalty = real("repetition-penalty", d.repetition_penalty, 1e-3, 1e3);
  return o;
}

// No --prompt, or "": from <|endoftext|>, else the bos_token_id, as HF's generate starts.
int32_t unconditional_start(const data::BpeTokenizer& tok, const gpt2::Config& config) {
  const int64_t start =
      tok.token_id(data::kEndOfText).value_or(static_cast<int32_t>(config.bos_token_id));
  MW_CHECK_T(cli::UsageError, start >= 0 && start < config.vocab_size,
             "no --prompt to start from: the tokenizer has no <|endoftext|> and the config's "
             "bos_token_id is ",
             config.bos_token_id, " (the model has ", config.vocab_size,
             " tokens); pass --prompt or --prompt-ids");
  return static_cast<int32_t>(start);
}

// How a sample ended, for its summary line.
struct SampleEnd {
  bool end_of_text = false;           // the model wrote an eos_token_id
  const std::string* stop = nullptr;  // the --stop string it stopped at
  int64_t textless = 0;  // ids of a padded vocabulary past the tokenizer's: no text, as in training
};

// The line after a sample: tokens, time, rate, and why it ended when not at --max-new-tokens.
void print_summary(const gpt2::GPT2& model, const data::BpeTokenizer* tok, size_t prompt_tokens,
                   size_t new_tokens, double seconds, const gpt2::Slide& slide,
                   const SampleEnd& end) {
  const int64_t n_positions = model.config().n_positions;
  std::string notes;
  if (slide.prompt_dropped > 0)
    notes += str("; the prompt's first ", slide.prompt_dropped, " tokens did not fit the context",
                 " of ", n_positions, " (n_positions) and were left out");
  if (slide.slides > 0)
    notes += str("; the context slid ", slide.slides, " time", slide.slides > 1 ? "s" : "",
                 " (each keeping the last ", std::max<int64_t>(1, n_positions / 2), " tokens)");
  if (end.end_of_text) notes += "; stopped: an eos_token_id (the model ended the text)";
  if (end.stop) notes += str("; stopped at --stop '", gpt2::escape_stop_string(*end.stop), "'");
  if (end.textless > 0)
    notes += str("; ", end.textless, " of them past the tokenizer's ", tok->vocab_size(),
                 " ids (a padded vocabulary): no text");
  std::fprintf(stderr, "[generate] %zu prompt + %zu new tokens in %.2f s (%.1f tokens/s)%s\n",
               prompt_tokens, new_tokens, seconds,
               static_cast<double>(prompt_tokens + new_tokens) / std::max(seconds, 1e-9),
               notes.c_str());
}

void print_text(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

// One sample: the prompt echoed, the continuation streamed (or its ids), and the summary line.
// With --stop strings the text is streamed through gpt2::StopStrings (Note [Stop strings]): what
// may begin a stop string is held back until the next tokens tell, and is printed at the end when
// no stop string came.
// `eos`: the ids that end it (transformers' generate stops at any), beside the tokenizer's
// <|endoftext|>.
void sample_once(const gpt2::GPT2& model, const data::BpeTokenizer* tok,
                 const std::vector<int32_t>& prompt, int64_t max_new,
                 const gpt2::SamplingOptions& options, bool print_ids, const std::string& text,
                 const std::vector<std::string>& stops, const std::vector<int64_t>& eos) {
  const auto ends_text = [&eos](int32_t id) {
    return std::find(eos.begin(), eos.end(), id) != eos.end();
  };
  if (!print_ids && !text.empty()) print_text(text);
  const auto t0 = std::chrono::steady_clock::now();
  SampleEnd end;
  gpt2::StopStrings stop(stops);  // each sample its own
  gpt2::Slide slide;              // Note [Sliding context]: past n_positions, the context slides
  const auto generated = gpt2::generate(
      model, prompt, max_new, options,
      [&](int32_t id) {
        // transformers' generate stops at the eos_token_id, ids or text, and only there
        // (--print-ids sampled on past it until session 38; an eos list stopped at its first id
        // only until session 40; the tokenizer's <|endoftext|> stopped text too until session
        // 41, and a tokenizer without it stopped the run at the first token).
        if (ends_text(id)) return end.end_of_text = true, false;
        if (print_ids) return true;
        if (id >= tok->vocab_size()) return ++end.textless, true;
        print_text(stop.push(tok->token_bytes(id)));
        return !stop.stopped();
      },
      &slide);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (stop.stopped()) end.stop = &stop.matched();
  print_text(stop.finish());
  if (print_ids) {
    std::printf("ids: ");
    for (size_t i = 0; i < generated.size(); ++i) std::printf(i ? ",%d" : "%d", generated[i]);
  }
  std::printf("\n");
  std::fflush(stdout);
  print_summary(model, tok, prompt.size(), generated.size(), seconds, slide, end);
}

int run(cli::Parser& p) {
  if (!p.given("model"))
    throw cli::UsageError("--model DIR (a HuggingFace GPT-2 folder) is required");
  if (p.given("prompt") + p.given("prompt-ids") + p.given("prompt-file") > 1)
    throw cli::UsageError("--prompt, --prompt-file and --prompt-ids exclude each other");
  // The prompt's text: --prompt as given, or a file's (exactly: newlines, no shell quoting).
  const bool has_text = p.given("prompt") || p.given("prompt-file");
  const std::string text =
      p.given("prompt-file")
          ? data::read_text_file(p.str("prompt-file"), "--prompt-file", "pass a readable text file")
          : p.str("prompt");
  if (const std::string w = cli::escaped_newline_warning("prompt", p.str("prompt")); !w.empty())
    std::fprintf(stderr, "gpt2_generate: warning: %s, or use --prompt-file\n", w.c_str());
  const std::string dir = p.str("model");
  const gpt2::GenerationDefaults defaults = gpt2::read_generation_defaults(dir);
  if (!defaults.said.empty())
    std::fprintf(stderr,
                 "gpt2_generate: from %s/generation_config.json (as transformers' generate() "
                 "takes it): %s; options given here override it\n",
                 dir.c_str(), defaults.said.c_str());
  const int64_t max_new = p.given("max-new-tokens") || !defaults.max_new_tokens
                              ? p.integer("max-new-tokens", 1, INT32_MAX)
                              : std::max<int64_t>(1, *defaults.max_new_tokens);
  const int64_t samples = p.integer("num-samples", 1, 1000);
  const gpt2::SamplingOptions options = sampling_options(p, defaults);
  const bool print_ids = p.has("print-ids");
  if (p.given("stop") && print_ids)
    throw cli::UsageError(
        "--stop ends a sample at a text, and --print-ids prints ids, not text: leave out "
        "--print-ids to stop at a text, or --stop to print the ids");
  std::vector<std::string> stops;
  for (const std::string& typed : p.values("stop"))
    stops.push_back(gpt2::unescape_stop_string(typed));
  if (samples > 1 && options.temperature == 0)
    std::fprintf(stderr,
                 "gpt2_generate: warning: --temperature 0 is greedy: the %lld samples "
                 "will be the same text\n",
                 static_cast<long long>(samples));
  gpt2::GPT2 model(gpt2::load_hf_config(dir, "--model"));
  for (const std::string& key : model.config().unknown_fields)
    std::fprintf(stderr,
                 "gpt2_generate: warning: %s/config.json: field \"%s\" is not a GPT2Config "
                 "field; ignored\n",
                 dir.c_str(), key.c_str());
  // generation_config.json's eos_token_id over config.json's, as generate() takes them.
  std::vector<int64_t> eos = defaults.eos_token_ids.value_or(std::vector<int64_t>{});
  if (!defaults.eos_token_ids) {
    if (model.config().eos_token_id >= 0) eos.push_back(model.config().eos_token_id);
    for (int64_t id : model.config().more_eos_token_ids) eos.push_back(id);
  }
  gpt2::load_hf_weights(model, dir);
  model.eval();
  std::unique_ptr<data::BpeTokenizer> tok;
  if (!print_ids || !p.given("prompt-ids")) {
    tok = find_tokenizer(p, dir);
    MW_CHECK_T(FormatError, tok != nullptr, "no tokenizer in '", dir,
               "' (vocab.json + merges.txt, or tokenizer.json): pass --vocab and --merges or "
               "--tokenizer, or use --prompt-ids with --print-ids");
  }
  std::vector<int32_t> prompt = p.given("prompt-ids")
                                    ? cli::token_ids("prompt-ids", p.str("prompt-ids"))
                                : has_text ? tok->encode_prompt(text)
                                           : std::vector<int32_t>{};
  if (prompt.empty()) prompt.push_back(unconditional_start(*tok, model.config()));
  for (int64_t k = 0; k < samples; ++k) {
    gpt2::SamplingOptions o = options;
    o.seed = options.seed + static_cast<uint64_t>(k);  // sample k of --seed S: --seed S+k alone
    if (samples > 1)
      std::printf("=== sample %lld of %lld (--seed %llu) ===\n", static_cast<long long>(k + 1),
                  static_cast<long long>(samples), static_cast<unsigned long long>(o.seed));
    sample_once(model, tok.get(), prompt, max_new, o, print_ids, text, stops, eos);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  cli::Parser p("gpt2_generate",
                "Samples from a GPT-2 HuggingFace folder (config.json + model.safetensors) with a "
                "KV cache, streaming the text.");
  p.option("model", "",
           "HuggingFace GPT-2 folder (its generation_config.json, if any, gives the sampling "
           "defaults, as in transformers' generate())");
  p.text_option("prompt", "", "text to continue (default: start from <|endoftext|>)");
  p.option("prompt-file", "", "a file whose text, exactly, is the prompt (instead of --prompt)");
  p.option("prompt-ids", "", "token ids to continue, comma-separated (no tokenizer needed)");
  p.flag("print-ids", "print the generated ids as one line 'ids: 5,17,...' instead of text");
  p.option("max-new-tokens", "64",
           "tokens to generate; past the model's context (n_positions) it slides, keeping the last "
           "half");
  p.option("temperature", "1.0", "softmax temperature; 0 is greedy (argmax)");
  p.option("top-k", "0",
           "sample among the k most likely tokens (0: all; transformers' generate(do_sample=True) "
           "takes 50 unless told otherwise: pass --top-k 50 to match it)");
  p.option("top-p", "1.0",
           "sample among the most likely tokens whose probability reaches p (0: the most likely "
           "alone)");
  p.option("seed", "0", "sampling seed (with --num-samples N, the samples' are S, S+1, ...)");
  p.option("repetition-penalty", "1.0",
           "> 1 makes tokens already in the text less likely (HF's repetition_penalty; 1.2 is "
           "common for small models that repeat themselves); 1: none");
  p.option("num-samples", "1", "samples of the same prompt, one after another");
  p.repeated_option(
      "stop",
      "end a sample before this text, where its generated text first holds it (the "
      "stop string is not printed; may be given several times). \\n, \\t and \\\\ are "
      "a newline, a tab and a backslash: --stop '\\nQ:'. Not with --print-ids, which "
      "prints no text");
  p.option("vocab", "", "vocab.json (default: the model folder's)");
  p.option("merges", "", "merges.txt (default: the model folder's)");
  p.option("tokenizer", "", "tokenizer.json (default: the model folder's)");
  return cli::run_main(p, "gpt2_generate", argc, argv, run);
}
