// Every option of every app with garbage, empty, negative, zero, huge and overflowing values
// (issue #17 item 2): each run ends on its own, within a time limit (no hang), with exit 0, 1 or 2
// and never by a signal or an escaped exception ("internal error", "terminate called"). The
// options are read from each app's --help, so an option added later is covered too. Each app gets
// a prefix of valid options that keeps an accepted run short; the option under test replaces the
// prefix's value. Runs happen in a private working directory (a garbage output path lands there).
#include <gtest/gtest.h>

#include <chrono>
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

TEST(OptionFuzz, EveryOptionOfEveryAppEndsCleanlyOnGarbage) {
  TempDir tmp;
  const std::string fixtures = std::string(MW_SOURCE_DIR) + "/tests/fixtures/";
  const std::vector<AppCase> apps = {
      {"gpt2_generate",
       {"--model", fixtures + "gpt2_tiny", "--prompt-ids", "1,2", "--print-ids", "--max-new-tokens",
        "2"},
       {}},
      {"gpt2_tokenize",
       {"--vocab", fixtures + "bpe/vocab.json", "--merges", fixtures + "bpe/merges.txt", "--out",
        "shards", "--threads", "1"},
       {fixtures + "bpe/train.txt"}},
      {"gpt2_bench",
       {"--model", "tiny", "--batch", "1", "--seq", "8", "--steps", "1", "--threads", "1",
        "--torch", "off"},
       {}},
      {"nvme_step_bench",
       {"--model", "tiny", "--batch", "1", "--seq", "8", "--steps", "1", "--threads", "1"},
       {}},
      {"gemini_step_bench",
       {"--model", "tiny", "--batch", "1", "--seq", "8", "--steps", "1", "--threads", "1"},
       {}},
      {"adam_bench", {"--numel", "4096", "--steps", "1", "--threads", "1"}, {}},
      {"nvme_bench",
       {"--dir", "nb", "--size", "1MiB", "--block", "64KiB", "--depth", "2", "--reps", "1",
        "--no-fio"},
       {}},
  };
  const std::vector<std::string> values = {
      "",     "abc", "-1", "0",    "1e999", "99999999999999999999", "9223372036854775807", "nan",
      "-inf", "4x",  " 3", "0x10", "."};
  // An accepted run is short (the prefix); a refused one immediate. 60 s only catches a hang.
  constexpr double kHangSeconds = 60;
  int runs = 0, accepted = 0;
  for (const AppCase& a : apps) {
    Outcome help = testing::run_app(tmp, a.app, {"--help"});
    ASSERT_EQ(help.exit_code, 0) << a.app << help.output;
    const std::vector<OptionSpec> specs = options_of(help.output);
    ASSERT_GT(specs.size(), 2u) << a.app << help.output;
    for (const OptionSpec& spec : specs) {
      if (spec.flag) continue;  // a flag has no value to garble
      for (const std::string& value : values) {
        SCOPED_TRACE(a.app + " --" + spec.name + " '" + value + "'");
        std::vector<std::string> args = without(a.prefix, spec.name, specs);
        args.push_back("--" + spec.name);
        args.push_back(value);
        args.insert(args.end(), a.positional.begin(), a.positional.end());
        const auto t0 = std::chrono::steady_clock::now();
        Outcome o = Child(a.app, args, tmp.file("child.log"), {}, tmp.path()).finish(kHangSeconds);
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ++runs;
        EXPECT_EQ(o.signal, 0) << o.output;
        EXPECT_LT(seconds, kHangSeconds) << o.output;
        EXPECT_TRUE(o.exit_code == 0 || o.exit_code == 1 || o.exit_code == 2) << o.exit_code << "\n"
                                                                              << o.output;
        EXPECT_FALSE(has(o.output, "internal error")) << o.output;
        EXPECT_FALSE(has(o.output, "terminate called")) << o.output;
        if (o.exit_code == 2) {
          EXPECT_TRUE(has(o.output, "usage: " + a.app)) << o.output;
        }
        if (o.exit_code == 0) ++accepted;
      }
    }
  }
  std::printf("%d runs, %d accepted\n", runs, accepted);
}

}  // namespace
}  // namespace mw
