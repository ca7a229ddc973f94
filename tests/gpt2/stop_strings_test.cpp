// Stop strings (Note [Stop strings]): the hold-back rule on made-up token streams, checked push by
// push (what each token releases) and against a brute-force cut of the whole text under every way
// of splitting it into tokens; then gpt2_generate --stop on a model with a tokenizer, against the
// text the library generates.
#include "models/gpt2/stop_strings.h"

#include <gtest/gtest.h>

#include <random>

#include "../apps/run_app.h"
#include "models/gpt2/generate.h"
#include "text_model.h"

namespace mw {
namespace {

using gpt2::StopStrings;

// What each push released, what finish() released, and whether it stopped.
struct Stream {
  std::vector<std::string> released;
  std::string finished;
  bool stopped = false;
  std::string printed() const {
    std::string all;
    for (const std::string& r : released) all += r;
    return all + finished;
  }
};

// Pushes the tokens until one reaches a stop string; finish() when none did.
Stream stream(StopStrings& stop, const std::vector<std::string>& tokens) {
  Stream s;
  for (const std::string& t : tokens) {
    s.released.push_back(stop.push(t));
    if ((s.stopped = stop.stopped())) return s;
  }
  s.finished = stop.finish();
  return s;
}

Stream stream(const std::vector<std::string>& stops, const std::vector<std::string>& tokens) {
  StopStrings stop(stops);
  return stream(stop, tokens);
}

using Released = std::vector<std::string>;

TEST(StopStrings, StopInsideOneToken) {
  StopStrings stop({"XY"});
  const Stream s = stream(stop, {"ab", "cXYd", "ef"});
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.released, (Released{"ab", "c"}));  // "d" and the token after are never printed
  EXPECT_EQ(stop.matched(), "XY");
  EXPECT_EQ(stop.finish(), "");
  // Ending exactly at a token's end, and starting at one.
  EXPECT_EQ(stream({"XY"}, {"ab", "cXY"}).released, (Released{"ab", "c"}));
  EXPECT_EQ(stream({"XY"}, {"ab", "XYc"}).released, (Released{"ab", ""}));
}

// "\nQ:" across three tokens: the "\n" and the "Q" are each held until ":" shows it is the stop.
TEST(StopStrings, StopAcrossThreeTokens) {
  const Stream s = stream({"\nQ:"}, {"A: yes", "\n", "Q", ":", " next"});
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.released, (Released{"A: yes", "", "", ""}));
  // Starting inside the first token and ending inside the third.
  const Stream t = stream({"\nQ:"}, {"yes.\n", "Q", ": x"});
  EXPECT_TRUE(t.stopped);
  EXPECT_EQ(t.released, (Released{"yes.", "", ""}));
}

// Held text that turns out to be no stop is released whole and once, in order.
TEST(StopStrings, APartialMatchThatIsNoStopIsReleasedExactly) {
  const Stream s = stream({"\nQ:"}, {"a", "\n", "Q", "x", "\n"});
  EXPECT_FALSE(s.stopped);
  EXPECT_EQ(s.released, (Released{"a", "", "", "\nQx", ""}));
  EXPECT_EQ(s.finished, "\n");  // the end of the sample releases the held "\n"
  EXPECT_EQ(s.printed(), "a\nQx\n");
  // Only the part that can still begin a stop is held: "x\nQ" releases "x".
  StopStrings stop({"\nQ:"});
  EXPECT_EQ(stop.push("x\nQ"), "x");
  EXPECT_EQ(stop.held_bytes(), 2u);
  EXPECT_EQ(stop.push("y"), "\nQy");
  EXPECT_EQ(stop.held_bytes(), 0u);
}

// One stop a prefix of another: the text first holds the shorter; of two ending at the same byte,
// the one starting first decides the cut, whatever the order they were given in.
TEST(StopStrings, OneStopAPrefixOfAnother) {
  for (const auto& stops : {std::vector<std::string>{"\n", "\nQ:"}, {"\nQ:", "\n"}}) {
    StopStrings stop(stops);
    EXPECT_EQ(stop.push("ab"), "ab");
    EXPECT_EQ(stop.push("\nQ:"), "");
    ASSERT_TRUE(stop.stopped());
    EXPECT_EQ(stop.matched(), "\n");
  }
  for (const auto& stops : {std::vector<std::string>{"b", "ab"}, {"ab", "b"}}) {
    StopStrings whole(stops), split(stops);
    EXPECT_EQ(whole.push("xab"), "x");
    EXPECT_EQ(whole.matched(), "ab");
    EXPECT_EQ(stream(split, {"x", "a", "b"}).released, (Released{"x", "", ""}));
    EXPECT_EQ(split.matched(), "ab");
  }
}

// "aab" on "aaab": after "aaa" only "aa" can begin the stop, so one "a" is released.
TEST(StopStrings, OverlappingPrefixes) {
  const Stream s = stream({"aab"}, {"a", "a", "a", "b"});
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.released, (Released{"", "", "a", ""}));
  EXPECT_EQ(stream({"aab"}, {"aaab"}).released, (Released{"a"}));
  const Stream t = stream({"aab"}, {"a", "a", "a", "c"});
  EXPECT_FALSE(t.stopped);
  EXPECT_EQ(t.released, (Released{"", "", "a", "aac"}));
  EXPECT_EQ(t.printed(), "aaac");
}

TEST(StopStrings, StopAtTheFirstToken) {
  StopStrings stop({"Q:"});
  EXPECT_EQ(stop.push("Q: hi"), "");
  EXPECT_TRUE(stop.stopped());
  EXPECT_THROW(stop.push("more"), InvalidArgument);  // a stopped sample takes no more text
}

TEST(StopStrings, TheEndOfASampleReleasesHeldText) {
  StopStrings stop({"\nQ:"});
  EXPECT_EQ(stop.push("yes"), "yes");
  EXPECT_EQ(stop.push("\nQ"), "");
  EXPECT_EQ(stop.held_bytes(), 2u);
  EXPECT_EQ(stop.finish(), "\nQ");
  EXPECT_FALSE(stop.stopped());
  EXPECT_EQ(stop.finish(), "");  // released once
}

TEST(StopStrings, NoStopsReleaseEverythingAndAnEmptyStopIsRefused) {
  EXPECT_EQ(stream({}, {"a", "\n", "b"}).released, (Released{"a", "\n", "b"}));
  EXPECT_THROW(StopStrings({"x", ""}), InvalidArgument);
}

// The brute-force rule on the whole text: the first byte at which it holds a stop string, and of
// the stops ending there, the earliest start; the text before that start is printed.
std::string cut_by_definition(const std::string& text, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t start = std::string::npos;
    for (const std::string& s : stops)
      if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0)
        start = std::min(start, end - s.size());
    if (start != std::string::npos) return text.substr(0, start);
  }
  return text;
}

// What is printed depends on the text, not on where its tokens split it: seeded random texts over
// {a, b, \n}, each split at random 20 ways, against cut_by_definition.
TEST(StopStrings, EveryTokenizationPrintsTheDefinitionsCut) {
  const std::vector<std::string> stops = {"ab\n", "\n\n", "bab", "aab"};
  std::mt19937 rng(7);
  int stopped = 0;
  for (int n = 0; n < 300; ++n) {
    std::string text;
    for (size_t len = rng() % 12; text.size() < len;) text += "ab\n"[rng() % 3];
    const std::string want = cut_by_definition(text, stops);
    for (int split = 0; split < 20; ++split) {
      std::vector<std::string> tokens;
      for (size_t at = 0; at < text.size();) {
        const size_t len = 1 + rng() % 4;
        tokens.push_back(text.substr(at, len));
        at += len;
      }
      const Stream s = stream(stops, tokens);
      ASSERT_EQ(s.printed(), want) << "text '" << gpt2::escape_stop_string(text) << "'";
      ASSERT_EQ(s.stopped, want.size() < text.size());
      stopped += s.stopped;
    }
  }
  EXPECT_GT(stopped, 1000);  // most texts hold a stop: both outcomes are exercised
}

// --stop reads the escapes of --template: \n, \t, \\; any other backslash is itself.
TEST(StopStrings, EscapesAreTheTemplates) {
  EXPECT_EQ(gpt2::unescape_stop_string("\\nQ:"), "\nQ:");
  EXPECT_EQ(gpt2::unescape_stop_string("a\\tb\\\\"), "a\tb\\");
  EXPECT_EQ(gpt2::unescape_stop_string("\\\\n"), "\\n");  // a backslash, then an n
  EXPECT_EQ(gpt2::unescape_stop_string("\\q\\"), "\\q\\");
  for (const std::string text : {"\nQ:", "a\\b\t\\n", "\\"})
    EXPECT_EQ(gpt2::unescape_stop_string(gpt2::escape_stop_string(text)), text);
  EXPECT_EQ(gpt2::escape_stop_string("\n\\ "), "\\n\\\\ ");
}

// ---- gpt2_generate --stop ----

// `s` in single quotes for the shell, as typed: its newlines, tabs and backslashes escaped.
std::string typed_stop(const std::string& s) {
  std::string q = "'";
  for (const char c : gpt2::escape_stop_string(s))
    q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Greedy with a repetition penalty on the seed-5 model: a varied text holding a backslash.
struct StopApp {
  data::testing::TempDir dir;
  gpt2::testing::TextModel m{dir, 5};
  const std::string prompt = "The quick brown fox";
  std::string args = "--model " + dir.path() + " --prompt '" + prompt +
                     "' --max-new-tokens 24 --temperature 0 "
                     "--repetition-penalty 3 ";
  std::string text;  // what the library generates, decoded
  StopApp() {
    gpt2::SamplingOptions o;
    o.temperature = 0;
    o.repetition_penalty = 3;
    for (int32_t id : gpt2::generate(m.model, m.tokenizer.encode(prompt), 24, o)) {
      if (id == m.tokenizer.eot_id()) break;
      text += m.tokenizer.token_bytes(id);
    }
  }
  testing::AppResult run(const std::string& more) const {
    return testing::run_built_app("gpt2_generate", args + more);
  }
};

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(Generate, AppStopsBeforeAStopStringOfTheGeneratedText) {
  const StopApp app;
  const auto plain = app.run("");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(plain.output.rfind(app.prompt + app.text + "\n", 0), 0u) << plain.output;
  const size_t backslash = app.text.find('\\');
  ASSERT_TRUE(backslash != std::string::npos && backslash + 6 < app.text.size())
      << "pick another seed: no backslash in '" << app.text << "'";
  // From the backslash over three tokens ('\', ' it', ' d' of ' dog'), typed '\\ it d'; and one
  // starting inside a token (' it') and ending inside the next.
  for (const std::string& stop :
       {app.text.substr(backslash, 6), app.text.substr(backslash + 3, 3)}) {
    const auto r = app.run("--stop " + typed_stop(stop));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string want = app.prompt + app.text.substr(0, app.text.find(stop)) + "\n";
    EXPECT_EQ(r.output.substr(0, want.size()), want) << r.output;
    EXPECT_TRUE(has(r.output, "; stopped at --stop " + typed_stop(stop))) << r.output;
  }
  // The prompt is not matched, and text held back at the end (the text's last bytes begin this
  // stop) is printed when --max-new-tokens ends the sample.
  const std::string tail_then_more = app.text.substr(app.text.size() - 3) + "~";
  ASSERT_FALSE(has(app.text, "fox") || has(app.text, tail_then_more)) << app.text;
  const auto r = app.run("--stop fox --stop " + typed_stop(tail_then_more));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind(app.prompt + app.text + "\n", 0), 0u) << r.output;
  EXPECT_FALSE(has(r.output, "stopped at")) << r.output;
}

// --num-samples: each sample stops on its own (greedy: the same cut twice).
TEST(Generate, AppStopsEachSampleOnItsOwn) {
  const StopApp app;
  const std::string stop = app.text.substr(app.text.size() / 2, 2);
  const std::string cut = app.prompt + app.text.substr(0, app.text.find(stop)) + "\n";
  const auto r = app.run("--num-samples 2 --stop " + typed_stop(stop));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int k = 1; k <= 2; ++k)
    EXPECT_TRUE(has(r.output, "=== sample " + std::to_string(k) + " of 2 (--seed " +
                                  std::to_string(k - 1) + ") ===\n" + cut))
        << r.output << "\nwant " << cut;
}

TEST(Generate, AppRefusesAnEmptyStopAndStopWithPrintIds) {
  const std::string model = "--model " + std::string(MW_SOURCE_DIR) + "/tests/fixtures/gpt2_tiny";
  const auto empty = testing::run_built_app("gpt2_generate", model + " --prompt-ids 5 --stop ''");
  EXPECT_EQ(empty.exit_code, 2) << empty.output;
  EXPECT_TRUE(has(empty.output, "usage: gpt2_generate")) << empty.output;
  EXPECT_TRUE(has(empty.output, "--stop '': an empty value")) << empty.output;
  const auto ids =
      testing::run_built_app("gpt2_generate", model + " --prompt-ids 5 --print-ids --stop x");
  EXPECT_EQ(ids.exit_code, 2) << ids.output;
  EXPECT_TRUE(has(ids.output, "usage: gpt2_generate")) << ids.output;
  EXPECT_TRUE(has(ids.output, "--stop ends a sample at a text, and --print-ids prints ids"))
      << ids.output;
}

}  // namespace
}  // namespace mw
