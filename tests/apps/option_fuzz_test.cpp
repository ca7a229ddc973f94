// Every option of every app with garbage, empty, negative, zero, huge and overflowing values
// (issue #17 item 2): each run ends on its own, within a time limit (no hang), with exit 0, 1 or 2
// and never by a signal or an escaped exception ("internal error", "terminate called"). The
// options are read from each app's --help, so an option added later is covered too. Each app gets
// a prefix of valid options that keeps an accepted run short; the option under test replaces the
// prefix's value. Runs happen in a private working directory (a garbage output path lands there).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <regex>
#include <sstream>

#include "../data/temp_dir.h"
#include "child.h"

namespace mw {
namespace {

using data::testing::TempDir;
using testing::Child;
using testing::has;
using testing::Outcome;

struct OptionSpec {
  std::string name;
  bool flag = false;
};

// "  --name V   help" (valued) and "  --name   help" (flag) lines of the usage.
std::vector<OptionSpec> options_of(const std::string& usage) {
  std::vector<OptionSpec> out;
  std::istringstream in(usage);
  const std::regex line("^  --([a-z0-9-]+)( V)? .*");
  std::smatch m;
  for (std::string l; std::getline(in, l);)
    if (std::regex_match(l, m, line)) out.push_back({m[1], !m[2].matched});
  if (!out.empty()) return out;
  // nvme_bench's own synopsis: "--dir D [--size 2GiB] ... [--json]".
  const std::regex item("--([a-z0-9-]+)( [^ \\[\\]]+)?");
  for (auto it = std::sregex_iterator(usage.begin(), usage.end(), item);
       it != std::sregex_iterator(); ++it)
    out.push_back({(*it)[1], !(*it)[2].matched});
  return out;
}

// The prefix without `--name VALUE` (or a `--name` flag).
std::vector<std::string> without(const std::vector<std::string>& prefix, const std::string& name,
                                 const std::vector<OptionSpec>& specs) {
  std::vector<std::string> out;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (prefix[i] != "--" + name) {
      out.push_back(prefix[i]);
      continue;
    }
    for (const auto& s : specs)
      if (s.name == name && !s.flag) ++i;  // its value too
  }
  return out;
}

struct AppCase {
  std::string app;
  std::vector<std::string> prefix;      // valid options keeping an accepted run short
  std::vector<std::string> positional;  // appended last
};

const std::vector<std::string> kValues = {
    "",     "abc", "-1", "0",    "1e999", "99999999999999999999", "9223372036854775807", "nan",
    "-inf", "4x",  " 3", "0x10", "."};
// Options whose empty value means something (cli::Parser::text_option); every other option
// refuses "" with a usage error.
bool empty_allowed(const std::string& option) {
  return option == "prompt" || option == "sample-prompt";
}
// An accepted run is short (the prefix); a refused one immediate. 60 s only catches a hang.
constexpr double kHangSeconds = 60;
// Children run this many at a time, each in its own working directory (a garbage output path
// such as "abc" must not collide), so that the 1,040 runs of gpt2_train take about a minute.
constexpr int kParallel = 3;

struct Run {
  std::vector<std::string> args;
  std::string what;  // "--name 'value'"
  bool empty_value = false;
};

void check(const AppCase& a, const Run& r, const Outcome& o, double seconds) {
  SCOPED_TRACE(a.app + " " + r.what);
  EXPECT_EQ(o.signal, 0) << o.output;
  EXPECT_LT(seconds, kHangSeconds) << o.output;
  EXPECT_TRUE(o.exit_code == 0 || o.exit_code == 1 || o.exit_code == 2) << o.exit_code << "\n"
                                                                        << o.output;
  EXPECT_FALSE(has(o.output, "internal error")) << o.output;
  EXPECT_FALSE(has(o.output, "terminate called")) << o.output;
  if (o.exit_code == 2) {
    EXPECT_TRUE(has(o.output, "usage: " + a.app)) << o.output;
  }
  if (r.empty_value) {
    EXPECT_EQ(o.exit_code, 2) << o.output;
    EXPECT_TRUE(has(o.output, "'': an empty value; pass a value or leave the option out"))
        << o.output;
  }
}

// Every valued option of `a` with every value of kValues; prints the runs and accepted count.
void fuzz_app(TempDir& tmp, const AppCase& a) {
  Outcome help = testing::run_app(tmp, a.app, {"--help"});
  EXPECT_EQ(help.exit_code, 0) << a.app << help.output;
  const std::vector<OptionSpec> specs = options_of(help.output);
  EXPECT_GT(specs.size(), 2u) << a.app << help.output;
  // The prefix alone must be accepted: otherwise every run would be refused for it, and the
  // values under test would never be reached.
  std::vector<std::string> plain = a.prefix;
  plain.insert(plain.end(), a.positional.begin(), a.positional.end());
  const std::string dir = tmp.file("slot0");
  std::filesystem::create_directories(dir);
  const Outcome base = Child(a.app, plain, dir + ".log", {}, dir).finish(kHangSeconds);
  EXPECT_EQ(base.exit_code, 0) << a.app << " with its prefix alone:\n" << base.output;
  std::vector<Run> runs;
  for (const OptionSpec& spec : specs) {
    if (spec.flag) continue;  // a flag has no value to garble
    for (const std::string& value : kValues) {
      Run r{without(a.prefix, spec.name, specs), "--" + spec.name + " '" + value + "'",
            value.empty() && !empty_allowed(spec.name)};
      r.args.push_back("--" + spec.name);
      r.args.push_back(value);
      r.args.insert(r.args.end(), a.positional.begin(), a.positional.end());
      runs.push_back(std::move(r));
    }
  }
  for (int k = 0; k < kParallel; ++k)
    std::filesystem::create_directories(tmp.file("slot" + std::to_string(k)));
  int accepted = 0;
  for (size_t first = 0; first < runs.size(); first += kParallel) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::unique_ptr<Child>> batch;
    for (size_t i = first; i < std::min(runs.size(), first + kParallel); ++i) {
      const std::string dir = tmp.file("slot" + std::to_string(i - first));
      batch.push_back(std::make_unique<Child>(a.app, runs[i].args, dir + ".log",
                                              std::vector<std::string>{}, dir));
    }
    for (size_t j = 0; j < batch.size(); ++j) {
      const Outcome o = batch[j]->finish(kHangSeconds);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      check(a, runs[first + j], o, seconds);
      if (o.exit_code == 0) ++accepted;
    }
  }
  std::printf("%s: %zu runs, %d accepted\n", a.app.c_str(), runs.size(), accepted);
}

const std::string kFixtures = std::string(MW_SOURCE_DIR) + "/tests/fixtures/";

TEST(OptionFuzz, EveryOptionOfEveryToolEndsCleanlyOnGarbage) {
  TempDir tmp;
  const std::vector<AppCase> apps = {
      {"gpt2_generate",
       {"--model", kFixtures + "gpt2_tiny", "--prompt-ids", "1,2", "--print-ids",
        "--max-new-tokens", "2"},
       {}},
      {"gpt2_tokenize",
       {"--vocab", kFixtures + "bpe/vocab.json", "--merges", kFixtures + "bpe/merges.txt", "--out",
        "shards", "--threads", "1"},
       {kFixtures + "bpe/train.txt"}},
      {"gpt2_bench",
       {"--model", "tiny", "--batch", "1", "--seq", "8", "--steps", "2", "--threads", "1",
        "--torch", "off"},
       {}},
      {"nvme_step_bench",
       {"--model", "tiny", "--batch", "1", "--seq", "8", "--steps", "2", "--threads", "1",
        "--no-fio"},
       {}},
      {"gemini_step_bench",
       {"--model", "tiny", "--batch", "1", "--seq", "8", "--steps", "3", "--threads", "1"},
       {}},
      {"adam_bench", {"--numel", "4096", "--steps", "1", "--threads", "1"}, {}},
      {"nvme_bench",
       {"--dir", "nb", "--size", "1MiB", "--block", "64KiB", "--depth", "2", "--reps", "1",
        "--no-fio"},
       {}},
  };
  for (const AppCase& a : apps) fuzz_app(tmp, a);
}

// gpt2_train has most options (80 valued ones, 1,040 runs): its own test, so that ctest runs it
// beside the other tools'.
TEST(OptionFuzz, EveryOptionOfGpt2TrainEndsCleanlyOnGarbage) {
  TempDir tmp;
  fuzz_app(tmp,
           {"gpt2_train",
            {"--model", "tiny", "--batch", "1", "--seq", "8", "--steps", "1", "--threads", "1"},
            {}});
}

}  // namespace
}  // namespace mw
