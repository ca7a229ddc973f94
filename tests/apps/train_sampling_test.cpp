// gpt2_train's sampling during training (Note [Sampling during training]) and the tokenizer and
// config that --save writes (issue #12 items 4 and 5): sampling leaves the run's losses and
// weights bit for bit as they are, under NVMe offload too; a saved folder carries the tokenizer it
// was trained with, so gpt2_generate works on text from it directly. Under Gemini, sampling by
// full forwards gives the plain run's samples.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "../data/temp_dir.h"
#include "child.h"
#include "data/json.h"

namespace mw {
namespace {

using data::testing::read_bytes;
using data::testing::TempDir;
using testing::has;
using testing::Outcome;
using testing::run_app;
using testing::tiny;
namespace fs = std::filesystem;

const std::string kBpe = std::string(MW_SOURCE_DIR) + "/tests/fixtures/bpe/";

// The "loss" of every step record of a --log, exactly as written (17 significant digits).
std::vector<std::string> logged_losses(const std::string& log_path) {
  std::vector<std::string> out;
  std::istringstream in(read_bytes(log_path));
  for (std::string line; std::getline(in, line);) {
    const json::Value v = json::parse(line, log_path);
    if (v.contains("loss")) out.push_back(v.find("loss")->dump());
  }
  return out;
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

TEST(TrainSampling, SamplingLeavesLossesAndWeightsBitForBitUnderNvmeOffload) {
  TempDir tmp;
  const std::vector<std::string> base =
      tiny({"--steps", "4", "--dropout", "0.1", "--offload", "nvme", "--vocab-size", "588"});
  const Outcome plain = run_app(
      tmp, "gpt2_train", with(base, {"--save", tmp.file("a"), "--log", tmp.file("a.jsonl")}));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  // Ids without a tokenizer, every step; then text with the fixture's tokenizer, every 2 steps.
  const Outcome ids =
      run_app(tmp, "gpt2_train",
              with(base, {"--save", tmp.file("b"), "--log", tmp.file("b.jsonl"), "--sample-every",
                          "1", "--sample-tokens", "6", "--sample-prompt-ids", "5,7"}));
  ASSERT_EQ(ids.exit_code, 0) << ids.output;
  EXPECT_TRUE(has(ids.output, "[1] sample ids: ")) << ids.output;
  EXPECT_TRUE(has(ids.output, "[4] sample ids: ")) << ids.output;
  const Outcome text = run_app(
      tmp, "gpt2_train",
      with(base, {"--save", tmp.file("c"), "--log", tmp.file("c.jsonl"), "--sample-every", "2",
                  "--sample-prompt", "the", "--sample-temperature", "0.7", "--sample-seed", "3",
                  "--vocab", kBpe + "vocab.json", "--merges", kBpe + "merges.txt"}));
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_TRUE(has(text.output, "[2] sample: the")) << text.output;
  EXPECT_FALSE(has(text.output, "[1] sample")) << text.output;

  const std::vector<std::string> losses = logged_losses(tmp.file("a.jsonl"));
  ASSERT_EQ(losses.size(), 4u);
  EXPECT_EQ(logged_losses(tmp.file("b.jsonl")), losses);
  EXPECT_EQ(logged_losses(tmp.file("c.jsonl")), losses);
  const std::string weights = read_bytes(tmp.file("a/model.safetensors"));
  EXPECT_EQ(read_bytes(tmp.file("b/model.safetensors")), weights);
  EXPECT_EQ(read_bytes(tmp.file("c/model.safetensors")), weights);
}

// Under Gemini the sampler runs full forwards inside Gemini's evaluation scope (Note [Sampling
// during training]): the run's losses and weights stay bit for bit, and the samples are the plain
// run's: Gemini trains bit for bit as the plain run, and the full forward's logits equal the
// KV-cache decoder's to f32 rounding (1e-6), which moves a seeded draw only if it lands within
// that of a boundary between two tokens' cumulative probabilities. On a 64 MiB device with auto
// placement, then with three tiers (9 of 12 chunks homed on disk).
TEST(TrainSampling, UnderGeminiSamplesMatchThePlainRunAndLeaveTheRunAsItWas) {
  TempDir tmp;
  const std::vector<std::string> sampling = {"--sample-every",       "2",  "--sample-tokens", "8",
                                             "--sample-temperature", "1",  "--sample-seed",   "11",
                                             "--sample-prompt-ids",  "5,7"};
  const std::vector<std::string> base = tiny(
      {"--n-embd", "256", "--n-layer", "4", "--n-head", "4", "--steps", "4", "--dropout", "0"});
  const Outcome plain = run_app(tmp, "gpt2_train", with(base, sampling));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  auto samples = [](const std::string& out) {
    std::string lines;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);)
      if (line.find("] sample ids: ") != std::string::npos) lines += line + "\n";
    return lines;
  };
  ASSERT_NE(samples(plain.output).find("[4] sample ids: "), std::string::npos) << plain.output;
  const std::vector<std::vector<std::string>> placements = {
      {"--device", "sim:64MiB", "--gemini", "auto"},
      {"--device", "sim:64MiB", "--gemini", "auto", "--host-capacity", "11MiB", "--nvme-window",
       "1MiB", "--chunk-size", "300000", "--nvme-dir", tmp.path()}};
  for (const auto& placement : placements) {
    const std::string a = tmp.file("a"), b = tmp.file("b");
    const Outcome quiet = run_app(
        tmp, "gpt2_train", with(with(base, placement), {"--save", a, "--log", a + ".jsonl"}));
    ASSERT_EQ(quiet.exit_code, 0) << quiet.output;
    const Outcome sampled =
        run_app(tmp, "gpt2_train",
                with(with(with(base, placement), sampling), {"--save", b, "--log", b + ".jsonl"}));
    ASSERT_EQ(sampled.exit_code, 0) << sampled.output;
    if (placement.size() > 4) {
      EXPECT_TRUE(has(sampled.output, "9 of 12 chunks (9 MiB) homed on disk")) << sampled.output;
    }
    EXPECT_EQ(samples(sampled.output), samples(plain.output)) << sampled.output;
    EXPECT_EQ(logged_losses(b + ".jsonl"), logged_losses(a + ".jsonl"));
    EXPECT_EQ(read_bytes(b + "/model.safetensors"), read_bytes(a + "/model.safetensors"));
    fs::remove_all(a), fs::remove_all(b);
  }
}

// Under --precision bf16 both samplers run in f32 (Note [Sampling during training]): a forward
// under autocast drew other tokens than the plain run's decoder from the same weights (all six
// here, found by tools/auto_sweep.py bitwise), so the sample depended on the placement.
TEST(TrainSampling, UnderBf16GeminiSamplesTheTokensOfThePlainRun) {
  TempDir tmp;
  std::vector<std::string> base;
  std::istringstream words(
      "--model small --n-layer 4 --n-embd 128 --n-head 4 --vocab-size 1000 --batch 2 --seq 64 "
      "--steps 5 --dropout 0 --precision bf16 --sample-every 5 --sample-tokens 6 "
      "--sample-prompt-ids 1,2 --device sim:4GiB");
  for (std::string w; words >> w;) base.push_back(w);
  const Outcome plain = run_app(tmp, "gpt2_train", base);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const Outcome gemini = run_app(tmp, "gpt2_train", with(base, {"--gemini", "auto"}));
  ASSERT_EQ(gemini.exit_code, 0) << gemini.output;
  const auto sample = [](const std::string& out) {
    const size_t at = out.find("[5] sample ids: ");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  ASSERT_NE(sample(plain.output), "") << plain.output;
  EXPECT_EQ(sample(gemini.output), sample(plain.output)) << gemini.output;
}

TEST(TrainSampling, RefusedWhereItCannotWorkWithTheReason) {
  TempDir tmp;
  const Outcome no_tokenizer = run_app(
      tmp, "gpt2_train", tiny({"--steps", "1", "--sample-every", "1", "--sample-prompt", "hi"}));
  EXPECT_EQ(no_tokenizer.exit_code, 1) << no_tokenizer.output;
  EXPECT_TRUE(has(no_tokenizer.output, "this run knows no tokenizer")) << no_tokenizer.output;
  const Outcome lone = run_app(tmp, "gpt2_train", tiny({"--steps", "1", "--sample-tokens", "3"}));
  EXPECT_EQ(lone.exit_code, 2) << lone.output;
  EXPECT_TRUE(has(lone.output, "--sample-tokens needs --sample-every")) << lone.output;
  const Outcome out_of_range =
      run_app(tmp, "gpt2_train",
              tiny({"--steps", "1", "--sample-every", "1", "--sample-prompt-ids", "97"}));
  EXPECT_EQ(out_of_range.exit_code, 1) << out_of_range.output;
  EXPECT_TRUE(has(out_of_range.output, "holds token 97 but the model has 97 tokens"))
      << out_of_range.output;
  const Outcome big_vocab = run_app(
      tmp, "gpt2_train",
      tiny({"--steps", "1", "--vocab", kBpe + "vocab.json", "--merges", kBpe + "merges.txt"}));
  EXPECT_EQ(big_vocab.exit_code, 1) << big_vocab.output;
  EXPECT_TRUE(has(big_vocab.output, "has 588 tokens but the model only 97")) << big_vocab.output;
}

TEST(TrainSampling, SaveWritesTheTokenizerAndTheUsersConfig) {
  TempDir tmp;
  const std::vector<std::string> base = tiny({"--steps", "1", "--vocab-size", "588"});
  // vocab.json + merges.txt named by options, then found again in --init-from's folder.
  ASSERT_EQ(run_app(tmp, "gpt2_train",
                    with(base, {"--vocab", kBpe + "vocab.json", "--merges", kBpe + "merges.txt",
                                "--dropout", "0", "--save", tmp.file("m")}))
                .exit_code,
            0);
  for (const char* name : {"vocab.json", "merges.txt"})
    EXPECT_EQ(read_bytes(tmp.file("m/") + name), read_bytes(kBpe + name)) << name;
  EXPECT_TRUE(has(read_bytes(tmp.file("m/config.json")), "\"resid_pdrop\":0.1"));
  const std::string generation = read_bytes(tmp.file("m/generation_config.json"));
  EXPECT_TRUE(has(generation, "\"bos_token_id\":587")) << generation;
  EXPECT_TRUE(has(generation, "\"eos_token_id\":587")) << generation;

  const Outcome again =
      run_app(tmp, "gpt2_train",
              {"--init-from", tmp.file("m"), "--steps", "1", "--seq", "16", "--batch", "2",
               "--threads", "2", "--dropout", "0", "--save-run-dropout", "--save", tmp.file("m2")});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(has(again.output, "Tokenizer: " + tmp.file("m/vocab.json"))) << again.output;
  EXPECT_EQ(read_bytes(tmp.file("m2/merges.txt")), read_bytes(kBpe + "merges.txt"));
  EXPECT_TRUE(has(read_bytes(tmp.file("m2/config.json")), "\"resid_pdrop\":0.0,"));

  // gpt2_generate on text, with the files the save wrote.
  const Outcome gen = run_app(tmp, "gpt2_generate",
                              {"--model", tmp.file("m2"), "--prompt", "the cat", "--max-new-tokens",
                               "5", "--temperature", "0"});
  EXPECT_EQ(gen.exit_code, 0) << gen.output;
  EXPECT_EQ(gen.output.rfind("the cat", 0), 0u) << gen.output;

  // tokenizer.json the same way.
  ASSERT_EQ(run_app(tmp, "gpt2_train",
                    with(base, {"--tokenizer", kBpe + "tokenizer.json", "--save", tmp.file("t")}))
                .exit_code,
            0);
  EXPECT_EQ(read_bytes(tmp.file("t/tokenizer.json")), read_bytes(kBpe + "tokenizer.json"));
  EXPECT_FALSE(fs::exists(tmp.file("t/vocab.json")));
}

// A padded vocabulary (llm.c pads GPT-2's 50257 to 50304): the model has ids the tokenizer lacks.
// gpt2_train's samples give them no text; gpt2_generate stopped at the first one with "token id N
// is not in the vocabulary", mid-stream. It now streams on, gives them no text either, and counts
// them.
TEST(TrainSampling, IdsOfAPaddedVocabularyPastTheTokenizerHaveNoText) {
  TempDir tmp;
  ASSERT_EQ(run_app(tmp, "gpt2_train",
                    tiny({"--steps", "1", "--vocab-size", "2000", "--vocab", kBpe + "vocab.json",
                          "--merges", kBpe + "merges.txt", "--save", tmp.file("m")}))
                .exit_code,
            0);
  // An untrained model draws each of 2000 ids about evenly: 70% of them past the tokenizer's 588.
  const std::vector<std::string> args = {"--model", tmp.file("m"), "--max-new-tokens", "20"};
  const Outcome ids = run_app(tmp, "gpt2_generate", with(args, {"--print-ids"}));
  ASSERT_EQ(ids.exit_code, 0) << ids.output;
  int64_t past = 0;
  std::istringstream list(ids.output.substr(ids.output.find("ids: ") + 5));
  for (std::string id; std::getline(list, id, ',');) past += std::stoi(id) >= 588 ? 1 : 0;
  ASSERT_GT(past, 0) << ids.output;
  const Outcome text = run_app(tmp, "gpt2_generate", args);
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_TRUE(has(text.output, "past the tokenizer's 588 ids (a padded vocabulary): no text"))
      << text.output;
}

// A new model's end of text is its tokenizer's <|endoftext|>: a tokenizer.json with a token added
// after it ("<|sep|>", 588, after the fixture's 587) made the config name the last id, the added
// token, as eos, and generation stopped there.
TEST(TrainSampling, ANewModelsEosIsItsTokenizersEndOfText) {
  TempDir tmp;
  std::string json = read_bytes(kBpe + "tokenizer.json");
  const std::string list = "\"added_tokens\": [";
  json.replace(json.find(list), list.size(),
               list + "{\"id\": 588, \"content\": \"<|sep|>\", \"special\": true}, ");
  std::ofstream(tmp.file("tj.json")) << json;
  ASSERT_EQ(run_app(tmp, "gpt2_train",
                    tiny({"--steps", "1", "--vocab-size", "589", "--tokenizer", tmp.file("tj.json"),
                          "--save", tmp.file("m")}))
                .exit_code,
            0);
  const std::string config = read_bytes(tmp.file("m/config.json"));
  EXPECT_TRUE(has(config, "\"eos_token_id\":587")) << config;
  EXPECT_TRUE(has(config, "\"bos_token_id\":587")) << config;
}

// A vocabulary without <|endoftext|> (HF-trained ones often have <s> and </s>): its training
// samples and gpt2_generate stopped with "the vocabulary has no <|endoftext|>" after the first
// token, and the run died unsaved at its first sample. They stop at the config's eos ids, as HF's
// generate; a prompt id past the tokenizer's (a padded vocabulary's) is refused before step 0.
TEST(TrainSampling, AVocabularyWithoutEndOfTextSamplesAndGenerates) {
  TempDir tmp;
  std::string vocab = read_bytes(kBpe + "vocab.json");
  vocab.replace(vocab.find("<|endoftext|>"), 13, "</s>");
  std::ofstream(tmp.file("vocab.json")) << vocab;
  const std::vector<std::string> tok = {"--vocab", tmp.file("vocab.json"), "--merges",
                                        kBpe + "merges.txt"};
  const Outcome run = run_app(
      tmp, "gpt2_train",
      tiny(with(tok, {"--steps", "2", "--vocab-size", "588", "--sample-every", "1",
                      "--sample-tokens", "5", "--sample-prompt", "The", "--save", tmp.file("m")})));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(has(run.output, "[1] sample: The")) << run.output;
  const Outcome gen = run_app(tmp, "gpt2_generate",
                              {"--model", tmp.file("m"), "--max-new-tokens", "5", "--prompt", ""});
  EXPECT_EQ(gen.exit_code, 0) << gen.output;
  EXPECT_TRUE(has(gen.output, "[generate] 1 prompt + ")) << gen.output;  // the bos id
  const Outcome padded =
      run_app(tmp, "gpt2_train",
              tiny(with(tok, {"--steps", "2", "--vocab-size", "640", "--sample-every", "1",
                              "--sample-prompt-ids", "600,320"})));
  EXPECT_EQ(padded.exit_code, 1) << padded.output;  // as the model's own range (above)
  EXPECT_TRUE(has(padded.output, "the sampling prompt holds token 600 but the tokenizer has 588"))
      << padded.output;
  EXPECT_FALSE(has(padded.output, "[0] loss")) << "refused before the first step";
}

}  // namespace
}  // namespace mw
