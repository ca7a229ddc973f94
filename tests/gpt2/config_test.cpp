// HF config.json and weights, honoured or refused (Note [GPT2Config fields], hf_io.h): the full
// GPT2Config field list, type errors naming the file and the field, n_inner, extra tensors, NaN
// weights, sharded checkpoints, pytorch_model.bin, and saves that never write non-finite weights.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "../data/temp_dir.h"
#include "data/json.h"
#include "data/safetensors.h"
#include "models/gpt2/hf_io.h"

namespace mw {
namespace {

using data::testing::expect_throw_with;
using data::testing::TempDir;
using data::testing::write_bytes;
namespace fs = std::filesystem;

const char* kBase =
    R"({"n_layer": 2, "n_head": 4, "n_embd": 32, "vocab_size": 97, "n_positions": 32)";

// config.json = the tiny shape plus `extra` members ("\"n_inner\": 64").
gpt2::Config parse_with(const std::string& extra) {
  return gpt2::Config::from_json_text(
      std::string(kBase) + (extra.empty() ? "" : ", " + extra) + "}", "dir/config.json");
}

// config.json = the tiny shape with `key` set (or replaced) to the JSON `value`.
gpt2::Config parse_with(const std::string& key, const std::string& value) {
  json::Value v = json::parse(std::string(kBase) + "}", "base");
  v.set(key, json::parse(value, "value"));
  return gpt2::Config::from_json_text(v.dump(), "dir/config.json");
}

struct FieldCase {
  const char* name;
  const char* valid;       // GPT2Config's default as JSON (n_head: one that divides n_embd 32)
  const char* other;       // another valid value: refused for the fields memwall fixes, or ""
  const char* wrong_type;  // a value of the wrong JSON type
};

// transformers' GPT2Config.__init__ (v4.x), every argument in order, with its default.
const FieldCase kGpt2ConfigFields[] = {
    {"vocab_size", "50257", "", "\"50257\""},
    {"n_positions", "1024", "", "1024.5"},
    {"n_embd", "768", "", "true"},
    {"n_layer", "12", "", "12.0"},
    {"n_head", "8", "", "[12]"},
    {"n_inner", "null", "", "\"3072\""},
    {"activation_function", "\"gelu_new\"", "\"relu\"", "1"},
    {"resid_pdrop", "0.1", "", "\"0.1\""},
    {"embd_pdrop", "0.1", "", "null"},
    {"attn_pdrop", "0.1", "", "{}"},
    {"layer_norm_epsilon", "1e-05", "", "\"1e-5\""},
    {"initializer_range", "0.02", "", "\"x\""},
    {"summary_type", "\"cls_index\"", "", "1"},
    {"summary_use_proj", "true", "", "1"},
    {"summary_activation", "null", "", "1"},
    {"summary_proj_to_labels", "true", "", "\"yes\""},
    {"summary_first_dropout", "0.1", "", "\"0.1\""},
    {"scale_attn_weights", "true", "false", "1"},
    {"use_cache", "true", "", "\"true\""},
    {"bos_token_id", "50256", "", "\"50256\""},
    {"eos_token_id", "50256", "", "1.5"},
    {"scale_attn_by_inverse_layer_idx", "false", "true", "0"},
    {"reorder_and_upcast_attn", "false", "true", "\"false\""},
};

TEST(Gpt2Config, EveryGpt2ConfigFieldIsHonouredOrRefusedByName) {
  for (const FieldCase& f : kGpt2ConfigFields) {
    SCOPED_TRACE(f.name);
    const std::string quoted = std::string("\"") + f.name + "\"";
    EXPECT_NO_THROW(parse_with(f.name, f.valid));
    if (*f.other)
      expect_throw_with<FormatError>([&] { parse_with(f.name, f.other); },
                                     {"dir/config.json", quoted, "not supported"});
    expect_throw_with<FormatError>([&] { parse_with(f.name, f.wrong_type); },
                                   {"dir/config.json", quoted, "expected"});
  }
  // Honoured shapes are the values read.
  EXPECT_EQ(parse_with("n_positions", "1024").n_positions, 1024);
  EXPECT_EQ(parse_with("vocab_size", "50257").vocab_size, 50257);
}

TEST(Gpt2Config, HonouredFieldsChangeTheModel) {
  gpt2::Config c = parse_with(R"("n_inner": 48, "layer_norm_epsilon": 1e-6,
      "activation_function": "gelu_pytorch_tanh", "initializer_range": 0.01, "resid_pdrop": 0.2)");
  EXPECT_EQ(c.mlp_width(), 48);
  EXPECT_EQ(c.layer_norm_epsilon, 1e-6);
  EXPECT_EQ(c.initializer_range, 0.01);
  EXPECT_EQ(c.resid_pdrop, 0.2);
  EXPECT_EQ(parse_with(R"("n_inner": null)").mlp_width(), 4 * 32);
  gpt2::GPT2 m(c, 1);
  EXPECT_EQ(m.parameter("transformer.h.0.mlp.c_fc.weight").shape(), (std::vector<int64_t>{32, 48}));
  // initializer_range sets the initial spread: wte's 97 * 32 = 3104 draws of N(0, 0.01) have a
  // sample std within 10% of 0.01 (the std of the estimate is 1.3%; 10% is 7 sigma).
  double s2 = 0;
  const std::vector<float> wte = m.parameter("transformer.wte.weight").to_vector<float>();
  for (float x : wte) s2 += double(x) * x;
  EXPECT_NEAR(std::sqrt(s2 / wte.size()), 0.01, 0.001);
  // Not silently defaulted: the issue's non-numeric epsilon, a bad n_inner, an unknown shape key.
  expect_throw_with<FormatError>([] { parse_with(R"("layer_norm_epsilon": "abc")"); },
                                 {"dir/config.json", "\"layer_norm_epsilon\"", "a number"});
  expect_throw_with<FormatError>([] { parse_with(R"("n_inner": -4)"); },
                                 {"\"n_inner\"", "positive"});
  expect_throw_with<FormatError>([] { parse_with(R"("hidden_size": 32)"); }, {"n_embd"});
  // transformers ignores n_ctx (it was refused when it differed from n_positions until session
  // 38); a bos list takes its first id, an eos list is kept whole (it kept only its first until
  // session 40); "dtype" is newer transformers' torch_dtype.
  EXPECT_EQ(parse_with("n_ctx", "64").n_positions, c.n_positions);
  const gpt2::Config listed = parse_with("eos_token_id", "[50, 60]");  // generate stops at either
  EXPECT_EQ(listed.eos_token_id, 50);
  EXPECT_TRUE(listed.is_eos(60) && listed.is_eos(50) && !listed.is_eos(70));
  EXPECT_NE(listed.to_json().find("\"eos_token_id\":[50,60]"), std::string::npos)
      << listed.to_json();
  EXPECT_EQ(parse_with("eos_token_id", "null").eos_token_id, -1);
  expect_throw_with<FormatError>([] { parse_with("eos_token_id", "[]"); }, {"eos_token_id"});
  EXPECT_TRUE(parse_with("dtype", "\"float32\"").unknown_fields.empty());
  EXPECT_EQ(parse_with("activation_function", "\"gelu_accurate\"").n_embd, c.n_embd);
  expect_throw_with<FormatError>([] { parse_with("n_layer", "100000000"); }, {"exceeds"});
  EXPECT_EQ(parse_with(R"("my_note": 1)").unknown_fields, std::vector<std::string>{"my_note"});
}

TEST(Gpt2Config, NInnerModelsRunAndRoundTripThroughAFolder) {
  TempDir tmp;
  gpt2::Config c = parse_with(R"("n_inner": 40)");
  c.set_dropout(0.0);  // deterministic forwards
  gpt2::GPT2 a(c, 4);
  Tensor ids = Tensor::from_vector(std::vector<int32_t>{1, 5, 9, 2, 7, 3}, {1, 6});
  const std::vector<float> logits = a(ids).to_vector<float>();
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  gpt2::save_hf(a, tmp.file("m"));
  gpt2::Config c2 = gpt2::load_hf_config(tmp.file("m"));
  EXPECT_EQ(c2.n_inner, 40);
  EXPECT_EQ(c2.resid_pdrop, 0.0);
  gpt2::GPT2 b(c2, 5);
  gpt2::load_hf_weights(b, tmp.file("m"));
  EXPECT_EQ(b(ids).to_vector<float>(), logits);  // same weights, same code: bitwise
  // A 4*n_embd checkpoint under an n_inner config is a shape mismatch naming the tensor.
  gpt2::save_hf(gpt2::GPT2(gpt2::Config::preset("tiny"), 1), tmp.file("plain"));
  expect_throw_with<FormatError>([&] { gpt2::load_hf_weights(b, tmp.file("plain")); },
                                 {"mlp.c_fc.weight", "[32, 128]", "[32, 40]"});
}

class HfWeights : public ::testing::Test {
 protected:
  // A saved tiny model in tmp/m, and its weights for comparison.
  void SetUp() override {
    gpt2::GPT2 m(gpt2::Config::preset("tiny"), 3);
    gpt2::save_hf(m, dir);
  }
  TempDir tmp;
  std::string dir = tmp.file("m");
};

TEST_F(HfWeights, TensorsTheConfigDoesNotAccountForAreRefusedListed) {
  // The issue's case: config.json with fewer layers than the weights.
  gpt2::Config one = gpt2::Config::preset("tiny");
  one.n_layer = 1;
  one.to_json_file(dir + "/config.json");
  gpt2::GPT2 m(gpt2::load_hf_config(dir), 1);
  expect_throw_with<FormatError>([&] { gpt2::load_hf_weights(m, dir); },
                                 {"not accounted for", "transformer.h.1.", "n_layer 1"});
}

// GPT2DoubleHeadsModel's multiple-choice head (and the classifiers' score) is named for what it
// is; it was "not accounted for ... does config.json (n_layer 2) match the weights?".
TEST_F(HfWeights, AnotherArchitecturesHeadIsNamed) {
  gpt2::GPT2 m(gpt2::Config::preset("tiny"), 3);
  data::SafeTensorsWriter w;
  std::vector<Tensor> keep;
  for (const auto& spec : m.specs()) {
    keep.push_back(m.parameter(spec.name));
    w.add(spec.name, DType::F32, spec.shape, keep.back().raw_data());
  }
  const std::vector<float> head(m.config().n_embd, 0.5f);
  w.add("multiple_choice_head.summary.weight", DType::F32, {1, m.config().n_embd}, head.data());
  w.write(dir + "/model.safetensors");
  expect_throw_with<FormatError>([&] { gpt2::load_hf_weights(m, dir); },
                                 {"multiple_choice_head.summary.weight", "another model's head",
                                  "GPT2LMHeadModel.from_pretrained"});
}

// A NaN at the same place of a tied lm_head.weight and wte is one damaged tensor, refused as
// such; it was "lm_head.weight differs from transformer.wte.weight" (NaN != NaN).
TEST_F(HfWeights, ANanInATiedHeadIsTheDamageNotADifference) {
  gpt2::GPT2 m(gpt2::Config::preset("tiny"), 3);
  {
    NoGradGuard g;
    m.parameter("transformer.wte.weight").data<float>()[5] = NAN;
  }
  data::SafeTensorsWriter w;
  std::vector<Tensor> keep;
  for (const auto& spec : m.specs()) {
    keep.push_back(m.parameter(spec.name));
    w.add(spec.name, DType::F32, spec.shape, keep.back().raw_data());
  }
  w.add("lm_head.weight", DType::F32, m.parameter("transformer.wte.weight").shape(),
        keep.front().raw_data());
  ASSERT_EQ(m.specs().front().name, "transformer.wte.weight");
  w.write(dir + "/model.safetensors");
  gpt2::GPT2 fresh(gpt2::Config::preset("tiny"), 2);
  expect_throw_with<FormatError>([&] { gpt2::load_hf_weights(fresh, dir); },
                                 {"transformer.wte.weight", "finite"});
}

TEST_F(HfWeights, NonFiniteWeightsAreRefusedAtLoadAndNeverSaved) {
  gpt2::GPT2 m(gpt2::Config::preset("tiny"), 1);
  {
    NoGradGuard g;
    m.parameter("transformer.h.1.ln_2.bias").data<float>()[3] = NAN;
  }
  const std::string before = data::testing::read_bytes(dir + "/model.safetensors");
  expect_throw_with<FormatError>([&] { gpt2::save_hf(m, dir); },
                                 {"transformer.h.1.ln_2.bias", "nan", "never written"});
  EXPECT_EQ(data::testing::read_bytes(dir + "/model.safetensors"), before);
  // The same NaN in a file: refused at load, naming the tensor.
  data::SafeTensorsWriter w;
  std::vector<Tensor> keep;
  for (const auto& spec : m.specs()) {
    keep.push_back(m.parameter(spec.name));
    w.add(spec.name, DType::F32, spec.shape, keep.back().raw_data());
  }
  w.write(dir + "/model.safetensors");
  gpt2::GPT2 fresh(gpt2::Config::preset("tiny"), 2);
  expect_throw_with<FormatError>([&] { gpt2::load_hf_weights(fresh, dir); },
                                 {"transformer.h.1.ln_2.bias", "finite"});
}

TEST_F(HfWeights, ShardedCheckpointsLoadAndPickleFilesGetTheConversionCommand) {
  gpt2::GPT2 src(gpt2::Config::preset("tiny"), 3);
  // Split the tensors over two shards, with HF's index.
  data::SafeTensorsWriter a, b;
  json::Value map = json::Value::object();
  std::vector<Tensor> keep;
  bool second = false;
  for (const auto& spec : src.specs()) {
    keep.push_back(src.parameter(spec.name));
    (second ? b : a).add(spec.name, DType::F32, spec.shape, keep.back().raw_data());
    map.set(spec.name,
            second ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors");
    second = !second;
  }
  const std::string sharded = tmp.file("sharded");
  fs::create_directories(sharded);
  fs::copy_file(dir + "/config.json", sharded + "/config.json");
  a.write(sharded + "/model-00001-of-00002.safetensors");
  b.write(sharded + "/model-00002-of-00002.safetensors");
  json::Value index = json::Value::object();
  index.set("weight_map", map);
  write_bytes(sharded + "/model.safetensors.index.json", index.dump());
  gpt2::GPT2 m(gpt2::load_hf_config(sharded), 9);
  gpt2::load_hf_weights(m, sharded);
  for (const auto& spec : src.specs())
    EXPECT_EQ(m.parameter(spec.name).to_vector<float>(),
              src.parameter(spec.name).to_vector<float>())
        << spec.name;
  // A weight_map pointing outside the folder is refused.
  map.set("transformer.wte.weight", "../m/model.safetensors");
  index.set("weight_map", map);
  write_bytes(sharded + "/model.safetensors.index.json", index.dump());
  expect_throw_with<FormatError>([&] { gpt2::load_hf_weights(m, sharded); }, {"same folder"});
  write_bytes(sharded + "/model.safetensors.index.json", R"({"weight_map": {}})");
  expect_throw_with<FormatError>([&] { gpt2::load_hf_weights(m, sharded); },
                                 {"model.safetensors.index.json", "\"weight_map\" is empty"});
  fs::remove_all(sharded);  // transformers' pickle shards
  fs::create_directories(sharded);
  fs::copy_file(dir + "/config.json", sharded + "/config.json");
  write_bytes(sharded + "/pytorch_model.bin.index.json", R"({"weight_map": {}})");
  expect_throw_with<FormatError>([&] { gpt2::load_hf_weights(m, sharded); },
                                 {"pytorch_model.bin", "safe_serialization=True"});

  fs::remove(dir + "/model.safetensors");
  write_bytes(dir + "/pytorch_model.bin", "PK");
  expect_throw_with<FormatError>([&] { gpt2::load_hf_weights(m, dir); },
                                 {"pytorch_model.bin", "safe_serialization=True"});
}

TEST_F(HfWeights, SaveRecordsTheGivenConfigAndAGenerationConfig) {
  gpt2::Config user = gpt2::Config::preset("tiny");
  gpt2::Config run = user;
  run.set_dropout(0.0);
  gpt2::GPT2 m(run, 1);
  gpt2::save_hf(m, dir, user);
  EXPECT_EQ(gpt2::load_hf_config(dir).resid_pdrop, 0.1);
  json::Value gen = json::parse(data::testing::read_bytes(dir + "/generation_config.json"), "g");
  EXPECT_EQ(gen.get_int("eos_token_id"), 96);
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()), 1);
}

// Note [Saving in bf16 or fp16]: each weight rounded once to nearest even, config.json's
// torch_dtype says so, and loading widens the rounded values back exactly.
TEST_F(HfWeights, Bf16AndFp16SavesHoldEachWeightRoundedOnce) {
  gpt2::GPT2 m(gpt2::Config::preset("tiny"), 4);
  for (const DType dtype : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const std::string out = tmp.file(dtype == DType::BF16 ? "bf16" : "f16");
    gpt2::save_hf(m, out, m.config(), {}, {}, dtype);
    json::Value config = json::parse(data::testing::read_bytes(out + "/config.json"), "c");
    EXPECT_EQ(config.get_string("torch_dtype"), dtype == DType::BF16 ? "bfloat16" : "float16");
    data::SafeTensorsReader file(out + "/model.safetensors");
    gpt2::GPT2 loaded(gpt2::load_hf_config(out), 9);
    gpt2::load_hf_weights(loaded, out);
    for (const auto& spec : m.specs()) {
      const data::TensorRecord& rec = file.at(spec.name);
      ASSERT_EQ(rec.dtype, dtype) << spec.name;
      std::vector<uint16_t> bits(static_cast<size_t>(rec.numel()));
      file.read(rec, bits.data());
      const std::vector<float> w = m.parameter(spec.name).to_vector<float>();
      const std::vector<float> back = loaded.parameter(spec.name).to_vector<float>();
      for (size_t i = 0; i < w.size(); ++i) {
        const uint16_t want = dtype == DType::BF16 ? float_to_bf16(w[i]) : float_to_half(w[i]);
        ASSERT_EQ(bits[i], want) << spec.name << "[" << i << "] = " << w[i];
        ASSERT_EQ(back[i], dtype == DType::BF16 ? bf16_to_float(want) : half_to_float(want));
      }
    }
  }
  // The f32 save records float32.
  gpt2::save_hf(m, tmp.file("f32"));
  EXPECT_EQ(json::parse(data::testing::read_bytes(tmp.file("f32") + "/config.json"), "c")
                .get_string("torch_dtype"),
            "float32");
}

// A weight fp16 cannot hold (it would be written as inf) refuses the save and keeps the earlier
// one; bf16, with f32's range, saves it.
TEST_F(HfWeights, AWeightBeyondFp16sRangeRefusesAnFp16SaveAndKeepsTheEarlierOne) {
  gpt2::GPT2 m(gpt2::Config::preset("tiny"), 1);
  {
    NoGradGuard g;
    m.parameter("transformer.h.0.mlp.c_fc.weight").data<float>()[7] = 70000.f;
  }
  const std::string before = data::testing::read_bytes(dir + "/model.safetensors");
  expect_throw_with<FormatError>(
      [&] { gpt2::save_hf(m, dir, m.config(), {}, {}, DType::F16); },
      {"transformer.h.0.mlp.c_fc.weight", "70000", "65504", "bf16", "earlier save is kept"});
  EXPECT_EQ(data::testing::read_bytes(dir + "/model.safetensors"), before);
  gpt2::save_hf(m, dir, m.config(), {}, {}, DType::BF16);
  gpt2::GPT2 loaded(gpt2::load_hf_config(dir), 2);
  gpt2::load_hf_weights(loaded, dir);
  EXPECT_EQ(loaded.parameter("transformer.h.0.mlp.c_fc.weight").to_vector<float>()[7], 70144.f);
}

}  // namespace
}  // namespace mw
