// Tests of the strict JSON parser and writer (src/data/json.h): values, escapes, exact integers,
// round trips, and that every malformed input is a FormatError with source:line:col.
#include "data/json.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "temp_dir.h"

namespace mw::json {
namespace {

using mw::data::testing::expect_throw_with;

TEST(Json, ParsesAConfigLikeDocument) {
  Value v = parse(R"({
    "n_layer": 12, "n_embd": 768, "layer_norm_epsilon": 1e-05, "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"], "tie": true, "bos": null, "neg": -3, "frac": -0.25
  })",
                  "config.json");
  EXPECT_EQ(v.get_int("n_layer"), 12);
  EXPECT_EQ(v.get_int("n_embd"), 768);
  EXPECT_EQ(v.get_double("layer_norm_epsilon"), 1e-05);
  EXPECT_EQ(v.get_string("activation_function"), "gelu_new");
  EXPECT_EQ(v.at("architectures").at(int64_t{0}).as_string(), "GPT2LMHeadModel");
  EXPECT_TRUE(v.get_bool("tie"));
  EXPECT_TRUE(v.at("bos").is_null());
  EXPECT_EQ(v.get_int("neg"), -3);
  EXPECT_EQ(v.get_double("frac"), -0.25);
  EXPECT_EQ(v.get_double("n_layer"), 12.0);  // integers are numbers too
  EXPECT_EQ(v.find("missing"), nullptr);
  // Insertion order is kept.
  ASSERT_EQ(v.size(), 9);
  EXPECT_EQ(v.key(0), "n_layer");
  EXPECT_EQ(v.key(8), "frac");
}

TEST(Json, IntegersAreExact) {
  // 2^53 + 1 is not representable as a double; the int64 must keep it.
  Value v = parse("[9007199254740993, -9223372036854775808, 9223372036854775807, 0, -0]", "t");
  EXPECT_EQ(v.at(int64_t{0}).as_int(), 9007199254740993LL);
  EXPECT_EQ(v.at(int64_t{1}).as_int(), INT64_MIN);
  EXPECT_EQ(v.at(int64_t{2}).as_int(), INT64_MAX);
  EXPECT_EQ(v.at(int64_t{3}).as_int(), 0);
  EXPECT_EQ(v.dump(), "[9007199254740993,-9223372036854775808,9223372036854775807,0,0]");
  // Beyond int64: a double, not an integer.
  Value big = parse("9223372036854775808", "t");
  EXPECT_FALSE(big.is_integer());
  EXPECT_EQ(big.as_double(), 9223372036854775808.0);
  // Non-integer literals are not integers even when integral in value.
  for (const char* text : {"2.0", "2e0", "1.5"}) {
    expect_throw_with<FormatError>([&] { parse(text, "t").as_int(); }, {"expected an integer"});
  }
}

TEST(Json, StringEscapesAndUtf8) {
  Value v =
      parse(R"(["a\"b\\c\/d\b\f\n\r\t", "\u00e9\u20ac", "\ud83d\ude00", "h\u0000i", "ü"])", "t");
  EXPECT_EQ(v.at(int64_t{0}).as_string(), "a\"b\\c/d\b\f\n\r\t");
  EXPECT_EQ(v.at(int64_t{1}).as_string(), "\xc3\xa9\xe2\x82\xac");  // é €
  EXPECT_EQ(v.at(int64_t{2}).as_string(), "\xf0\x9f\x98\x80");      // U+1F600 (surrogate pair)
  EXPECT_EQ(v.at(int64_t{3}).as_string(), std::string("h\0i", 3));  // embedded NUL
  EXPECT_EQ(v.at(int64_t{4}).as_string(), "\xc3\xbc");
  // And back: control characters are escaped, UTF-8 passes through, NUL survives.
  EXPECT_EQ(parse(v.dump(), "dump"), v);
  EXPECT_EQ(Value(std::string("\x01\n", 2)).dump(), "\"\\u0001\\n\"");
}

TEST(Json, DoublesRoundTripBitExactly) {
  std::mt19937_64 rng(1234);
  Value arr = Value::array();
  std::vector<double> values = {
      0.1, 1e-05, 1e300, -4.9406564584124654e-324, 3.141592653589793, 1.0 / 3.0, 2.0};
  for (int i = 0; i < 1000; ++i) {
    uint64_t bits = rng();
    double d;
    std::memcpy(&d, &bits, 8);
    if (std::isfinite(d)) values.push_back(d);
  }
  for (double d : values) arr.push_back(d);
  Value back = parse(arr.dump(), "dump");
  ASSERT_EQ(back.size(), static_cast<int64_t>(values.size()));
  for (size_t i = 0; i < values.size(); ++i) {
    // Exact: the writer promises the shortest text that reads back to the same bits.
    ASSERT_EQ(back.at(static_cast<int64_t>(i)).as_double(), values[i])
        << "element " << i << " text " << Value(values[i]).dump();
  }
  expect_throw_with<InvalidArgument>([] { Value(std::nan("")).dump(); }, {"finite"});
}

TEST(Json, BuildAndDumpIsCompactAndOrdered) {
  Value o = Value::object();
  o.set("z", 1);
  o.set("a", Value::array());
  o.set("s", "x\"y");
  o.set("z", 2);  // replaced in place, order kept
  o.set("f", 0.5);
  o.set("n", nullptr);
  EXPECT_EQ(o.dump(), R"({"z":2,"a":[],"s":"x\"y","f":0.5,"n":null})");
  EXPECT_EQ(parse(o.dump(), "dump"), o);
  // Integer-valued doubles stay doubles through a round trip.
  EXPECT_EQ(Value(2.0).dump(), "2.0");
  EXPECT_EQ(Value(-0.0).dump(), "-0.0");
  EXPECT_EQ(Value(1e20).dump(), "1e+20");
  EXPECT_FALSE(parse(Value(2.0).dump(), "t").is_integer());
}

TEST(Json, MalformedInputNamesSourceLineAndColumn) {
  struct Case {
    const char* text;
    const char* needle;
  };
  const Case cases[] = {
      {"", "config.json:1:1: invalid JSON: expected a value"},
      {"{\"a\": 1,}", "config.json:1:9: invalid JSON: expected a string key, found '}'"},
      {"[1, 2,]", "expected a value"},
      {"{\"a\" 1}", "expected ':' after an object key"},
      {"{\n  \"a\": 1\n  \"b\": 2}", "config.json:3:3: invalid JSON: expected ',' or '}'"},
      {"[1 2]", "expected ',' or ']'"},
      {"01", "no leading zeros"},
      {"1.", "a digit after the decimal point"},
      {"1e", "a digit in the exponent"},
      {"-", "a digit"},
      {"NaN", "expected a value"},
      {"Infinity", "expected a value"},
      {"tru", "expected a value"},
      {"\"abc", "a closing '\"'"},
      {"\"a\tb\"", "control character"},
      {"\"\\x\"", "one of"},
      {"\"\\u12g4\"", "a hex digit"},
      {"\"\\udc00\"", "a high surrogate before a low surrogate"},
      {"\"\\ud800x\"", "a low surrogate"},
      {"\"\\ud800\\u0041\"", "a low surrogate"},
      {"\"\xff\"", "valid UTF-8"},
      {"\"\xc0\xaf\"", "no overlong forms"},
      {"\"\xe2\x82\"", "UTF-8 continuation"},
      {"{\"a\":1,\"a\":2}", "key \"a\" repeats"},
      {"1 2", "end of input after the top-level value"},
      {"// comment\n1", "expected a value"},
      {"1e999", "within double range"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    expect_throw_with<FormatError>([&] { parse(c.text, "config.json"); },
                                   {"config.json:", c.needle});
  }
  // A JSONL file's line: its number in the file (was "docs.jsonl line 7:1:3").
  expect_throw_with<FormatError>([&] { parse("{\"a\" 1}", "docs.jsonl", 7); },
                                 {"docs.jsonl:7:6: invalid JSON: expected ':'"});
}

TEST(Json, DepthLimitStopsHostileNesting) {
  // kMaxDepth levels parse; one more is refused instead of recursing until the stack runs out.
  std::string ok = std::string(kMaxDepth, '[') + std::string(kMaxDepth, ']');
  EXPECT_NO_THROW(parse(ok, "t"));
  std::string deep = std::string(kMaxDepth + 1, '[') + std::string(kMaxDepth + 1, ']');
  expect_throw_with<FormatError>([&] { parse(deep, "t"); }, {"nesting at most 512 deep"});
  std::string hostile(1 << 20, '[');  // a million opens: must be an error, not a crash
  expect_throw_with<FormatError>([&] { parse(hostile, "t"); }, {"nesting"});
}

TEST(Json, AccessorErrorsNameTheKey) {
  Value v = parse(R"({"n_layer": "12", "eps": 1.5})", "t");
  expect_throw_with<FormatError>([&] { v.get_int("n_layer"); },
                                 {"key 'n_layer'", "expected an integer", "string \"12\""});
  expect_throw_with<FormatError>([&] { v.get_int("eps"); }, {"key 'eps'", "number 1.5"});
  expect_throw_with<FormatError>([&] { v.at("n_head"); }, {"missing key 'n_head'"});
  expect_throw_with<FormatError>([&] { v.at(int64_t{0}); }, {"expected an array", "object"});
  expect_throw_with<FormatError>([&] { parse("[1]", "t").at(int64_t{1}); }, {"out of range"});
}

TEST(Json, RandomGarbageNeverCrashes) {
  // Mutated valid documents must either parse or throw FormatError, nothing else.
  const std::string base = R"({"a": [1, 2.5, "x\u00e9", {"b": null}], "c": true})";
  std::mt19937 rng(7);
  int errors = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    std::string s = base;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) s[rng() % s.size()] = static_cast<char>(rng() % 256);
    try {
      Value v = parse(s, "fuzz");
      EXPECT_EQ(parse(v.dump(), "dump"), v);
    } catch (const FormatError&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 0);  // the mutations did produce invalid inputs
}

}  // namespace
}  // namespace mw::json
