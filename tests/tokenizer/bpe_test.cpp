// The byte-level BPE tokenizer against HuggingFace `tokenizers` (tests/fixtures/bpe/cases.json,
// written by tools/make_bpe_reference.py): the same pieces, the same ids, and decode(encode(x)) ==
// x, for a varied corpus, two seeded random ones and invalid UTF-8. Nothing here needs Python.
#include "data/bpe.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <random>
#include <sstream>

#include "../data/temp_dir.h"
#include "core/error.h"
#include "data/json.h"
#include "data/pretokenize.h"

namespace mw::data {
namespace {

const std::string kFixture = std::string(MW_SOURCE_DIR) + "/tests/fixtures/bpe/";

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

json::Value load_cases() {
  std::ifstream in(kFixture + "cases.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str(), "cases.json");
}

BpeTokenizer fixture_tokenizer() {
  return BpeTokenizer(load_vocab_and_merges(kFixture + "vocab.json", kFixture + "merges.txt"),
                      "fixture");
}

// The first difference of two sequences, for a failure message.
template <typename T, typename Show>
std::string first_difference(const std::vector<T>& got, const std::vector<T>& want, Show show) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  std::ostringstream os;
  os << "sizes " << got.size() << " vs " << want.size() << "; first difference at " << i << ": got "
     << (i < got.size() ? show(got[i]) : "<end>") << ", want "
     << (i < want.size() ? show(want[i]) : "<end>");
  return os.str();
}

TEST(Pretokenize, PiecesEqualTheReferenceRegex) {
  const json::Value cases = load_cases();
  ASSERT_GE(cases.at("cases").size(), 40);
  for (const json::Value& c : cases.at("cases").elements()) {
    SCOPED_TRACE(c.get_string("name"));
    const std::string text = from_hex(c.get_string("text_hex"));
    std::vector<std::string> want, got;
    for (const json::Value& p : c.at("pieces_hex").elements())
      want.push_back(from_hex(p.as_string()));
    for (std::string_view p : pretokenize(text)) got.emplace_back(p);
    EXPECT_EQ(got, want) << first_difference(
        got, want, [](const std::string& s) { return "\"" + printable(s) + "\""; });
  }
}

void expect_reference_ids(BpeTokenizer& tok) {
  const json::Value cases = load_cases();
  EXPECT_EQ(tok.eot_id(), cases.get_int("eot_id"));
  int64_t checked_ids = 0;
  for (const json::Value& c : cases.at("cases").elements()) {
    SCOPED_TRACE(c.get_string("name"));
    const std::string text = from_hex(c.get_string("text_hex"));
    std::vector<int32_t> want;
    for (const json::Value& id : c.at("ids").elements())
      want.push_back(static_cast<int32_t>(id.as_int()));
    const std::vector<int32_t> got = tok.encode(text);
    EXPECT_EQ(got, want) << first_difference(got, want,
                                             [](int32_t id) { return std::to_string(id); });
    EXPECT_EQ(tok.decode(got), text);
    checked_ids += static_cast<int64_t>(want.size());
  }
  EXPECT_GT(checked_ids, 20000);  // the random cases are there
}

TEST(Bpe, EncodingEqualsHuggingFaceTokenizersFromVocabAndMerges) {
  BpeTokenizer tok = fixture_tokenizer();
  expect_reference_ids(tok);
  expect_reference_ids(tok);  // again, now from the cache
}

TEST(Bpe, TokenizerJsonGivesTheSameIds) {
  BpeTokenizer tok(load_tokenizer_json(kFixture + "tokenizer.json"), "tokenizer.json");
  expect_reference_ids(tok);
}

// Note [Shard tokenizer stamp]: the fingerprint is what the ids mean, whichever file holds the
// vocabulary; another id for one token changes it, and the merges (how text is cut) do not.
TEST(Bpe, TheFingerprintIsTheVocabularysWhicheverFileHoldsIt) {
  const BpeTokenizer from_pair = fixture_tokenizer();
  const BpeTokenizer from_json(load_tokenizer_json(kFixture + "tokenizer.json"), "tokenizer.json");
  EXPECT_EQ(from_pair.fingerprint(), from_json.fingerprint());
  BpeModel model = load_vocab_and_merges(kFixture + "vocab.json", kFixture + "merges.txt");
  model.merges.resize(model.merges.size() / 2);  // fewer merges: the ids mean the same
  BpeModel fewer_merges = model;
  EXPECT_EQ(BpeTokenizer(fewer_merges, "fewer").fingerprint(), from_pair.fingerprint());
  ASSERT_GE(model.vocab.size(), 2u);
  std::swap(model.vocab[0].second, model.vocab[1].second);  // two tokens trade ids
  EXPECT_NE(BpeTokenizer(model, "swapped").fingerprint(), from_pair.fingerprint());
}

TEST(Bpe, AnyBytesRoundTrip) {
  BpeTokenizer tok = fixture_tokenizer();
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string bytes(rng() % 300, '\0');
    // Half the trials draw from a few bytes, so that runs, spaces and UTF-8 lead bytes are
    // frequent.
    const std::string few = " \n'aZ9\xc3\xa9\xe2\x80\xf0\x9f\xff";
    for (char& b : bytes) b = trial % 2 ? static_cast<char>(rng()) : few[rng() % few.size()];
    const std::vector<int32_t> ids = tok.encode(bytes);
    ASSERT_EQ(tok.decode(ids), bytes) << printable(bytes);
    std::string joined;
    for (std::string_view p : pretokenize(bytes)) {
      ASSERT_FALSE(p.empty());
      joined += p;
    }
    ASSERT_EQ(joined, bytes);
  }
}

TEST(Bpe, ByteCharactersAreGpt2s) {
  EXPECT_EQ(byte_to_token_char(' '), "\xc4\xa0");   // 'Ġ' U+0120
  EXPECT_EQ(byte_to_token_char('\n'), "\xc4\x8a");  // 'Ċ' U+010A
  EXPECT_EQ(byte_to_token_char('a'), "a");
  EXPECT_EQ(byte_to_token_char(0xFF), "\xc3\xbf");  // 'ÿ' itself
  EXPECT_EQ(byte_to_token_char(0xAD), "\xc5\x83");  // soft hyphen -> U+0143, the last one
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    EXPECT_EQ(token_chars_to_bytes(bytes_to_token_chars(one)), one);
  }
  // A space is no byte character (byte 0x20 is written 'Ġ').
  EXPECT_FALSE(token_chars_to_bytes("a b").has_value());
}

TEST(Bpe, DecodesTheEndOfTextTokenAsItsText) {
  BpeTokenizer tok = fixture_tokenizer();
  EXPECT_EQ(tok.decode({tok.eot_id()}), kEndOfText);
  // A literal "<|endoftext|>" in text is ordinary text, not the special token.
  const std::vector<int32_t> ids = tok.encode("<|endoftext|>");
  EXPECT_GT(ids.size(), 1u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.eot_id()), 0);
  // A prompt's marker is the token, as a corpus's ends a document (Note [End-of-text markers]).
  std::vector<int32_t> expected = tok.encode("Hi there");
  expected.push_back(tok.eot_id());
  expected.push_back(tok.eot_id());
  for (int32_t id : tok.encode(" Bye")) expected.push_back(id);
  EXPECT_EQ(tok.encode_prompt("Hi there<|endoftext|><|endoftext|> Bye"), expected);
  EXPECT_EQ(tok.encode_prompt("<|endoftext|>"), std::vector<int32_t>{tok.eot_id()});
  EXPECT_EQ(tok.encode_prompt("plain"), tok.encode("plain"));
}

TEST(Bpe, BadIdsAndFilesGiveClearErrors) {
  BpeTokenizer tok = fixture_tokenizer();
  try {
    tok.decode({5, 100000});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("token id 100000 is not in the vocabulary"),
              std::string::npos)
        << e.what();
  }
  testing::TempDir tmp;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(tmp.file(name)) << text;
    return tmp.file(name);
  };
  auto expect_error = [&](auto make, const std::string& needle) {
    try {
      make();
      FAIL() << "expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const std::string vocab = kFixture + "vocab.json", merges = kFixture + "merges.txt";
  expect_error([&] { load_vocab_and_merges(tmp.file("none.json"), merges); },
               "cannot open GPT-2 vocab.json");
  // A FIFO or a directory is refused at once (a FIFO opened by an ifstream would wait forever for
  // a writer), with what to pass instead.
  ASSERT_EQ(::mkfifo(tmp.file("fifo").c_str(), 0600), 0);
  expect_error([&] { load_tokenizer_json(tmp.file("fifo")); },
               "is a FIFO (named pipe), expected a regular file");
  expect_error([&] { load_vocab_and_merges(tmp.path(), merges); },
               "is a directory, expected a regular file; pass --tokenizer");
  expect_error([&] { load_vocab_and_merges(vocab, write("m1.txt", "#version: 0.2\nab\n")); },
               "m1.txt line 2: expected two tokens separated by one space");
  expect_error([&] { load_vocab_and_merges(write("v1.json", "{\"a\": -1}"), merges); },
               "expected a non-negative integer id");
  expect_error(
      [&] { BpeTokenizer(load_vocab_and_merges(write("v2.json", "{\"a\": 0}"), merges), "v2"); },
      "the vocabulary lacks the token of byte 0");
  expect_error(
      [&] { BpeTokenizer(load_vocab_and_merges(vocab, write("m2.txt", "q zzz\n")), "m2"); },
      "uses a token that is not in the vocabulary (\"zzz\")");
  expect_error(
      [&] { load_tokenizer_json(write("t.json", "{\"model\": {\"type\": \"Unigram\"}}")); },
      "only \"BPE\" (GPT-2) is supported");
}

// Note [Added tokens]: a tokenizer.json's added tokens are matched in the text before
// pre-tokenisation, leftmost first and the longest there, each its own id (HF's AddedVocabulary);
// they were ids nothing encoded to before session 39 ("<|im_start|>" was ten ordinary tokens).
// What would make the ids differ from HF's silently is refused.
TEST(Bpe, AddedTokensOfATokenizerJsonAreMatchedInTheText) {
  testing::TempDir tmp;
  std::stringstream fixture;
  fixture << std::ifstream(kFixture + "tokenizer.json").rdbuf();
  const std::string json_text = fixture.str();
  const auto with = [&](const std::string& name, const std::string& added,
                        const std::string& from = "\"normalizer\": null",
                        const std::string& to = "\"normalizer\": null") {
    std::string text = json_text;
    const std::string list = "\"added_tokens\": [";
    text.replace(text.find(list), list.size(), list + added);
    text.replace(text.find(from), from.size(), to);
    std::ofstream(tmp.file(name)) << text;
    return tmp.file(name);
  };
  const std::string chat =
      "{\"id\": 588, \"content\": \"<|im_start|>\", \"special\": true, \"lstrip\": false}, "
      "{\"id\": 589, \"content\": \"<|im\", \"special\": true}, ";
  BpeTokenizer tok(load_tokenizer_json(with("chat.json", chat)), "chat.json");
  BpeTokenizer plain = fixture_tokenizer();
  std::vector<int32_t> expected = plain.encode("Hi");
  expected.push_back(588);  // not 589: the longest of those starting there
  for (int32_t id : plain.encode("user\nthe <|i")) expected.push_back(id);
  expected.push_back(589);
  EXPECT_EQ(tok.encode("Hi<|im_start|>user\nthe <|i<|im"), expected);
  EXPECT_EQ(tok.decode({588, 589}), "<|im_start|><|im");
  // An added token decodes to its text even where every character of it is one of GPT-2's byte
  // characters ("é" is byte 0xE9's): it gave the one byte E9 of invalid UTF-8.
  BpeTokenizer latin(load_tokenizer_json(with("latin.json",
                                              "{\"id\": 588, \"content\": "
                                              "\"<|n\u00e9|>\"}, ")),
                     "latin.json");
  EXPECT_EQ(latin.decode({588}), "<|n\xc3\xa9|>");
  EXPECT_EQ(latin.decode(latin.encode("x<|n\xc3\xa9|>y")), "x<|n\xc3\xa9|>y");
  EXPECT_EQ(tok.encode("<|endoftext|>"), plain.encode("<|endoftext|>"));  // left to the callers
  EXPECT_EQ(tok.encode_prompt("a<|endoftext|>"),
            (std::vector<int32_t>{plain.encode("a")[0], plain.eot_id()}));

  const auto refused = [&](const std::string& path, const std::string& needle) {
    try {
      load_tokenizer_json(path);
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused(with("lstrip.json", "{\"id\": 588, \"content\": \"<x>\", \"lstrip\": true}, "),
          "has lstrip true, which is not supported");
  refused(with("space.json", "{\"id\": 588, \"content\": \"<a b>\"}, "), "holds ASCII whitespace");
  refused(
      with("lower.json", "", "\"normalizer\": null", "\"normalizer\": {\"type\": \"Lowercase\"}"),
      "normalizer {\"type\":\"Lowercase\"} changes the text");
  refused(with("noregex.json", "", "\"use_regex\": true", "\"use_regex\": false"),
          "pre_tokenizer.use_regex false is not supported");
}

TEST(Bpe, SaveAndLoadRoundTrips) {
  const BpeModel model = load_vocab_and_merges(kFixture + "vocab.json", kFixture + "merges.txt");
  testing::TempDir tmp;
  save_vocab_and_merges(model, tmp.file("vocab.json"), tmp.file("merges.txt"));
  const BpeModel again = load_vocab_and_merges(tmp.file("vocab.json"), tmp.file("merges.txt"));
  EXPECT_EQ(again.vocab, model.vocab);
  EXPECT_EQ(again.merges, model.merges);
}

}  // namespace
}  // namespace mw::data
