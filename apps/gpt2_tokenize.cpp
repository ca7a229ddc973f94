// gpt2_tokenize: text files or JSONL -> llm.c token shards DIR/{train,val}_NNNNNN.bin with GPT-2's
// byte-level BPE (vocab.json + merges.txt, tokenizer.json, or merges learned here with
// --train-bpe).
//
// Streaming: the corpus is read in chunks (data/corpus.h, Note [Chunk boundaries]) and each split
// holds at most --shard-tokens tokens in memory, so RAM is bounded whatever the corpus size
// (--train-bpe also keeps one count per distinct piece). With --threads N, about N chunks are read
// ahead and encoded in parallel; the splits, the <|endoftext|> before each document and the
// parallel encoding are data/tokenize_corpus.h, whose invariants the shards keep.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli.h"
#include "core/interrupt.h"
#include "core/parallel.h"
#include "data/bpe.h"
#include "data/bpe_train.h"
#include "data/corpus.h"
#include "data/file_io.h"
#include "data/output_lock.h"
#include "data/tokenize_corpus.h"
#include "data/tokenizer_files.h"

using namespace mw;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A progress line on stderr: redrawn in place on a terminal, a plain line every 10 s otherwise.
class Progress {
 public:
  explicit Progress(std::string what) : what_(std::move(what)), tty_(isatty(2)) {}
  void update(const data::CorpusReader& reader, int64_t tokens, bool last = false) {
    throw_if_stop_requested("while tokenizing");  // Note [Stop signals]: between batches
    const double now = seconds_since(t0_);
    if (!last && now - shown_ < (tty_ ? 0.25 : 10.0)) return;
    shown_ = now;
    const double mb = reader.bytes_read() / 1e6, total_mb = reader.total_bytes() / 1e6;
    std::fprintf(stderr, "%s[%s] %.1f / %.1f MB (%.0f%%), %lld documents, %lld tokens, %.1f MB/s%s",
                 tty_ ? "\r" : "", what_.c_str(), mb, total_mb,
                 total_mb > 0 ? 100.0 * mb / total_mb : 100.0,
                 static_cast<long long>(reader.num_documents()), static_cast<long long>(tokens),
                 now > 0 ? mb / now : 0.0, tty_ && !last ? "   " : "\n");
    std::fflush(stderr);
  }

 private:
  std::string what_;
  bool tty_;
  Clock::time_point t0_ = Clock::now();
  double shown_ = 0;
};

// --field NAME, or --template (Note [Document templates], data/doc_template.h): not both.
data::DocumentTemplate document_template(const cli::Parser& p) {
  if (!p.given("template")) return data::DocumentTemplate::field(p.str("field"));
  if (p.given("field"))
    throw cli::UsageError(
        "--field and --template both name a record's text; pass one (--field "
        "NAME is --template '{NAME}')");
  return data::DocumentTemplate::parse(p.str("template"));
}

std::unique_ptr<data::BpeTokenizer> train_bpe(const cli::Parser& p,
                                              const std::vector<std::string>& inputs,
                                              const std::string& out_dir) {
  const int64_t vocab_size = p.integer("train-bpe", 257, 65536);
  const auto t0 = Clock::now();
  data::BpeTrainer trainer;
  data::CorpusReader reader(inputs, document_template(p));
  Progress progress("count pieces");
  for (data::CorpusChunk chunk; reader.next(chunk);) {
    trainer.add_text(chunk.text);
    progress.update(reader, 0);
  }
  progress.update(reader, 0, true);
  const data::BpeModel model = trainer.train(vocab_size);
  const std::string vocab = out_dir + "/vocab.json", merges = out_dir + "/merges.txt";
  data::save_vocab_and_merges(model, vocab, merges);
  std::printf("learned %zu merges from %lld distinct pieces in %.1f s: vocab %zu -> %s, %s\n",
              model.merges.size(), static_cast<long long>(trainer.num_distinct_pieces()),
              seconds_since(t0), model.vocab.size(), vocab.c_str(), merges.c_str());
  if (static_cast<int64_t>(model.vocab.size()) < vocab_size)
    std::fprintf(stderr,
                 "gpt2_tokenize: warning: the vocabulary has %zu tokens, not the %lld asked: no "
                 "pair of tokens is left that occurs twice in the corpus; a new model for it "
                 "takes --vocab-size %zu\n",
                 model.vocab.size(), static_cast<long long>(vocab_size), model.vocab.size());
  return std::make_unique<data::BpeTokenizer>(model, vocab);
}

std::unique_ptr<data::BpeTokenizer> load_tokenizer(const cli::Parser& p,
                                                   const std::vector<std::string>& inputs,
                                                   const std::string& out_dir) {
  if (p.given("train-bpe")) return train_bpe(p, inputs, out_dir);
  if (p.given("tokenizer")) {
    return std::make_unique<data::BpeTokenizer>(data::load_tokenizer_json(p.str("tokenizer")),
                                                p.str("tokenizer"));
  }
  if (!p.given("vocab") || !p.given("merges"))
    throw cli::UsageError("--vocab and --merges go together (HF's vocab.json and merges.txt)");
  return std::make_unique<data::BpeTokenizer>(
      data::load_vocab_and_merges(p.str("vocab"), p.str("merges")), p.str("vocab"));
}

// Note [Tokenizer beside the shards] (train/sample.cpp): the given tokenizer's files are copied
// into --out, so that gpt2_train --data DIR finds the tokenizer that made the shards (--train-bpe
// writes its own there). Returns the files to write: those --out lacks. One there already with
// other bytes is refused before any work, as --train-bpe's are: it names another tokenizer.
std::vector<std::pair<std::string, std::string>> tokenizer_copies(const cli::Parser& p,
                                                                  const std::string& out_dir) {
  if (p.given("train-bpe")) return {};
  data::TokenizerFiles given;
  given.vocab_json = p.str("vocab"), given.merges_txt = p.str("merges");
  given.tokenizer_json = p.str("tokenizer");
  std::vector<std::pair<std::string, std::string>> copies;
  std::vector<std::pair<std::string, std::string>> files = data::read_tokenizer_files(given);
  // A tokenizer file of the other kind left there (vocab.json and merges.txt where this run writes
  // tokenizer.json) would be the one gpt2_train reads first, silently: the shards' stamp would not
  // match it and the run would train without a tokenizer.
  for (const char* other : {"vocab.json", "merges.txt", "tokenizer.json"}) {
    std::error_code ec;
    const bool written =
        std::any_of(files.begin(), files.end(), [&](const auto& f) { return f.first == other; });
    MW_CHECK_T(IoError, written || !std::filesystem::exists(out_dir + "/" + other, ec), "--out '",
               out_dir, "' already holds a ", other,
               " of another tokenizer than this run's (gpt2_train --data would read that one); ",
               "pass --out another directory, or move that file away");
  }
  for (auto& [name, bytes] : files) {
    const std::string there = out_dir + "/" + name;
    std::error_code ec;
    if (!std::filesystem::exists(there, ec)) {
      copies.emplace_back(name, std::move(bytes));
      continue;
    }
    MW_CHECK_T(IoError, data::read_text_file(there, name, "pass --out another directory") == bytes,
               "--out '", out_dir, "' already holds a ", name, " other than the tokenizer's '",
               name == "merges.txt" ? given.merges_txt : given.source(),
               "', and gpt2_tokenize writes the tokenizer beside the shards (gpt2_train finds it ",
               "there); pass --out another directory, or move that file away");
  }
  return copies;
}

// Everything after the output directory is ready: the tokenizer threads, the shards, the summary.
int tokenize(cli::Parser& p, data::CorpusReader& reader,
             std::vector<std::unique_ptr<data::BpeTokenizer>>& workers,
             const std::vector<std::string>& inputs, const std::string& out_dir,
             double val_fraction, int64_t shard_tokens) {
  if (workers.empty()) workers.push_back(load_tokenizer(p, inputs, out_dir));
  while (static_cast<int>(workers.size()) < num_threads())
    workers.push_back(std::make_unique<data::BpeTokenizer>(*workers.front()));
  const data::BpeTokenizer& tok = *workers.front();
  // Before any text is read: an id past 65535 was refused only when the corpus produced it.
  MW_CHECK_T(FormatError, tok.vocab_size() <= 65536, "the tokenizer '", tok.source(), "' has ",
             tok.vocab_size(), " ids, and an llm.c shard holds uint16 tokens (ids 0..65535); use ",
             "a vocabulary of at most 65536 tokens");

  data::ShardSplits splits(out_dir, shard_tokens, val_fraction, tok.eot_id(),
                           data::ShardTokenizer{tok.vocab_size(), tok.fingerprint()});
  const bool one_document = inputs.size() == 1 && data::is_plain_text_input(inputs[0]);
  if (one_document && val_fraction > 0) {  // Note [One document]
    const int64_t size = reader.total_bytes();
    splits.val_from_byte = static_cast<int64_t>(std::llround((1 - val_fraction) * double(size)));
    // A document start within half the val share's bytes of the cut (val keeps 0.5-1.5x it).
    const int64_t marker_bytes = static_cast<int64_t>(std::string_view(data::kEndOfText).size());
    const data::MarkersAround m = data::markers_around(
        inputs[0], splits.val_from_byte, (size - splits.val_from_byte) / 2 + marker_bytes);
    int64_t best = -1;
    for (int64_t marker : {m.before, m.after}) {
      const int64_t start = marker + marker_bytes;
      const bool near = std::abs(start - splits.val_from_byte) * 2 <= size - splits.val_from_byte;
      if (marker > 0 && start < size && near &&
          (best < 0 ||
           std::abs(start - splits.val_from_byte) < std::abs(best - splits.val_from_byte)))
        best = start;
    }
    if (best >= 0) splits.val_from_byte = best, splits.val_at_document = true;
  }
  Progress progress("tokenize");
  const auto t0 = Clock::now();
  data::tokenize_corpus(reader, workers, splits,
                        [&](int64_t tokens) { progress.update(reader, tokens); });
  splits.train.finish();
  splits.val.finish();
  progress.update(reader, splits.num_tokens(), true);
  const double seconds = seconds_since(t0), mb = reader.bytes_read() / 1e6;
  std::printf(
      "tokenized %lld documents, %.2f MB in %.2f s (%.2f MB/s, %zu threads): %lld tokens, %.2f "
      "bytes per token, vocab %lld\n",
      static_cast<long long>(reader.num_documents()), mb, seconds, mb / std::max(seconds, 1e-9),
      workers.size(), static_cast<long long>(splits.num_tokens()),
      // Of the documents' text: JSON and CSV syntax is not what the tokenizer compresses.
      double(reader.text_bytes()) / std::max(1.0, double(splits.num_tokens())),
      static_cast<long long>(tok.vocab_size()));
  // Empty files, empty fields or only markers: shards of <|endoftext|> tokens alone (or none),
  // which exited 0 before and trained on nothing.
  MW_CHECK_T(FormatError, reader.text_bytes() > 0, "the inputs hold no text (",
             reader.num_documents(), " empty document(s)); pass files with text in them");
  std::fputs(data::split_summary("train", splits.train).c_str(), stdout);
  std::fputs(data::split_summary("val", splits.val).c_str(), stdout);
  if (reader.num_markers() > 0)
    std::printf(
        "%lld <|endoftext|> markers in the text ended documents there (Note [End-of-text "
        "markers]: not tokenized as text)\n",
        static_cast<long long>(reader.num_markers()));
  if (splits.val_cut_byte >= 0)
    std::printf(
        "%s: its bytes from %lld of %lld on (the last %.1f%%, cut at %s) are the val split\n",
        reader.num_documents() > 1 ? "one text file" : "one document",
        static_cast<long long>(splits.val_cut_byte), static_cast<long long>(reader.total_bytes()),
        100.0 * double(reader.total_bytes() - splits.val_cut_byte) /
            std::max(1.0, double(reader.total_bytes())),
        splits.val_at_document ? "the start of a document" : "a piece boundary");
  if (val_fraction > 0 && splits.val.num_tokens() == 0)
    std::fprintf(stderr,
                 "warning: --val-fraction %g but nothing went to val: %s; pass several files or "
                 "a .jsonl\n",
                 val_fraction,
                 one_document ? "the one document has no piece boundary (an ASCII space after a "
                                "printable character) past the cut"
                              : "documents go whole to one split, and the first one is train");
  return 0;
}

// Note [Not UTF-8] (data/corpus.cpp): the first three, then how many more (a folder of 100,000
// Latin-1 files is one problem, not 100,000 lines).
void print_input_warnings(const data::CorpusReader& reader) {
  const std::vector<std::string>& w = reader.warnings();
  for (size_t i = 0; i < std::min<size_t>(3, w.size()); ++i)
    std::fprintf(stderr, "gpt2_tokenize: warning: %s\n", w[i].c_str());
  if (w.size() > 3)
    std::fprintf(stderr, "gpt2_tokenize: warning: and %zu more inputs are not UTF-8 text\n",
                 w.size() - 3);
}

int run(cli::Parser& p) {
  if ((p.given("vocab") || p.given("merges")) + p.given("tokenizer") + p.given("train-bpe") != 1)
    throw cli::UsageError(
        "choose one tokenizer: --vocab and --merges, or --tokenizer, or --train-bpe VOCAB_SIZE");
  if (p.positional_values().empty())
    throw cli::UsageError(
        "no input files: pass text, .jsonl, .json or .csv files (or folders of them) after the "
        "options");
  if (!p.given("out")) throw cli::UsageError("--out DIR is required");
  const std::string out_dir = p.str("out");
  const std::vector<std::string> inputs = data::expand_corpus_inputs(
      p.positional_values(), out_dir, {p.str("vocab"), p.str("merges"), p.str("tokenizer")});
  const double val_fraction = p.real("val-fraction", 0.0, 0.5);
  const int64_t shard_tokens = p.integer("shard-tokens", 1, INT32_MAX);
  set_num_threads(static_cast<int>(p.integer("threads", 0, 1024)));
  data::CorpusReader reader(inputs, document_template(p));  // checks the inputs before any work
  print_input_warnings(reader);
  if ((p.given("field") || p.given("template")) &&
      std::all_of(inputs.begin(), inputs.end(), data::is_plain_text_input))
    std::fprintf(stderr,
                 "gpt2_tokenize: warning: --%s applies to the records of .jsonl, .json and "
                 ".csv/.tsv files; every input here is plain text, one document per file\n",
                 p.given("field") ? "field" : "template");
  // The given tokenizer files are read before the output directory is made; --train-bpe writes
  // its files there.
  std::vector<std::unique_ptr<data::BpeTokenizer>> workers;
  if (!p.given("train-bpe")) workers.push_back(load_tokenizer(p, inputs, out_dir));
  // A failure from here on (a bad line in the inputs, a full disk, SIGINT or SIGTERM) leaves
  // nothing: the writers remove their unfinished shards, and a directory this run created goes
  // with what it wrote; in one that existed, the shards are this run's (prepare_shard_dir found
  // none) and go. A half-tokenized corpus was left as shards that train without a word.
  std::error_code ec;
  const bool created = !std::filesystem::exists(out_dir, ec);
  // Note [One writer per output]: two runs on one --out replaced each other's shards, and an
  // interrupted one removed the other's.
  const data::OutputLock lock(out_dir, true, "--out",
                              "would replace each other's shards (and one interrupted would "
                              "remove the other's)");
  // --train-bpe writes its tokenizer into --out: one already there (a downloaded GPT-2
  // vocab.json) was replaced without a word.
  for (const char* name : {"vocab.json", "merges.txt"})
    MW_CHECK_T(IoError, !p.given("train-bpe") || !std::filesystem::exists(out_dir + "/" + name, ec),
               "--out '", out_dir, "' already holds ", name,
               ", which --train-bpe would replace with the tokenizer it learns; pass --out "
               "another directory, or move it away");
  std::vector<std::pair<std::string, std::string>> copies = tokenizer_copies(p, out_dir);
  data::prepare_shard_dir(out_dir);
  const std::string unfinished =
      out_dir + "/" + data::kUnfinishedMarker;  // Note [Unfinished corpus]
  try {
    const std::string note = "gpt2_tokenize is writing this directory's shards\n";
    data::write_file(unfinished, {{note.data(), static_cast<int64_t>(note.size())}},
                     "pass --out a writable directory");
    const int rc = tokenize(p, reader, workers, inputs, out_dir, val_fraction, shard_tokens);
    for (const auto& [name, bytes] : copies)
      data::write_file_atomically(out_dir + "/" + name,
                                  {{bytes.data(), static_cast<int64_t>(bytes.size())}},
                                  "pass --out a writable directory");
    std::filesystem::remove(unfinished);
    return rc;
  } catch (...) {
    std::filesystem::remove(unfinished, ec);
    if (created) std::filesystem::remove_all(out_dir, ec);
    for (const auto& e : std::filesystem::directory_iterator(out_dir, ec)) {
      const std::string name = e.path().filename().string();
      const bool learned = p.given("train-bpe") && (name == "vocab.json" || name == "merges.txt");
      const bool copied =
          std::any_of(copies.begin(), copies.end(), [&](const auto& c) { return c.first == name; });
      if (learned || copied || data::is_shard_file_name(name))
        std::filesystem::remove(e.path(), ec);
    }
    throw;
  }
}

}  // namespace

int main(int argc, char** argv) {
  install_stop_signal_handlers();  // Note [Stop signals]: an interrupted run removes its shards
  cli::Parser p("gpt2_tokenize",
                "Tokenizes text with GPT-2's byte-level BPE into llm.c token shards "
                "DIR/{train,val}_NNNNNN.bin, each document preceded by <|endoftext|>.");
  p.positionals("FILE",
                "text files (one document each), .jsonl files (one document per line), .json "
                "files (an array of documents) or .csv/.tsv files (a document per row), or "
                "folders of them (every file under it, in name order)");
  p.option("vocab", "", "HF vocab.json (with --merges)");
  p.option("merges", "", "HF merges.txt (with --vocab)");
  p.option("tokenizer", "", "HF tokenizer.json (instead of --vocab/--merges)");
  p.option("train-bpe", "",
           "learn a BPE of this vocab size (257..65536) from the inputs, write DIR/vocab.json and "
           "DIR/merges.txt, then tokenize with it");
  p.option("out", "",
           "output directory (created if missing); the tokenizer's files are written beside the "
           "shards, where gpt2_train --data DIR finds them");
  p.option("val-fraction", "0",
           "share of the tokens written to val_*.bin: whole documents (of one text file alone, its "
           "last part)");
  p.option("field", "text",
           "the field of each .jsonl line's (or .json element's) object holding its text, or the "
           ".csv/.tsv column");
  p.option(
      "template", "",
      "a record's text made of several fields, e.g. '{prompt}{completion}' or '### Question:\\n"
      "{q}\\n### Answer:\\n{a}' (\\n newline, \\t tab, {{ }} braces); instead of --field");
  p.option("threads", "0",
           "tokenizing threads (0 = all cores this process may use: affinity, CPU quota)");
  p.option("shard-tokens", "100000000",
           "max tokens per shard (2 bytes each in memory and on disk)");
  return cli::run_main(p, "gpt2_tokenize", argc, argv, run);
}
