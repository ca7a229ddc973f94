// KV-cache generation against the plain path: the decoder's logits equal GPT2::forward's last row,
// and greedy generation equals a loop of full forwards + argmax, on the tiny HF fixture.
#include "models/gpt2/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "../apps/run_app.h"
#include "../data/temp_dir.h"
#include "data/bpe.h"
#include "models/gpt2/hf_io.h"
#include "text_model.h"

namespace mw {
namespace {

const std::string kFixture = std::string(MW_SOURCE_DIR) + "/tests/fixtures/gpt2_tiny";

std::unique_ptr<gpt2::GPT2> load_model() {
  auto model = std::make_unique<gpt2::GPT2>(gpt2::load_hf_config(kFixture));
  gpt2::load_hf_weights(*model, kFixture);
  model->eval();
  return model;
}

// The logits of the last position from a full forward over ids.
std::vector<float> last_logits(gpt2::GPT2& model, const std::vector<int32_t>& ids) {
  const int64_t T = static_cast<int64_t>(ids.size()), V = model.config().vocab_size;
  const std::vector<float> all =
      model.forward(Tensor::from_vector<int32_t>(ids, {1, T})).to_vector<float>();
  return std::vector<float>(all.end() - V, all.end());
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// f32 tolerance: the decoder sums attention and GEMVs in another order than the batched forward
// (OpenBLAS GEMM, tiled); with K <= 128 terms of size ~1 each logit can differ by ~1e-6, compounded
// over two blocks. 1e-4 absolute bounds that, while a wrong position, mask or scale moves logits by
// > 1e-2.
TEST(Generate, KvCacheLogitsEqualTheFullForwardAtEveryPosition) {
  auto model = load_model();
  gpt2::KvCacheDecoder decoder(*model);
  std::vector<int32_t> ids;
  for (int32_t t = 0; t < 32; ++t) {  // n_positions: the whole context
    ids.push_back((t * 37 + 11) % 97);
    const std::vector<float> got = decoder.feed(ids.back());
    const std::vector<float> want = last_logits(*model, ids);
    ASSERT_EQ(got.size(), want.size());
    float worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {  // a NaN counts as infinitely far
      const float d = std::abs(got[i] - want[i]);
      worst = std::max(worst, std::isnan(d) ? INFINITY : d);
    }
    EXPECT_LT(worst, 1e-4f) << "position " << t;
  }
  EXPECT_THROW(decoder.feed(1), InvalidArgument);  // the context is full
}

TEST(Generate, GreedyEqualsAPlainLoopOfFullForwards) {
  auto model = load_model();
  const std::vector<int32_t> prompt = {5, 17, 42};
  std::vector<int32_t> ids = prompt, want;
  for (int i = 0; i < 20; ++i) {
    want.push_back(argmax(last_logits(*model, ids)));
    ids.push_back(want.back());
  }
  gpt2::SamplingOptions greedy;
  greedy.temperature = 0;
  EXPECT_EQ(gpt2::generate(*model, prompt, 20, greedy), want);
  // top-k 1 and a tiny top-p keep only the most likely token: greedy too, at any temperature.
  gpt2::SamplingOptions top1;
  top1.top_k = 1;
  EXPECT_EQ(gpt2::generate(*model, prompt, 20, top1), want);
  gpt2::SamplingOptions tiny_p;
  tiny_p.top_p = 1e-6;
  EXPECT_EQ(gpt2::generate(*model, prompt, 20, tiny_p), want);
}

TEST(Generate, SamplingIsSeededAndStopsAtTheContext) {
  auto model = load_model();
  gpt2::SamplingOptions a;
  a.seed = 1;
  a.temperature = 1.5;  // flat enough that two seeds differ
  gpt2::SamplingOptions b = a;
  b.seed = 2;
  const auto sa = gpt2::generate(*model, {1}, 31, a);
  EXPECT_EQ(sa.size(), 31u);
  EXPECT_EQ(gpt2::generate(*model, {1}, 31, a), sa);
  EXPECT_NE(gpt2::generate(*model, {1}, 31, b), sa);
  // 100 asked, 32 positions: the 31 tokens after a 1-token prompt, plus the last prediction.
  EXPECT_EQ(gpt2::generate(*model, {1}, 100, a).size(), 32u);
  EXPECT_THROW(gpt2::generate(*model, {}, 5, a), InvalidArgument);
  // A prompt longer than the context is refused for its length (it said "use fewer new tokens").
  try {
    gpt2::generate(*model, std::vector<int32_t>(40, 1), 5, a);
    ADD_FAILURE() << "a 40-token prompt in a 32-position context";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(
        std::string(e.what()).find("the prompt is 40 tokens and the model's context holds 32"),
        std::string::npos)
        << e.what();
  }
  EXPECT_EQ(gpt2::generate(*model, std::vector<int32_t>(32, 1), 5, a).size(), 1u);  // it fits
  gpt2::SamplingOptions bad;
  bad.top_p = -0.1;  // 0 is the most likely token alone (GenerateAsHf.TopPZero...)
  EXPECT_THROW(gpt2::Sampler{bad}, InvalidArgument);
}

// The sampler's frequencies against the distribution it claims. Logits log(0.5, 0.3, 0.15, 0.05):
// temperature 1 draws each id with its probability; top-k 2 renormalises over {0, 1} (0.625,
// 0.375); top-p 0.7 keeps the smallest prefix reaching 0.7, {0, 1}, the same; temperature 0.5
// squares the probabilities before renormalising. 40000 draws: the standard error of a frequency
// is at most 0.0025, so 0.015 (6 sigma) cannot fail by chance but catches any wrong formula.
TEST(Generate, SamplerFrequenciesMatchTheDistribution) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  auto frequencies = [&](gpt2::SamplingOptions o) {
    gpt2::Sampler sampler(o);
    std::vector<double> f(4, 0.0);
    for (int i = 0; i < 40000; ++i) f[sampler.next(logits, {})] += 1.0 / 40000;
    return f;
  };
  auto expect_near = [](const std::vector<double>& got, const std::vector<double>& want) {
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 0.015) << "id " << i;
  };
  gpt2::SamplingOptions o;
  o.seed = 9;
  expect_near(frequencies(o), {0.5, 0.3, 0.15, 0.05});
  gpt2::SamplingOptions k = o;
  k.top_k = 2;
  expect_near(frequencies(k), {0.625, 0.375, 0, 0});
  gpt2::SamplingOptions p = o;
  p.top_p = 0.7;
  expect_near(frequencies(p), {0.625, 0.375, 0, 0});
  gpt2::SamplingOptions t = o;
  t.temperature = 0.5;
  const double z = 0.25 + 0.09 + 0.0225 + 0.0025;
  expect_near(frequencies(t), {0.25 / z, 0.09 / z, 0.0225 / z, 0.0025 / z});
}

// A NaN logit would make the sort's order undefined, +Inf every probability NaN: both are refused
// by name; -Inf is an id that is never drawn.
TEST(Generate, SamplerRefusesNanAndInfiniteLogits) {
  const float inf = std::numeric_limits<float>::infinity();
  gpt2::SamplingOptions o;
  o.seed = 3;
  for (double temperature : {1.0, 0.0})
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), inf}) {
      o.temperature = temperature;
      gpt2::Sampler s(o);
      try {
        s.next({0.5f, bad, -1.f}, {});
        ADD_FAILURE() << "expected an Error for " << bad;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("logit for id 1"), std::string::npos) << e.what();
      }
    }
  o.temperature = 1;
  gpt2::Sampler s(o);
  for (int i = 0; i < 200; ++i) EXPECT_NE(s.next({-inf, 0.f, 1.f}, {}), 0);
}

// Note [Repetition penalty]: HF's rule, from its definition, on a loop of full forwards: every id
// in the context (prompt and generated) has its positive logit divided by the penalty and its
// negative one multiplied, once however often it occurs; then greedy. Penalty 1 is no change.
TEST(Generate, RepetitionPenaltyIsHfsRuleOnTheContext) {
  auto model = load_model();
  const std::vector<int32_t> prompt = {5, 17, 42, 17};
  for (const double penalty : {1.0, 1.3, 4.0}) {
    std::vector<int32_t> ids = prompt, want;
    for (int i = 0; i < 20; ++i) {
      std::vector<float> l = last_logits(*model, ids);
      std::vector<bool> seen(l.size());
      for (int32_t id : ids) seen[id] = true;
      for (size_t v = 0; v < l.size(); ++v)
        if (seen[v])
          l[v] = l[v] < 0 ? l[v] * static_cast<float>(penalty) : l[v] / static_cast<float>(penalty);
      want.push_back(argmax(l));
      ids.push_back(want.back());
    }
    gpt2::SamplingOptions o;
    o.temperature = 0;
    o.repetition_penalty = penalty;
    EXPECT_EQ(gpt2::generate(*model, prompt, 20, o), want) << "penalty " << penalty;
  }
  // A strong penalty changes what greedy picks on this model (else the check above checks little).
  gpt2::SamplingOptions plain, strong;
  plain.temperature = strong.temperature = 0;
  strong.repetition_penalty = 4;
  EXPECT_NE(gpt2::generate(*model, prompt, 20, plain), gpt2::generate(*model, prompt, 20, strong));
  // And the Sampler applies it to the context it is given, not to ids it has not seen: logits
  // {3, 2.5, -1}; 3 / 1.5 = 2 puts id 1 first, -1 * 1.5 keeps id 2 last.
  gpt2::SamplingOptions mid = plain;
  mid.repetition_penalty = 1.5;
  gpt2::Sampler s15(mid);
  EXPECT_EQ(s15.next({3.0f, 2.5f, -1.0f}, {}), 0);
  EXPECT_EQ(s15.next({3.0f, 2.5f, -1.0f}, {0, 0, 2}), 1);
  EXPECT_EQ(s15.next({-3.0f, -2.5f, -2.0f}, {2}), 1);  // -2 * 1.5 = -3 < -2.5
  gpt2::SamplingOptions bad;
  bad.repetition_penalty = 0;
  EXPECT_THROW(gpt2::Sampler{bad}, InvalidArgument);
}

// Note [Sliding context]: past n_positions (32 here) the KV cache is rebuilt from the last 16
// tokens, and a prompt longer than the context keeps its last 32: the same ids as a loop of full
// forwards over a window kept by that rule, plus greedy.
TEST(Generate, PastTheContextTheWindowSlides) {
  auto model = load_model();
  gpt2::SamplingOptions greedy;
  greedy.temperature = 0;
  for (const size_t prompt_size : {3u, 40u}) {
    std::vector<int32_t> prompt;
    for (size_t i = 0; i < prompt_size; ++i) prompt.push_back(static_cast<int32_t>((i * 13) % 97));
    std::vector<int32_t> window(prompt.end() - std::min<size_t>(prompt.size(), 32), prompt.end());
    std::vector<int32_t> want;
    int64_t slides = 0;
    for (int i = 0; i < 80; ++i) {
      want.push_back(argmax(last_logits(*model, window)));
      if (i + 1 == 80) break;  // the last token is never fed
      window.push_back(want.back());
      if (window.size() > 32) window.erase(window.begin(), window.end() - 16), ++slides;
    }
    gpt2::Slide slide;
    EXPECT_EQ(gpt2::generate(*model, prompt, 80, greedy, {}, &slide), want) << prompt_size;
    EXPECT_EQ(slide.slides, slides) << prompt_size;
    EXPECT_EQ(slide.prompt_dropped, static_cast<int64_t>(prompt_size) - 32 > 0 ? 8 : 0);
  }
  // 99 of the 100 tokens are fed: the window of 32 fills after 31, then every 17.
  const auto r = testing::run_built_app(
      "gpt2_generate", "--model " + kFixture + " --prompt-ids 5 --print-ids --max-new-tokens 100");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("1 prompt + 100 new tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the context slid 4 times (each keeping the last 16 tokens)"),
            std::string::npos)
      << r.output;
}

// --num-samples N: sample k is the one --seed S+k draws alone, each under its header.
TEST(Generate, AppDrawsSeveralSamplesWithConsecutiveSeeds) {
  const std::string base = "--model " + kFixture +
                           " --prompt-ids 5,17 --print-ids --max-new-tokens "
                           "6 --temperature 1.5 --repetition-penalty 1.2 ";
  const auto three = testing::run_built_app("gpt2_generate", base + "--seed 7 --num-samples 3");
  ASSERT_EQ(three.exit_code, 0) << three.output;
  for (int k = 0; k < 3; ++k) {
    const auto one =
        testing::run_built_app("gpt2_generate", base + "--seed " + std::to_string(7 + k));
    ASSERT_EQ(one.exit_code, 0) << one.output;
    const size_t at = one.output.find("ids: ");
    ASSERT_NE(at, std::string::npos) << one.output;
    const std::string ids = one.output.substr(at, one.output.find('\n', at) - at + 1);
    const std::string header = "=== sample " + std::to_string(k + 1) + " of 3 (--seed " +
                               std::to_string(7 + k) + ") ===\n";
    EXPECT_NE(three.output.find(header + ids), std::string::npos)
        << three.output << "\nwant " << header << ids;
  }
}

TEST(Generate, AppPrintsTheGreedyIds) {
  auto model = load_model();
  gpt2::SamplingOptions greedy;
  greedy.temperature = 0;
  const auto want = gpt2::generate(*model, {5, 17, 42}, 8, greedy);
  std::string line = "ids: ";
  for (size_t i = 0; i < want.size(); ++i) {
    if (i > 0) line += ',';
    line += std::to_string(want[i]);
  }
  const auto r = testing::run_built_app(
      "gpt2_generate", "--model " + kFixture +
                           " --prompt-ids 5,17,42 --print-ids --max-new-tokens 8 --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(line + "\n"), std::string::npos) << r.output << "\nwant " << line;
  const auto bad = testing::run_built_app("gpt2_generate", "--model " + kFixture + " --prompt hi");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("no tokenizer"), std::string::npos) << bad.output;
}

// Text mode: the prompt is encoded with the folder's vocab.json + merges.txt, echoed, and the
// continuation streamed as text, the same as the library's greedy ids decoded.
TEST(Generate, AppStreamsTextWithTheFoldersTokenizer) {
  data::testing::TempDir tmp;
  gpt2::testing::TextModel text_model(tmp, /*seed=*/3);
  data::BpeTokenizer& tok = text_model.tokenizer;
  const gpt2::GPT2& model = text_model.model;

  const std::string prompt = "The quick brown fox";
  gpt2::SamplingOptions greedy;
  greedy.temperature = 0;
  std::vector<int32_t> ids = gpt2::generate(model, tok.encode(prompt), 6, greedy);
  if (auto eot = std::find(ids.begin(), ids.end(), tok.eot_id()); eot != ids.end())
    ids.erase(eot, ids.end());  // the app stops at <|endoftext|>
  ASSERT_FALSE(ids.empty()) << "pick another seed: this model ends at once";
  const auto r = testing::run_built_app(
      "gpt2_generate", "--model " + tmp.path() +
                           " --prompt 'The quick brown fox' --max-new-tokens 6 --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind(prompt + tok.decode(ids) + "\n", 0), 0u)
      << r.output << "\nwant: " << prompt + tok.decode(ids);

  // --prompt-file: a file's text exactly, newline included (a shell's --prompt 'a\nb' is a
  // backslash and an n, which draws a warning naming both ways to a newline).
  const std::string two_lines = "The quick\nbrown fox";
  std::ofstream(tmp.file("prompt.txt"), std::ios::binary) << two_lines;
  std::vector<int32_t> after = gpt2::generate(model, tok.encode(two_lines), 6, greedy);
  if (auto eot = std::find(after.begin(), after.end(), tok.eot_id()); eot != after.end())
    after.erase(eot, after.end());
  const auto f = testing::run_built_app(
      "gpt2_generate", "--model " + tmp.path() + " --prompt-file " + tmp.file("prompt.txt") +
                           " --max-new-tokens 6 --temperature 0");
  ASSERT_EQ(f.exit_code, 0) << f.output;
  EXPECT_EQ(f.output.rfind(two_lines + tok.decode(after) + "\n", 0), 0u) << f.output;
  const auto literal = testing::run_built_app(
      "gpt2_generate",
      "--model " + tmp.path() + " --prompt 'The quick\\nbrown fox' --max-new-tokens 1");
  EXPECT_NE(literal.output.find("warning: --prompt holds a backslash and an n"), std::string::npos)
      << literal.output;
}

}  // namespace
}  // namespace mw
