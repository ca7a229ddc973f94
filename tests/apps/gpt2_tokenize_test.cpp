// gpt2_tokenize as a user runs it: text and JSONL documents -> llm.c shards read back with
// data::TokenShard, the train/val split, --train-bpe, and clear errors with exit codes.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>

#include "../data/temp_dir.h"
#include "child.h"
#include "data/bpe.h"
#include "data/token_shard.h"
#include "models/gpt2/hf_io.h"
#include "run_app.h"

namespace mw {
namespace {

using data::testing::TempDir;
using testing::AppResult;

const std::string kFixture = std::string(MW_SOURCE_DIR) + "/tests/fixtures/bpe/";
const std::string kFixtureTokenizer =
    "--vocab " + kFixture + "vocab.json --merges " + kFixture + "merges.txt ";

AppResult tokenize(const std::string& args) {
  return testing::run_built_app("gpt2_tokenize", args);
}

std::vector<int32_t> read_shard(const std::string& path) {
  data::TokenShard shard(path);
  std::vector<int32_t> ids(shard.num_tokens());
  shard.batch(0, 1, shard.num_tokens(), ids.data());
  return ids;
}

// The documents of a shard: the texts between <|endoftext|> tokens (each document starts with one).
std::vector<std::string> documents(const std::vector<int32_t>& ids, const data::BpeTokenizer& tok) {
  std::vector<std::string> docs;
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), tok.eot_id());
  for (int32_t id : ids) {
    if (id == tok.eot_id())
      docs.emplace_back();
    else
      docs.back() += tok.token_bytes(id);
  }
  return docs;
}

std::string write(const TempDir& tmp, const std::string& name, const std::string& text) {
  std::ofstream(tmp.file(name), std::ios::binary) << text;
  return tmp.file(name);
}

data::BpeTokenizer fixture_tokenizer() {
  return data::BpeTokenizer(
      data::load_vocab_and_merges(kFixture + "vocab.json", kFixture + "merges.txt"), "fixture");
}

TEST(Gpt2Tokenize, TextAndJsonlDocumentsBecomeShardsThatDecodeBack) {
  TempDir tmp;
  const std::vector<std::string> texts = {
      "First document.\nIt's short, but has\ttabs and trailing spaces   \n",
      "Второй документ: ünïcödé, 数字 12345, emoji 👍🏽, bad byte \xff!",
      "third",
  };
  const std::string a = write(tmp, "a.txt", texts[0]), b = write(tmp, "b.txt", texts[1]);
  const std::string jsonl =
      write(tmp, "c.jsonl",
            "{\"text\": \"third\", \"id\": 1}\n\n{\"id\": 2, \"text\": \"fourth\\nline\"}\n");
  const AppResult r =
      tokenize(kFixtureTokenizer + "--out " + tmp.file("out") + " " + a + " " + b + " " + jsonl);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tokenized 4 documents"), std::string::npos) << r.output;
  const data::BpeTokenizer tok = fixture_tokenizer();
  const std::vector<std::string> docs =
      documents(read_shard(tmp.file("out/train_000000.bin")), tok);
  EXPECT_EQ(docs, (std::vector<std::string>{texts[0], texts[1], "third", "fourth\nline"}));
  EXPECT_FALSE(std::filesystem::exists(tmp.file("out/val_000000.bin")));  // --val-fraction 0
  // Note [Shard tokenizer stamp]: the shard names the tokenizer its ids come from.
  const data::TokenShard shard(tmp.file("out/train_000000.bin"));
  ASSERT_TRUE(shard.tokenizer().has_value());
  EXPECT_EQ(*shard.tokenizer(), (data::ShardTokenizer{tok.vocab_size(), tok.fingerprint()}));
  // Note [Tokenizer beside the shards]: the tokenizer's files are written beside the shards.
  for (const char* name : {"vocab.json", "merges.txt"})
    EXPECT_EQ(data::testing::read_bytes(tmp.file("out/") + name),
              data::testing::read_bytes(kFixture + name))
        << name;
}

TEST(Gpt2Tokenize, ValFractionSendsWholeDocumentsToValAndShardsAreCapped) {
  TempDir tmp;
  std::string lines;
  for (int i = 0; i < 40; ++i)
    lines += "{\"body\": \"document number " + std::to_string(i) + "\"}\n";
  const std::string jsonl = write(tmp, "docs.jsonl", lines);
  const AppResult r = tokenize(kFixtureTokenizer + "--field body --val-fraction 0.25 " +
                               "--shard-tokens 50 --out " + tmp.file("out") + " " + jsonl);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const data::BpeTokenizer tok = fixture_tokenizer();
  std::vector<int32_t> train, val;
  for (const auto& entry : std::filesystem::directory_iterator(tmp.file("out"))) {
    if (entry.path().extension() == ".bin") {  // beside the tokenizer's files
      EXPECT_LE(read_shard(entry.path()).size(), 50u) << entry.path();  // --shard-tokens
    }
  }
  for (const char* split : {"train", "val"}) {
    for (int i = 0;; ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "out/%s_%06d.bin", split, i);
      if (!std::filesystem::exists(tmp.file(name))) break;
      const auto ids = read_shard(tmp.file(name));
      (split[0] == 'v' ? val : train)
          .insert((split[0] == 'v' ? val : train).end(), ids.begin(), ids.end());
    }
  }
  // Shards end mid-document, but the concatenated splits hold whole documents.
  const auto train_docs = documents(train, tok), val_docs = documents(val, tok);
  EXPECT_EQ(train_docs.size() + val_docs.size(), 40u);
  EXPECT_EQ(train_docs.front(), "document number 0");  // the first document is train
  EXPECT_EQ(val_docs.front(), "document number 2");    // val when it brings val nearer 25%
  const double share = double(val.size()) / double(train.size() + val.size());
  EXPECT_NEAR(share, 0.25, 0.03);  // documents are ~5 tokens of ~250: the share is met to one doc
}

// Note [One document]: one text file had no val split ("the first document is train"). Its last
// --val-fraction of bytes go to val now, cut at a piece boundary, so train + val hold exactly the
// ids of the whole text; over several 1 MiB chunks too, for any thread count.
TEST(Gpt2Tokenize, OneDocumentGivesItsLastFractionToValCutAtAPieceBoundary) {
  TempDir tmp;
  const std::string base = data::testing::read_bytes(kFixture + "train.txt");
  std::string big;
  for (size_t i = 0; big.size() < (5u << 20) / 2; ++i)
    big += base.substr((i * 7919) % base.size(), 150);
  for (const std::string& text : {base, big}) {
    SCOPED_TRACE(text.size());
    const std::string doc = write(tmp, "doc.txt", text);
    std::filesystem::remove_all(tmp.file("whole"));
    ASSERT_EQ(tokenize(kFixtureTokenizer + "--out " + tmp.file("whole") + " " + doc).exit_code, 0);
    const std::vector<int32_t> whole = read_shard(tmp.file("whole/train_000000.bin"));
    for (const char* threads : {"1", "3"}) {
      const std::string out = tmp.file(std::string("split") + threads);
      std::filesystem::remove_all(out);
      const AppResult r = tokenize(kFixtureTokenizer + "--val-fraction 0.1 --threads " + threads +
                                   " --out " + out + " " + doc);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find("one document: its bytes from"), std::string::npos) << r.output;
      EXPECT_EQ(r.output.find("nothing went to val"), std::string::npos) << r.output;
      std::vector<int32_t> ids = read_shard(out + "/train_000000.bin");
      const std::vector<int32_t> val = read_shard(out + "/val_000000.bin");
      ASSERT_FALSE(val.empty());
      EXPECT_EQ(val.front(), fixture_tokenizer().eot_id());  // a shard's text starts with one
      ids.insert(ids.end(), val.begin() + 1, val.end());
      EXPECT_TRUE(ids == whole) << "the cut changed the ids";
      const double share = double(val.size()) / double(ids.size());
      EXPECT_NEAR(share, 0.1, 0.02);  // bytes per token vary little along one text
    }
  }
}

// Note [End-of-text markers]: "<|endoftext|>" in the text (TinyStories' .txt separates its stories
// so) ends a document there, as HF's tokenizer encodes it; it was tokenized as ordinary characters
// and the file was one document. Over several 1 MiB chunks, for any thread count, in a .jsonl
// field too; a file that starts with a marker, and two in a row, give no empty document.
TEST(Gpt2Tokenize, EndOfTextMarkersSeparateDocuments) {
  TempDir tmp;
  const std::string base = data::testing::read_bytes(kFixture + "train.txt");
  std::string text = "<|endoftext|>";
  for (size_t i = 0; text.size() < (5u << 20) / 2; ++i)
    text += base.substr((i * 7919) % base.size(), 100 + i % 300) +
            (i % 97 == 5 ? "\n<|endoftext|><|endoftext|>\n" : "\n<|endoftext|>\n");
  const std::string doc = write(tmp, "stories.txt", text);
  data::BpeTokenizer tok = fixture_tokenizer();
  std::vector<int32_t> expected;
  int64_t num_documents = 0;
  for (size_t from = 0;;) {  // each non-empty document: <|endoftext|>, then its text's ids
    const size_t to = text.find("<|endoftext|>", from);
    const std::string piece = text.substr(from, to == std::string::npos ? to : to - from);
    if (!piece.empty()) {
      expected.push_back(tok.eot_id());
      const std::vector<int32_t> ids = tok.encode(piece);
      expected.insert(expected.end(), ids.begin(), ids.end());
      ++num_documents;
    }
    if (to == std::string::npos) break;
    from = to + 13;
  }
  for (const char* threads : {"1", "3"}) {
    const std::string out = tmp.file(std::string("out") + threads);
    const AppResult r = tokenize(kFixtureTokenizer + "--threads " + threads + " --out " + out +
                                 " --shard-tokens 100000000 " + doc);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("tokenized " + std::to_string(num_documents) + " documents"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("markers in the text ended documents there"), std::string::npos);
    EXPECT_TRUE(read_shard(out + "/train_000000.bin") == expected) << "threads " << threads;
  }
  // Note [One document]: the one text file's last tenth goes to val, counted in its bytes, markers
  // included, cut where a story starts: train then val are the whole file's ids (each story's
  // <|endoftext|> with its text; until session 39 the cut fell mid-story and the <|endoftext|>
  // tokens of val's stories went to train).
  const AppResult r =
      tokenize(kFixtureTokenizer + "--val-fraction 0.1 --out " + tmp.file("split") + " " + doc);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("one text file: its bytes from"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cut at the start of a document"), std::string::npos) << r.output;
  std::vector<int32_t> both = read_shard(tmp.file("split/train_000000.bin"));
  const std::vector<int32_t> val = read_shard(tmp.file("split/val_000000.bin"));
  EXPECT_NEAR(double(val.size()) / double(expected.size()), 0.1, 0.02);
  both.insert(both.end(), val.begin(), val.end());
  EXPECT_TRUE(both == expected) << "the cut is not where a story starts";
  const std::string jsonl = write(tmp, "m.jsonl", "{\"text\": \"one<|endoftext|>two\"}\n");
  const AppResult j = tokenize(kFixtureTokenizer + "--out " + tmp.file("j") + " " + jsonl);
  ASSERT_EQ(j.exit_code, 0) << j.output;
  EXPECT_EQ(documents(read_shard(tmp.file("j/train_000000.bin")), tok),
            (std::vector<std::string>{"one", "two"}));
}

// Note [JSON arrays]: TinyStories' data00.json and Alpaca's alpaca_data.json are one JSON array
// each; such a file was one document of raw JSON. Each element is a document now (an object's
// --field, or a string); a .json of one object per line (HF datasets' to_json) is JSONL.
TEST(Gpt2Tokenize, AJsonArrayIsADocumentPerElementAndJsonLinesAreJsonl) {
  TempDir tmp;
  const std::string array =
      write(tmp, "data00.json",
            "\xEF\xBB\xBF [\n {\"story\": \"Once upon a time.\", \"source\": \"GPT-4\"},\n"
            "  \"A plain string.\", {\"story\": \"Tab\\there \\u00fc.\"}\n]\n");
  const std::string lines =
      write(tmp, "lines.json", "{\"story\": \"first\"}\n{\"story\": \"second\"}\n");
  const AppResult r = tokenize(kFixtureTokenizer + "--field story --val-fraction 0.5 --out " +
                               tmp.file("out") + " " + array + " " + lines);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const data::BpeTokenizer tok = fixture_tokenizer();
  std::vector<int32_t> ids = read_shard(tmp.file("out/train_000000.bin"));
  const std::vector<int32_t> val = read_shard(tmp.file("out/val_000000.bin"));
  ids.insert(ids.end(), val.begin(), val.end());  // whole documents go to val: no cut
  std::vector<std::string> docs = documents(ids, tok);
  std::sort(docs.begin(), docs.end());
  EXPECT_EQ(docs, (std::vector<std::string>{"A plain string.", "Once upon a time.",
                                            "Tab\there \xC3\xBC.", "first", "second"}));
  const std::string other = write(tmp, "other.json", "[{\"story\": \"ok\"}, 3]");
  const AppResult bad =
      tokenize(kFixtureTokenizer + "--field story --out " + tmp.file("bad") + " " + other);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("other.json element 1: expected a JSON object or string, found "
                            "number 3"),
            std::string::npos)
      << bad.output;
}

// A table's column of documents (Kaggle's and HF's CSV exports): each row's --field is a document;
// a CSV was one document of raw text, its header, commas and quotes included.
TEST(Gpt2Tokenize, ACsvColumnIsADocumentPerRow) {
  TempDir tmp;
  const std::string csv = write(
      tmp, "t.csv", "id,story\r\n1,\"A \"\"quoted\"\", comma\r\nand break.\"\r\n\r\n2,plain\r\n");
  const std::string tsv = write(tmp, "t.tsv", "story\tn\nTabbed row\t7\n");
  const AppResult r = tokenize(kFixtureTokenizer + "--field story --out " + tmp.file("out") + " " +
                               csv + " " + tsv);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<int32_t> ids = read_shard(tmp.file("out/train_000000.bin"));
  const std::vector<std::string> docs = {"A \"quoted\", comma\r\nand break.", "plain",
                                         "Tabbed row"};
  EXPECT_EQ(documents(ids, fixture_tokenizer()), docs);
  // Bytes per token are of the documents' text, not of the tables' syntax.
  char rate[32];
  std::snprintf(rate, sizeof rate, "%.2f bytes per token",
                double(docs[0].size() + docs[1].size() + docs[2].size()) / double(ids.size()));
  EXPECT_NE(r.output.find(rate), std::string::npos) << rate << "\n" << r.output;
  const AppResult bad = tokenize(kFixtureTokenizer + "--out " + tmp.file("bad") + " " + csv);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("t.csv: its header (id, story) has no column \"text\"; pass --field"),
            std::string::npos)
      << bad.output;
}

// Note [Document templates]: prompt/completion records (OpenAI's fine-tuning files), Alpaca's
// instruction/input/output, a CSV's question and answer columns each become one document of
// several fields; before, --field took one and the model learned answers without questions.
TEST(Gpt2Tokenize, ATemplateMakesADocumentOfSeveralFields) {
  TempDir tmp;
  const std::string jsonl =
      write(tmp, "pc.jsonl",
            "{\"prompt\": \"Q: 2+2?\\n\", \"completion\": \"A: 4\", \"n\": 7, "
            "\"x\": null}\n{\"completion\": \"hi\", \"prompt\": \"\", \"n\": 1.5, "
            "\"x\": true}\n");
  const std::string array = write(tmp, "alpaca.json",
                                  "[{\"prompt\": \"Say\", \"completion\": \" it\", \"n\": -2, "
                                  "\"x\": \"s\"}]");
  const std::string csv = write(tmp, "qa.csv", "x,n,completion,prompt\r\n,3,\"A,\nB\",Q\r\n");
  const AppResult r = tokenize(kFixtureTokenizer +
                               "--template '{prompt}\\n{completion} [{n}|{x}] {{\\t}}\\\\' --out " +
                               tmp.file("out") + " " + jsonl + " " + array + " " + csv);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> docs = {"Q: 2+2?\n\nA: 4 [7|] {\t}\\", "\nhi [1.5|true] {\t}\\",
                                         "Say\n it [-2|s] {\t}\\", "Q\nA,\nB [3|] {\t}\\"};
  EXPECT_EQ(documents(read_shard(tmp.file("out/train_000000.bin")), fixture_tokenizer()), docs);
  // What cannot be made is named before any output is left.
  const auto refused = [&](const std::string& args, const std::string& message) {
    const AppResult bad = tokenize(kFixtureTokenizer + args + " --out " + tmp.file("bad"));
    EXPECT_NE(bad.exit_code, 0) << args;
    EXPECT_NE(bad.output.find(message), std::string::npos) << args << "\n" << bad.output;
    EXPECT_FALSE(std::filesystem::exists(tmp.file("bad"))) << args;
  };
  refused("--template '{prompt}{answer}' " + jsonl,
          "pc.jsonl:1: no field \"answer\" (the object has: prompt, completion, n, x)");
  refused("--template '{prompt}{answer}' " + csv,
          "qa.csv: its header (x, n, completion, prompt) has no column \"answer\"; every {field}");
  const std::string nested = write(tmp, "nested.jsonl", "{\"prompt\": [\"a\"]}\n");
  refused("--template '{prompt}' " + nested, "nested.jsonl:1: the field \"prompt\" is array");
  refused("--template '{prompt' " + jsonl, "a '{' with no '}' after it at byte 1");
  refused("--template 'no field' " + jsonl, "names no {field}");
  refused("--template '{prompt}' --field prompt " + jsonl, "pass one");
  // On plain text alone a template does nothing, and says so.
  const AppResult text = tokenize(kFixtureTokenizer + "--template '{prompt}' --out " +
                                  tmp.file("text") + " " + write(tmp, "a.txt", "plain"));
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("warning: --template applies to the records of .jsonl"),
            std::string::npos)
      << text.output;
}

// A folder is its files, recursively, in path order: tens of thousands of documents need no glob
// on the command line (bash's "Argument list too long"). Hidden files and earlier outputs (a
// folder of shards, with its tokenizer files) are left out; a folder with no file is refused.
TEST(Gpt2Tokenize, AFolderIsItsFilesInPathOrder) {
  TempDir tmp;
  std::filesystem::create_directories(tmp.file("docs/b/c"));
  std::filesystem::create_directories(tmp.file("docs/.git"));
  write(tmp, "docs/b/c/two.txt", "two"), write(tmp, "docs/b/one.txt", "one");
  write(tmp, "docs/a.jsonl", "{\"text\": \"zero\"}\n"), write(tmp, "docs/z.txt", "three");
  write(tmp, "docs/.DS_Store", std::string("\0\1", 2)), write(tmp, "docs/.git/x", "hidden");
  ASSERT_EQ(tokenize(kFixtureTokenizer + "--out " + tmp.file("docs/tok") + " " + tmp.file("docs"))
                .exit_code,
            0);
  // Again into another folder: the first run's output inside docs/ is not read as documents.
  const AppResult r =
      tokenize(kFixtureTokenizer + "--out " + tmp.file("out") + " " + tmp.file("docs"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(documents(read_shard(tmp.file("out/train_000000.bin")), fixture_tokenizer()),
            (std::vector<std::string>{"zero", "two", "one", "three"}));
  // The tokenizer's own files kept with the corpus are not documents (a vocab.json was refused as
  // a JSONL line, merges.txt tokenized as text).
  std::filesystem::copy_file(kFixture + "vocab.json", tmp.file("docs/vocab.json"));
  std::filesystem::copy_file(kFixture + "merges.txt", tmp.file("docs/merges.txt"));
  const AppResult own =
      tokenize("--vocab " + tmp.file("docs/vocab.json") + " --merges " +
               tmp.file("docs/merges.txt") + " --out " + tmp.file("own") + " " + tmp.file("docs"));
  ASSERT_EQ(own.exit_code, 0) << own.output;
  EXPECT_EQ(documents(read_shard(tmp.file("own/train_000000.bin")), fixture_tokenizer()),
            (std::vector<std::string>{"zero", "two", "one", "three"}));
  std::filesystem::create_directories(tmp.file("empty"));
  const AppResult empty =
      tokenize(kFixtureTokenizer + "--out " + tmp.file("e") + " " + tmp.file("empty"));
  EXPECT_EQ(empty.exit_code, 1);
  EXPECT_NE(empty.output.find("holds no file to tokenize"), std::string::npos) << empty.output;
}

TEST(Gpt2Tokenize, TrainBpeLearnsATokenizerThatRoundTripsAndCompresses) {
  TempDir tmp;
  const std::string corpus = kFixture + "train.txt";
  const AppResult r = tokenize("--train-bpe 400 --out " + tmp.file("out") + " " + corpus);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const data::BpeTokenizer tok(
      data::load_vocab_and_merges(tmp.file("out/vocab.json"), tmp.file("out/merges.txt")), "out");
  EXPECT_EQ(tok.vocab_size(), 400);
  EXPECT_EQ(tok.eot_id(), 399);
  const std::string text = data::testing::read_bytes(corpus);
  const std::vector<int32_t> ids = read_shard(tmp.file("out/train_000000.bin"));
  EXPECT_EQ(documents(ids, tok), std::vector<std::string>{text});
  const data::TokenShard shard(tmp.file("out/train_000000.bin"));  // the learned tokenizer's stamp
  ASSERT_TRUE(shard.tokenizer().has_value());
  EXPECT_EQ(shard.tokenizer()->fingerprint, tok.fingerprint());
  // 2920 bytes. HF tokenizers' BpeTrainer with the same settings (vocab 399 + eot, pairs seen at
  // least twice) encodes this text in 2004 tokens; ours did too when this was written. Bound: 2%
  // slack for a different but equally good tie order, and well under 1 token per byte.
  const double tokens = double(ids.size() - 1);  // without the leading <|endoftext|>
  EXPECT_LE(tokens, 2004 * 1.02);
  EXPECT_LT(tokens, double(text.size()) / 1.4);
  // Note [A new model's vocabulary]: a new model on these shards has the tokenizer's 400 ids and
  // its <|endoftext|>, not tiny's 97 (it had, with eos 96: every id past 96 refused).
  const std::string args = "--model tiny --seq 16 --batch 2 --data " + tmp.file("out") +
                           " --checkpoint-dir " + tmp.file("ck") + " --checkpoint-every 1 ";
  const AppResult train =
      testing::run_built_app("gpt2_train", args + "--steps 1 --save " + tmp.file("model"));
  ASSERT_EQ(train.exit_code, 0) << train.output;
  // Resumed with the same options: the same vocabulary (a resume built tiny's 97 and was refused).
  const AppResult resumed =
      testing::run_built_app("gpt2_train", args + "--steps 2 --resume " + tmp.file("ck"));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(train.output.find("the --data shards' tokenizer has 400 tokens: a new model of 400"),
            std::string::npos)
      << train.output;
  const gpt2::Config saved = gpt2::load_hf_config(tmp.file("model"));
  EXPECT_EQ(saved.vocab_size, 400);
  EXPECT_EQ(saved.eos_token_id, 399);
}

// Chunks are encoded in parallel (each worker with its own tokenizer) and written in order: the
// shards do not depend on --threads. A 3 MiB document (several chunks) and many small ones.
TEST(Gpt2Tokenize, ShardsDoNotDependOnTheThreadCount) {
  TempDir tmp;
  const std::string base = data::testing::read_bytes(kFixture + "train.txt");
  std::string big, lines;
  for (size_t i = 0; big.size() < 3u << 20; ++i) big += base.substr((i * 7919) % base.size(), 150);
  for (int i = 0; i < 500; ++i) lines += "{\"text\": \"doc " + std::to_string(i) + " text\"}\n";
  const std::string inputs =
      write(tmp, "big.txt", big) + " " + write(tmp, "docs.jsonl", lines) + " ";
  for (const char* threads : {"1", "2", "3"}) {
    const AppResult r = tokenize(kFixtureTokenizer + "--val-fraction 0.2 --threads " + threads +
                                 " --out " + tmp.file(std::string("out") + threads) + " " + inputs);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  for (const char* shard : {"/train_000000.bin", "/val_000000.bin"}) {
    const std::string one = data::testing::read_bytes(tmp.file("out1") + shard);
    EXPECT_GT(one.size(), 1024u) << shard;
    EXPECT_TRUE(one == data::testing::read_bytes(tmp.file("out2") + shard)) << shard;
    EXPECT_TRUE(one == data::testing::read_bytes(tmp.file("out3") + shard)) << shard;
  }
}

// Note [Byte-order mark]: files saved by Windows editors start with EF BB BF. A .jsonl so was
// refused on its first line, a text document began with the mark's bytes as tokens, and a
// tokenizer's files so were refused (vocab.json) or read a bogus merge (merges.txt). The mark is
// dropped: the shards equal those of the files without it.
TEST(Gpt2Tokenize, AUtf8ByteOrderMarkIsNotText) {
  TempDir tmp;
  const std::string bom = "\xEF\xBB\xBF", text = "Hello world. The end.\n";
  const std::string jsonl = "{\"text\": \"First line\"}\n{\"text\": \"second\"}\n";
  write(tmp, "plain.txt", text), write(tmp, "plain.jsonl", jsonl);
  write(tmp, "bom.txt", bom + text), write(tmp, "bom.jsonl", bom + jsonl);
  std::filesystem::create_directories(tmp.file("tok"));
  for (const char* name : {"vocab.json", "merges.txt"})
    write(tmp, std::string("tok/") + name, bom + data::testing::read_bytes(kFixture + name));
  ASSERT_EQ(tokenize(kFixtureTokenizer + "--out " + tmp.file("plain") + " " +
                     tmp.file("plain.txt") + " " + tmp.file("plain.jsonl"))
                .exit_code,
            0);
  const AppResult r = tokenize("--vocab " + tmp.file("tok/vocab.json") + " --merges " +
                               tmp.file("tok/merges.txt") + " --out " + tmp.file("bom") + " " +
                               tmp.file("bom.txt") + " " + tmp.file("bom.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_shard(tmp.file("bom/train_000000.bin")),
            read_shard(tmp.file("plain/train_000000.bin")));
  const data::TokenShard a(tmp.file("bom/train_000000.bin")), b(tmp.file("plain/train_000000.bin"));
  EXPECT_EQ(*a.tokenizer(), *b.tokenizer());  // the same tokenizer: no bogus merge
}

// Note [Not UTF-8]: Latin-1 text (older Project Gutenberg files) tokenizes byte by byte, and a
// model trained on it writes Latin-1; it is named with the iconv command, once per file for three
// files and then counted. UTF-8 cut by the 64 KiB the check reads is not named.
TEST(Gpt2Tokenize, TextNotInUtf8IsNamedWithTheCommandThatConvertsIt) {
  TempDir tmp;
  std::string files;
  for (int i = 0; i < 5; ++i)
    files += " " + write(tmp, "latin" + std::to_string(i) + ".txt", "Caf\xE9 cr\xE8me.\n");
  std::string utf8(65535, 'a');  // a two-byte character across the check's 64 KiB
  utf8 += "\xC3\xA9 the rest\n";
  files += " " + write(tmp, "utf8.txt", utf8);
  const AppResult r = tokenize(kFixtureTokenizer + "--out " + tmp.file("out") + files);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("latin0.txt' is not UTF-8 text: byte 0xE9 at offset 3 (2 such bytes in "
                          "its first 12 bytes)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("iconv -f WINDOWS-1252 -t UTF-8 '" + tmp.file("latin2.txt")),
            std::string::npos);
  EXPECT_EQ(r.output.find("latin3.txt' is not UTF-8"), std::string::npos);  // counted, not named
  EXPECT_NE(r.output.find("and 2 more inputs are not UTF-8 text"), std::string::npos);
  EXPECT_EQ(r.output.find("utf8.txt' is not UTF-8"), std::string::npos) << r.output;
}

// Note [Unfinished corpus]: a run killed half-way (kill -9, out of memory) left whole shards that
// gpt2_train trained on without a word. The marker written before the first shard stays, and
// gpt2_train refuses the directory; a finished run removes it.
TEST(Gpt2Tokenize, ARunKilledHalfWayLeavesShardsThatGpt2TrainRefuses) {
  TempDir tmp;
  const std::string base = data::testing::read_bytes(kFixture + "train.txt");
  std::string big;
  for (size_t i = 0; big.size() < (8u << 20); ++i)
    big += base.substr((i * 7919) % base.size(), 150);
  const std::string doc = write(tmp, "big.txt", big), out = tmp.file("out");
  {
    testing::Child child("gpt2_tokenize",
                         {"--vocab", kFixture + "vocab.json", "--merges", kFixture + "merges.txt",
                          "--threads", "1", "--shard-tokens", "1000", "--out", out, doc},
                         tmp.file("child.log"));
    ASSERT_TRUE(child.wait_for([&] { return std::filesystem::exists(out + "/train_000002.bin"); }))
        << child.output();
    child.signal(SIGKILL);
    child.finish();
  }
  EXPECT_TRUE(std::filesystem::exists(out + "/" + data::kUnfinishedMarker));
  const AppResult train = testing::run_built_app(
      "gpt2_train", "--model tiny --vocab-size 600 --seq 16 --batch 2 --steps 1 --data " + out);
  EXPECT_EQ(train.exit_code, 1) << train.output;
  EXPECT_NE(train.output.find("holds the shards of a gpt2_tokenize run that has not finished"),
            std::string::npos)
      << train.output;
  const AppResult again = tokenize(kFixtureTokenizer + "--out " + out + " " + doc);
  EXPECT_NE(again.output.find("of a gpt2_tokenize run killed half-way"), std::string::npos)
      << again.output;
  ASSERT_EQ(tokenize(kFixtureTokenizer + "--out " + tmp.file("done") + " " + doc).exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(tmp.file("done/") + data::kUnfinishedMarker));
}

TEST(Gpt2Tokenize, BadInputsGiveClearErrors) {
  TempDir tmp;
  const std::string out = " --out " + tmp.file("out") + " ";
  const std::string good = write(tmp, "good.txt", "hello");
  write(tmp, "val_000000.bin", "an earlier run's shard");
  std::filesystem::create_directories(tmp.file("mine"));
  write(tmp, "mine/vocab.json", "{\"mine\": 0}");
  const std::string shard = tmp.file("s.bin");
  data::write_token_shard(shard, std::vector<uint16_t>(100, 7));
  struct Case {
    std::string args;
    int exit_code;
    std::string message;
  };
  std::string big_ids = data::testing::read_bytes(kFixture + "tokenizer.json");
  big_ids.insert(big_ids.find("\"added_tokens\": [") + 17,
                 "{\"id\": 70000, \"content\": \"<b>\"}, ");
  const std::string big = write(tmp, "big.json", big_ids);
  const std::vector<Case> cases = {
      {kFixtureTokenizer + out, 2, "no input files"},
      {kFixtureTokenizer + good, 2, "--out DIR is required"},
      {out + good, 2, "choose one tokenizer"},
      {kFixtureTokenizer + "--train-bpe 300" + out + good, 2, "choose one tokenizer"},
      {"--vocab " + kFixture + "vocab.json" + out + good, 2, "--vocab and --merges go together"},
      {kFixtureTokenizer + "--val-fraction 0.9" + out + good, 2, "--val-fraction '0.9'"},
      {kFixtureTokenizer + out + tmp.file("missing.txt"), 1, "missing.txt' is not a readable file"},
      {kFixtureTokenizer + out + write(tmp, "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": 3}\n"), 1,
       "bad.jsonl:2: expected a string field \"text\", found number 3"},
      {kFixtureTokenizer + out + write(tmp, "bad2.jsonl", "\n\nnot json\n"), 1,
       "bad2.jsonl:3:1: invalid JSON"},
      {"--train-bpe 100" + out + good, 2, "--train-bpe '100'"},
      {kFixtureTokenizer + "--out /proc/version " + good, 1, "pass --out a writable directory"},
      {kFixtureTokenizer + "--out " + tmp.path() + " " + good, 1,
       "already holds token shards (val_000000.bin); remove them"},
      // Note [Not text]: each became tokens of noise without a word.
      {kFixtureTokenizer + out + write(tmp, "c.txt.gz", std::string("\x1f\x8b\x08\0\0\0", 6)), 1,
       "c.txt.gz' is gzip-compressed, not text"},
      {kFixtureTokenizer + out + shard, 1, "s.bin' is a token shard (llm.c's header)"},
      {kFixtureTokenizer + out + write(tmp, "t.parquet", std::string("PAR1\x15\x04", 6)), 1,
       "t.parquet' is a Parquet file, not text: write its text column as JSONL first"},
      {kFixtureTokenizer + out + write(tmp, "u16.txt", std::string("\xff\xfeh\0i\0", 6)), 1,
       "u16.txt' is UTF-16 text"},
      {kFixtureTokenizer + out + write(tmp, "nul.txt", std::string("ab\0cd", 5)), 1,
       "nul.txt' holds a NUL byte at offset 2"},
      {kFixtureTokenizer + out + good + " " + tmp.path() + "/./good.txt", 2,
       "is '" + good + "' again: its documents would be tokenized twice"},
      // A tokenizer the user keeps in --out was replaced.
      {"--train-bpe 300 --out " + tmp.file("mine") + " " + good, 1,
       "already holds vocab.json, which --train-bpe would replace"},
      // Beside the shards it would name another tokenizer (Note [Tokenizer beside the shards]).
      {kFixtureTokenizer + "--out " + tmp.file("mine") + " " + good, 1,
       "already holds a vocab.json other than the tokenizer's '" + kFixture + "vocab.json'"},
      // No text: empty files exited 0 with shards of <|endoftext|> alone.
      {kFixtureTokenizer + out + write(tmp, "empty.txt", "") + " " +
           write(tmp, "markers.txt", "<|endoftext|><|endoftext|>"),
       1, "the inputs hold no text (1 empty document(s))"},
      {"--vocab " + kFixture + "merges.txt --merges " + kFixture + "vocab.json" + out + good, 1,
       "are --vocab and --merges swapped?"},
      // Of the other kind: gpt2_train read that vocab.json first, and trained without a tokenizer.
      {"--tokenizer " + kFixture + "tokenizer.json --out " + tmp.file("mine") + " " + good, 1,
       "already holds a vocab.json of another tokenizer than this run's"},
      // Refused before the corpus is read (it was when the first id past 65535 came out).
      {"--tokenizer " + big + out + good, 1,
       "has 70001 ids, and an llm.c shard holds uint16 tokens"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    const AppResult r = tokenize(c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
    // A failed run leaves nothing: the --out directory it created is gone with its contents.
    EXPECT_FALSE(std::filesystem::exists(tmp.file("out"))) << r.output;
  }
  EXPECT_EQ(data::testing::read_bytes(tmp.file("mine/vocab.json")), "{\"mine\": 0}");
  EXPECT_FALSE(std::filesystem::exists(tmp.file("mine/train_000000.bin")));
}

}  // namespace
}  // namespace mw
