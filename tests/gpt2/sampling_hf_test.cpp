// Generation as transformers' generate() does it (session 38, a read-only review of the sampling
// against transformers' logits warpers): the KV-cache decoder follows n_inner, top-k keeps the
// logits tied with the k-th, top-p 0 keeps the most likely token, and ids stop at the config's
// eos_token_id. Each failed before its fix.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "../apps/run_app.h"
#include "../data/temp_dir.h"
#include "models/gpt2/generate.h"
#include "models/gpt2/generation_config.h"
#include "models/gpt2/hf_io.h"

namespace mw {
namespace {

const std::string kFixture = std::string(MW_SOURCE_DIR) + "/tests/fixtures/gpt2_tiny";

// An MLP of 48 (n_inner; 4C = 128): the decoder ran 4C wide, reading past the weights, and its
// greedy ids differed from the full forward's (tolerance as KvCacheLogitsEqualTheFullForward...).
TEST(GenerateAsHf, TheDecoderFollowsNInner) {
  gpt2::Config config = gpt2::load_hf_config(kFixture);
  config.n_inner = 48;
  gpt2::GPT2 model(config);
  model.eval();
  gpt2::KvCacheDecoder decoder(model);
  std::vector<int32_t> ids;
  for (int32_t t = 0; t < 8; ++t) {
    ids.push_back((t * 37 + 11) % 97);
    const std::vector<float> got = decoder.feed(ids.back());
    const int64_t T = static_cast<int64_t>(ids.size()), V = config.vocab_size;
    const std::vector<float> all =
        model.forward(Tensor::from_vector<int32_t>(ids, {1, T})).to_vector<float>();
    float worst = 0;
    for (int64_t i = 0; i < V; ++i) {  // a NaN counts as infinitely far
      const float d = std::abs(got[i] - all[(T - 1) * V + i]);
      worst = std::max(worst, std::isnan(d) ? INFINITY : d);
    }
    EXPECT_LT(worst, 1e-4f) << "position " << t;
  }
}

std::vector<double> frequencies(const gpt2::SamplingOptions& o, const std::vector<float>& logits) {
  gpt2::Sampler sampler(o);
  std::vector<double> f(logits.size(), 0.0);
  for (int i = 0; i < 30000; ++i) f[sampler.next(logits, {})] += 1.0 / 30000;
  return f;
}

// transformers' TopKLogitsWarper removes the logits below the k-th (scores < topk[..., -1]):
// three tied at the top with k = 2 all stay, each a third (ids 0 and 1 only, a half each, before).
TEST(GenerateAsHf, TopKKeepsTheLogitsTiedWithTheKth) {
  gpt2::SamplingOptions o;
  o.seed = 4;
  o.top_k = 2;
  const std::vector<double> f = frequencies(o, {1.f, 1.f, 1.f, 0.f});
  for (int id = 0; id < 3; ++id) EXPECT_NEAR(f[id], 1.0 / 3, 0.015) << "id " << id;  // ~4 sigma
  EXPECT_EQ(f[3], 0.0);
}

// top_p 0 keeps the most likely token alone (TopPLogitsWarper keeps min_tokens_to_keep = 1); it
// was refused.
TEST(GenerateAsHf, TopPZeroKeepsTheMostLikelyToken) {
  gpt2::SamplingOptions o;
  o.seed = 4;
  o.top_p = 0;
  const std::vector<double> f = frequencies(o, {0.5f, 2.f, 1.9f, 0.f});
  EXPECT_NEAR(f[1], 1.0, 1e-9);  // every draw (1/30000 summed 30000 times)
}

// The fixture's 8 greedy ids after the prompt 5, 17, 42, as generate() makes them.
std::vector<int32_t> fixture_greedy_ids() {
  auto model = std::make_unique<gpt2::GPT2>(gpt2::load_hf_config(kFixture));
  gpt2::load_hf_weights(*model, kFixture);
  model->eval();
  gpt2::SamplingOptions greedy;
  greedy.temperature = 0;
  return gpt2::generate(*model, {5, 17, 42}, 8, greedy);
}

// A copy of the fixture in `dir` whose config.json holds "eos_token_id": `eos`.
void copy_fixture_with_eos(const std::string& dir, const std::string& eos) {
  std::filesystem::copy(kFixture, dir);
  std::ifstream in(dir + "/config.json");
  std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  config.insert(config.find('{') + 1, "\n  \"eos_token_id\": " + eos + ",");
  std::ofstream(dir + "/config.json", std::ios::trunc) << config;
}

// --print-ids stops at the config's eos_token_id as generate() does; it sampled on past it.
TEST(GenerateAsHf, PrintedIdsStopAtTheConfigsEos) {
  const std::vector<int32_t> want = fixture_greedy_ids();
  ASSERT_EQ(want.size(), 8u);
  const int32_t eos = want[2];
  data::testing::TempDir tmp;
  copy_fixture_with_eos(tmp.file("m"), std::to_string(eos));
  size_t first = 0;  // the first time the greedy ids reach eos
  while (want[first] != eos) ++first;
  std::string line = "ids: ";
  for (size_t i = 0; i <= first; ++i) line += (i ? "," : "") + std::to_string(want[i]);
  const auto r = testing::run_built_app(
      "gpt2_generate", "--model " + tmp.file("m") +
                           " --prompt-ids 5,17,42 --print-ids --max-new-tokens 8 --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(line + "\n"), std::string::npos) << r.output << "\nwant " << line;
}

// An eos_token_id list stops at any of its ids, and generation_config.json's eos_token_id is the
// one generate() uses (memwall stopped at the list's first id only, and ignored the second file).
TEST(GenerateAsHf, AnEosListAndTheGenerationConfigsEosStopAsGenerateDoes) {
  const std::vector<int32_t> want = fixture_greedy_ids();
  ASSERT_EQ(want.size(), 8u);
  int32_t unused = 0;  // an id the greedy run never makes: the list's first
  while (std::find(want.begin(), want.end(), unused) != want.end()) ++unused;
  data::testing::TempDir tmp;
  copy_fixture_with_eos(tmp.file("m"),
                        "[" + std::to_string(unused) + ", " + std::to_string(want[3]) + "]");
  const auto ids_until = [&](int32_t eos) {
    std::string line = "ids: ";
    for (size_t i = 0; i < want.size(); ++i) {
      line += (i ? "," : "") + std::to_string(want[i]);
      if (want[i] == eos) break;
    }
    return line + "\n";
  };
  const std::string args = " --prompt-ids 5,17,42 --print-ids --max-new-tokens 8 --temperature 0";
  auto r = testing::run_built_app("gpt2_generate", "--model " + tmp.file("m") + args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(ids_until(want[3])), std::string::npos) << r.output;
  std::ofstream(tmp.file("m/generation_config.json"), std::ios::trunc)
      << "{\"eos_token_id\": " << want[1] << "}";
  r = testing::run_built_app("gpt2_generate", "--model " + tmp.file("m") + args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(ids_until(want[1])), std::string::npos) << r.output;
}

// Note [Generation defaults]: the folder's generation_config.json is what generate() would use;
// its keys are the defaults, the command line overrides them, and a stock folder (token ids only)
// changes nothing.
TEST(GenerateAsHf, GenerationConfigJsonGivesTheDefaults) {
  data::testing::TempDir tmp;
  std::filesystem::create_directories(tmp.file("d"));
  auto write = [&](const std::string& text) {
    std::ofstream(tmp.file("d/generation_config.json"), std::ios::trunc) << text;
    return gpt2::read_generation_defaults(tmp.file("d"));
  };
  gpt2::GenerationDefaults d = write(R"({"bos_token_id": 50256, "eos_token_id": 50256})");
  EXPECT_FALSE(d.temperature || d.top_k || d.top_p || d.repetition_penalty || d.max_new_tokens);
  EXPECT_EQ(d.said, "");
  d = write(R"({"do_sample": true, "top_k": 40, "repetition_penalty": 1.2, "max_new_tokens": 9})");
  EXPECT_EQ(*d.temperature, 1.0);
  EXPECT_EQ(*d.top_k, 40);
  EXPECT_EQ(*d.top_p, 1.0);
  EXPECT_EQ(*d.repetition_penalty, 1.2);
  EXPECT_EQ(*d.max_new_tokens, 9);
  EXPECT_EQ(*write(R"({"do_sample": true})").top_k, 50);                // transformers' default
  EXPECT_EQ(*write(R"({"do_sample": true, "top_k": null})").top_k, 0);  // None: no top-k (was 50)
  EXPECT_EQ(*write(R"({"do_sample": false, "top_k": 5})").temperature, 0);
  EXPECT_FALSE(write(R"({"do_sample": false, "top_k": 5})").top_k);
  EXPECT_THROW(write(R"({"do_sample": "yes"})"), FormatError);
  EXPECT_THROW(write(R"({"top_k": 1.5, "do_sample": true})"), FormatError);
  EXPECT_FALSE(gpt2::read_generation_defaults(tmp.file("absent")).temperature);

  // The app: do_sample false is greedy, as --temperature 0; --temperature 1.5 overrides it.
  std::filesystem::copy(kFixture, tmp.file("m"));
  std::ofstream(tmp.file("m/generation_config.json"), std::ios::trunc)
      << R"({"do_sample": false, "max_new_tokens": 6})";
  const std::string args = " --prompt-ids 5,17,42 --print-ids --seed 3";
  const auto greedy = testing::run_built_app(
      "gpt2_generate", "--model " + kFixture + args + " --temperature 0 --max-new-tokens 6");
  const auto from_file = testing::run_built_app("gpt2_generate", "--model " + tmp.file("m") + args);
  ASSERT_EQ(from_file.exit_code, 0) << from_file.output;
  auto ids = [](const std::string& out) {  // the ids line alone (the summary has timings)
    const size_t at = out.find("ids: ");
    return at == std::string::npos ? out : out.substr(at, out.find('\n', at) - at);
  };
  EXPECT_EQ(ids(from_file.output), ids(greedy.output));
  EXPECT_NE(from_file.output.find("generation_config.json (as transformers' generate() takes it): "
                                  "do_sample false (greedy), max_new_tokens 6"),
            std::string::npos)
      << from_file.output;
  const auto hot = testing::run_built_app("gpt2_generate",
                                          "--model " + tmp.file("m") + args + " --temperature 1.5");
  const auto hot_plain = testing::run_built_app(
      "gpt2_generate", "--model " + kFixture + args + " --temperature 1.5 --max-new-tokens 6");
  EXPECT_EQ(ids(hot.output), ids(hot_plain.output));
}

}  // namespace
}  // namespace mw
