// The README's sample output of the main job stays true (issue #12 item 6): every line of the
// block after "What the first prints" must still be printed by `gpt2_train --offload nvme
// --fraction 1.0`. The README's run is GPT-2 small (minutes); this runs the tiny preset with the
// same options, so numbers differ: each documented line is reduced to its label (the text before
// its first digit) and a line of the real output must start with that label.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "run_app.h"

namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(' ');
  const size_t b = s.find_last_not_of(' ');
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// "  total: host 1080.9 MiB | ..." -> "total: host"; "[0] loss: 10.978" -> "[".
std::string label(const std::string& line) {
  std::string t = trim(line);
  size_t i = 0;
  while (i < t.size() && !std::isdigit(static_cast<unsigned char>(t[i]))) ++i;
  return trim(t.substr(0, i));
}

std::vector<std::string> readme_sample() {
  std::ifstream in(std::string(MW_SOURCE_DIR) + "/README.md");
  std::vector<std::string> lines;
  bool after_intro = false, in_block = false;
  for (std::string l; std::getline(in, l);) {
    if (!after_intro) {
      after_intro = l.rfind("What the first prints", 0) == 0;
      continue;
    }
    if (l.rfind("```", 0) == 0) {
      if (in_block) break;
      in_block = true;
      continue;
    }
    if (in_block) lines.push_back(l);
  }
  return lines;
}

TEST(ReadmeSample, EveryDocumentedLineOfTheMainJobIsStillPrinted) {
  const std::vector<std::string> documented = readme_sample();
  ASSERT_GT(documented.size(), 15u) << "the README's sample block was not found";
  const mw::testing::AppResult run = mw::testing::run_built_app(
      "gpt2_train", "--model tiny --offload nvme --fraction 1.0 --threads 2");
  const std::string& out = run.output;
  ASSERT_EQ(run.exit_code, 0) << out;
  std::vector<std::string> printed;
  std::istringstream lines(out);
  for (std::string l; std::getline(lines, l);) printed.push_back(trim(l));
  int checked = 0;
  for (const std::string& line : documented) {
    const std::string want = label(line);
    // The io backend line names the probe's outcome, which depends on the kernel (uring or the
    // thread pool): only its tag is checked.
    const std::string prefix = want.rfind("[memwall io]", 0) == 0 ? "[memwall io]" : want;
    if (prefix.size() < 2) continue;  // "[0] loss": a label too short to mean anything
    bool found = false;
    for (const std::string& p : printed) found = found || p.rfind(prefix, 0) == 0;
    EXPECT_TRUE(found) << "the README shows a line starting \"" << prefix
                       << "\" that the main job no longer prints:\n  " << line << "\noutput:\n"
                       << out;
    ++checked;
  }
  EXPECT_GT(checked, 15);
}

}  // namespace
