// HF folders that transformers loads and memwall refused until session 38 (a read-only review of
// loading checkpoints from the Hub): attention-mask buffers stored as U8 or BOOL (older
// transformers saved them; the reader refused the whole file for an unknown dtype), and the tied
// embedding stored only as lm_head.weight (some conversions kept that name). Both now load to the
// fixture's weights bit for bit. (config.json's n_ctx, lists of eos ids, gelu_accurate and "dtype":
// Gpt2Config.HonouredFieldsChangeTheModel.)
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "../data/temp_dir.h"
#include "data/json.h"
#include "models/gpt2/hf_io.h"

namespace mw {
namespace {

const std::string kFixture = std::string(MW_SOURCE_DIR) + "/tests/fixtures/gpt2_tiny";

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The fixture's model.safetensors with its header changed by `edit`, which may append to the data.
void write_edited(const std::string& dir,
                  const std::function<void(json::Value&, std::string&)>& edit) {
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kFixture + "/config.json", dir + "/config.json");
  const std::string file = bytes_of(kFixture + "/model.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  json::Value header = json::parse(file.substr(8, n), "fixture header");
  std::string data = file.substr(8 + n);
  edit(header, data);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t len = text.size();
  std::ofstream out(dir + "/model.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << text << data;
}

std::vector<std::vector<float>> loaded(const std::string& dir) {
  gpt2::GPT2 model(gpt2::load_hf_config(dir));
  gpt2::load_hf_weights(model, dir);
  std::vector<std::vector<float>> w;
  for (const Tensor& p : model.parameters()) w.push_back(p.contiguous().to_vector<float>());
  return w;
}

// Appends a [1, 1, 32, 32] mask of one-byte elements named `name` in `dtype`.
void add_mask(json::Value& header, std::string& data, const std::string& name, const char* dtype) {
  json::Value entry = json::Value::object();
  entry.set("dtype", dtype);
  json::Value shape = json::Value::array();
  for (int64_t d : {1, 1, 32, 32}) shape.push_back(d);
  entry.set("shape", shape);
  json::Value offsets = json::Value::array();
  offsets.push_back(static_cast<int64_t>(data.size()));
  offsets.push_back(static_cast<int64_t>(data.size() + 1024));
  entry.set("data_offsets", offsets);
  header.set(name, entry);
  data.append(1024, '\1');
}

TEST(HfFolders, MaskBuffersInU8OrBoolAreSkipped) {
  data::testing::TempDir tmp;
  write_edited(tmp.file("m"), [](json::Value& header, std::string& data) {
    add_mask(header, data, "transformer.h.0.attn.bias", "U8");
    add_mask(header, data, "transformer.h.1.attn.bias", "BOOL");
  });
  EXPECT_EQ(loaded(tmp.file("m")), loaded(kFixture));
}

// A weight in a dtype memwall does not read is refused by name, as before.
TEST(HfFolders, AWeightInAnUnreadDtypeIsRefusedByName) {
  data::testing::TempDir tmp;
  write_edited(tmp.file("m"), [](json::Value& header, std::string& data) {
    json::Value renamed = json::Value::object();
    for (int64_t i = 0; i < header.size(); ++i)
      if (header.key(i) != "transformer.h.0.ln_1.bias") renamed.set(header.key(i), header.value(i));
    header = renamed;
    json::Value entry = json::Value::object();
    entry.set("dtype", "U8");
    json::Value shape = json::Value::array();
    shape.push_back(int64_t{32});
    entry.set("shape", shape);
    json::Value offsets = json::Value::array();
    offsets.push_back(static_cast<int64_t>(data.size()));
    offsets.push_back(static_cast<int64_t>(data.size() + 32));
    entry.set("data_offsets", offsets);
    header.set("transformer.h.0.ln_1.bias", entry);
    data.append(32, '\0');
  });
  try {
    loaded(tmp.file("m"));
    ADD_FAILURE() << "a U8 weight was read";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("'transformer.h.0.ln_1.bias' has dtype U8"),
              std::string::npos)
        << e.what();
  }
}

TEST(HfFolders, TheTiedEmbeddingStoredAsLmHeadLoads) {
  data::testing::TempDir tmp;
  write_edited(tmp.file("m"), [](json::Value& header, std::string&) {
    json::Value renamed = json::Value::object();
    for (int64_t i = 0; i < header.size(); ++i)
      renamed.set(header.key(i) == "transformer.wte.weight" ? "lm_head.weight" : header.key(i),
                  header.value(i));
    header = renamed;
  });
  EXPECT_EQ(loaded(tmp.file("m")), loaded(kFixture));
}

}  // namespace
}  // namespace mw
