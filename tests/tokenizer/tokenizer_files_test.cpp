// Note [A model folder's tokenizer]: which files of a model folder make its tokenizer, and which
// a save carries, for a folder written by transformers' save_pretrained after tokens were added.
#include "data/tokenizer_files.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../data/temp_dir.h"
#include "core/error.h"

namespace mw::data {
namespace {

const std::string kFixture = std::string(MW_SOURCE_DIR) + "/tests/fixtures/bpe/";

std::string fixture_text(const std::string& name) {
  std::stringstream text;
  text << std::ifstream(kFixture + name).rdbuf();
  return text.str();
}

// The fixture's tokenizer as save_pretrained writes it with "<|sep|>" added as id 588: the fast
// tokenizer (tokenizer.json), the slow one (vocab.json, merges.txt, added_tokens.json) and the
// tokenizer's settings.
void write_saved_folder(const std::string& dir, bool fast) {
  std::filesystem::create_directories(dir);
  if (fast) {
    std::string json = fixture_text("tokenizer.json");
    const std::string list = "\"added_tokens\": [";
    json.replace(json.find(list), list.size(),
                 list + "{\"id\": 588, \"content\": \"<|sep|>\", \"special\": true}, ");
    std::ofstream(dir + "/tokenizer.json") << json;
  }
  std::ofstream(dir + "/vocab.json") << fixture_text("vocab.json");
  std::ofstream(dir + "/merges.txt") << fixture_text("merges.txt");
  std::ofstream(dir + "/added_tokens.json") << "{\"<|sep|>\": 588}\n";
  std::ofstream(dir + "/tokenizer_config.json") << "{\"model_max_length\": 1024}\n";
  std::ofstream(dir + "/special_tokens_map.json") << "{\"eos_token\": \"<|endoftext|>\"}\n";
}

std::vector<int32_t> ids_of(const std::string& dir, const std::string& text) {
  return load_tokenizer(find_tokenizer_files("", "", "", dir))->encode(text);
}

// vocab.json + merges.txt used to win over tokenizer.json, and added_tokens.json was never read:
// "a<|sep|>b" was nine ordinary tokens where transformers' tokenizers give three.
TEST(TokenizerFiles, AFoldersAddedTokensAreMatchedAsTransformersDoes) {
  testing::TempDir tmp;
  write_saved_folder(tmp.file("fast"), true);
  write_saved_folder(tmp.file("slow"), false);  // GPT2Tokenizer's files alone
  const TokenizerFiles fast = find_tokenizer_files("", "", "", tmp.file("fast"));
  EXPECT_EQ(fast.source(), tmp.file("fast") + "/tokenizer.json");
  const std::vector<int32_t> plain = ids_of(kFixture, "a<|sep|>b");
  ASSERT_GT(plain.size(), 3u);
  for (const std::string dir : {"fast", "slow"}) {
    const std::vector<int32_t> ids = ids_of(tmp.file(dir), "a<|sep|>b");
    ASSERT_EQ(ids.size(), 3u) << dir;
    EXPECT_EQ(ids[1], 588) << dir;
    EXPECT_EQ(ids[0], plain.front()) << dir;
    EXPECT_EQ(ids[2], plain.back()) << dir;
  }
  // Every file goes to a save, so transformers reads the saved folder as it read this one.
  std::vector<std::string> carried;
  for (const auto& [name, text] : read_tokenizer_files(fast)) carried.push_back(name);
  std::sort(carried.begin(), carried.end());
  EXPECT_EQ(carried,
            (std::vector<std::string>{"added_tokens.json", "merges.txt", "special_tokens_map.json",
                                      "tokenizer.json", "tokenizer_config.json", "vocab.json"}));
}

TEST(TokenizerFiles, ADamagedAddedTokensJsonIsRefusedByName) {
  testing::TempDir tmp;
  write_saved_folder(tmp.file("slow"), false);
  std::ofstream(tmp.file("slow/added_tokens.json")) << "{\"<|sep|>\": \"588\"}\n";
  try {
    ids_of(tmp.file("slow"), "a");
    ADD_FAILURE() << "a string id was accepted";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("added_tokens.json: the id of added token \"<|sep|>\""),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mw::data
