// HF folder load/save: round trips, and every bad input gives an error that names the file and the
// problem while leaving the model untouched.
#include "models/gpt2/hf_io.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "../data/temp_dir.h"
#include "autograd/functions.h"
#include "data/safetensors.h"

namespace mw {
namespace {

using data::testing::expect_throw_with;
using data::testing::read_bytes;
using data::testing::TempDir;
using data::testing::write_bytes;
namespace fs = std::filesystem;

const std::string kFixture = std::string(MW_SOURCE_DIR) + "/tests/fixtures/gpt2_tiny";

std::vector<float> all_weights(const gpt2::GPT2& m) {
  std::vector<float> out;
  for (const auto& [name, t] : m.named_parameters()) {
    auto v = t.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TEST(HfIo, SaveThenLoadIsBitwiseAndConfigRoundTrips) {
  TempDir tmp;
  gpt2::Config c = gpt2::Config::preset("tiny");
  gpt2::GPT2 a(c, /*seed=*/5);
  gpt2::save_hf(a, tmp.file("out"));
  gpt2::Config c2 = gpt2::load_hf_config(tmp.file("out"));
  EXPECT_EQ(c2.n_layer, c.n_layer);
  EXPECT_EQ(c2.vocab_size, c.vocab_size);
  EXPECT_EQ(c2.layer_norm_epsilon, c.layer_norm_epsilon);
  gpt2::GPT2 b(c2, /*seed=*/6);
  ASSERT_NE(all_weights(a), all_weights(b));
  gpt2::load_hf_weights(b, tmp.file("out"));
  EXPECT_EQ(all_weights(a), all_weights(b));
}

TEST(HfIo, InitialisationFollowsHfStatistics) {
  gpt2::Config c = gpt2::Config::preset("tiny");
  c.n_embd = 64;
  c.vocab_size = 4096;
  gpt2::GPT2 m(c, 1);
  auto stddev = [](const Tensor& t) {
    auto v = t.to_vector<float>();
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += double(x) * x;
    double mean = s / v.size();
    return std::sqrt(s2 / v.size() - mean * mean);
  };
  // 262144 draws: the sample std of N(0, 0.02) is within 1% (5 sigma is 0.7%).
  EXPECT_NEAR(stddev(m.parameter("transformer.wte.weight")), 0.02, 0.0002);
  // c_proj weights: 0.02 / sqrt(2 * n_layer) = 0.01 for two layers; 4096 draws, 5 sigma = 5.5%.
  EXPECT_NEAR(stddev(m.parameter("transformer.h.0.attn.c_proj.weight")), 0.01, 0.00055);
  EXPECT_EQ(m.parameter("transformer.h.1.ln_2.weight").to_vector<float>(),
            std::vector<float>(64, 1.f));
  EXPECT_EQ(m.parameter("transformer.h.1.mlp.c_fc.bias").to_vector<float>(),
            std::vector<float>(256, 0.f));
}

TEST(HfIo, TruncatedWeightsNameTheFileAndLeaveTheModelUnchanged) {
  TempDir tmp;
  fs::create_directory(tmp.file("bad"));
  fs::copy_file(kFixture + "/config.json", tmp.file("bad/config.json"));
  std::string bytes = read_bytes(kFixture + "/model.safetensors");
  write_bytes(tmp.file("bad/model.safetensors"), bytes.substr(0, bytes.size() / 2));
  gpt2::GPT2 m(gpt2::load_hf_config(tmp.file("bad")), 3);
  auto before = all_weights(m);
  expect_throw_with<FormatError>([&] { gpt2::load_hf_weights(m, tmp.file("bad")); },
                                 {tmp.file("bad/model.safetensors")});
  EXPECT_EQ(before, all_weights(m));
}

TEST(HfIo, CorruptHeaderIsAFormatError) {
  TempDir tmp;
  fs::create_directory(tmp.file("bad"));
  fs::copy_file(kFixture + "/config.json", tmp.file("bad/config.json"));
  std::string bytes = read_bytes(kFixture + "/model.safetensors");
  bytes[12] = '\x01';  // inside the JSON header
  write_bytes(tmp.file("bad/model.safetensors"), bytes);
  gpt2::GPT2 m(gpt2::load_hf_config(tmp.file("bad")), 3);
  expect_throw_with<FormatError>([&] { gpt2::load_hf_weights(m, tmp.file("bad")); },
                                 {"model.safetensors"});
}

TEST(HfIo, ConfigThatDoesNotMatchTheWeightsIsReported) {
  TempDir tmp;
  fs::create_directory(tmp.file("bad"));
  fs::copy_file(kFixture + "/model.safetensors", tmp.file("bad/model.safetensors"));
  gpt2::Config c = gpt2::load_hf_config(kFixture);
  c.n_embd = 64;  // weights are 32 wide
  c.to_json_file(tmp.file("bad/config.json"));
  gpt2::GPT2 m(gpt2::load_hf_config(tmp.file("bad")), 3);
  expect_throw_with<FormatError>([&] { gpt2::load_hf_weights(m, tmp.file("bad")); },
                                 {"transformer.wte.weight", "[97, 32]", "expected [97, 64]"});
  c = gpt2::load_hf_config(kFixture);
  c.n_layer = 3;  // weights have two blocks
  c.to_json_file(tmp.file("bad/config.json"));
  gpt2::GPT2 m3(gpt2::load_hf_config(tmp.file("bad")), 3);
  expect_throw_with<FormatError>([&] { gpt2::load_hf_weights(m3, tmp.file("bad")); },
                                 {"transformer.h.2.ln_1.weight", "missing"});
}

TEST(HfIo, BadConfigJsonAndMissingFolder) {
  TempDir tmp;
  expect_throw_with<IoError>([&] { gpt2::load_hf_config(tmp.file("nope")); },
                             {"not a directory", "config.json"});
  fs::create_directory(tmp.file("bad"));
  write_bytes(tmp.file("bad/config.json"), "{\"n_layer\": 2, \"n_head\": 4");
  expect_throw_with<FormatError>([&] { gpt2::load_hf_config(tmp.file("bad")); }, {"config.json"});
  write_bytes(
      tmp.file("bad/config.json"),
      "{\"n_layer\": 2, \"n_head\": 3, \"n_embd\": 32, \"vocab_size\": 97, \"n_positions\": 8}");
  expect_throw_with<FormatError>([&] { gpt2::load_hf_config(tmp.file("bad")); },
                                 {"not divisible by n_head"});
}

TEST(HfIo, UntiedLmHeadIsRefusedTiedCopyIsAccepted) {
  TempDir tmp;
  fs::create_directory(tmp.file("d"));
  fs::copy_file(kFixture + "/config.json", tmp.file("d/config.json"));
  data::SafeTensorsReader src(kFixture + "/model.safetensors");
  std::vector<std::vector<char>> bufs;
  data::SafeTensorsWriter w;
  for (const auto& r : src.tensors()) {
    bufs.emplace_back(r.nbytes);
    src.read(r, bufs.back().data());
    w.add(r.name, r.dtype, r.shape, bufs.back().data());
  }
  const auto& wte = src.at("transformer.wte.weight");
  std::vector<char> head(static_cast<size_t>(wte.nbytes));
  src.read(wte, head.data());
  w.add("lm_head.weight", wte.dtype, wte.shape, head.data());
  w.write(tmp.file("d/model.safetensors"));
  gpt2::GPT2 m(gpt2::load_hf_config(tmp.file("d")), 0);
  EXPECT_NO_THROW(gpt2::load_hf_weights(m, tmp.file("d")));
  head[0] ^= 1;  // now untied
  data::SafeTensorsWriter w2;
  for (size_t i = 0; i < src.tensors().size(); ++i)
    w2.add(src.tensors()[i].name, src.tensors()[i].dtype, src.tensors()[i].shape, bufs[i].data());
  w2.add("lm_head.weight", wte.dtype, wte.shape, head.data());
  w2.write(tmp.file("d/model.safetensors"));
  expect_throw_with<FormatError>([&] { gpt2::load_hf_weights(m, tmp.file("d")); },
                                 {"lm_head.weight differs"});
}

}  // namespace
}  // namespace mw
