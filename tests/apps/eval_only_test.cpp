// Note [Evaluation-only plan] (train/memory_plan.cpp): --eval-only runs forwards without grad
// mode, and its plan holds the parameters and one forward, met by the allocators' peaks. Planned
// as a training step (Adam states, gradients, saved activations) it refused evaluations that fit:
// GPT-2 xl asked for 18.4 GiB of host RAM.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "../data/temp_dir.h"
#include "data/token_shard.h"
#include "run_app.h"

namespace mw {
namespace {

using data::testing::TempDir;
using testing::AppResult;

double number_after(const std::string& text, const std::string& pattern) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(pattern))) return -1;
  return std::stod(m[1].str());
}

TEST(EvalOnly, IsPlannedAsForwardsWithoutGradAndMeetsItsPlan) {
  TempDir tmp;
  std::vector<uint16_t> tokens(64 * 10);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 37) % 1000);
  data::write_token_shard(tmp.file("val_000000.bin"), tokens);
  const std::string shape =
      "--n-layer 2 --n-embd 128 --n-head 4 --vocab-size 1000 --seq 64 --batch 4 --threads 1 ";
  const AppResult saved =
      testing::run_built_app("gpt2_train", shape + "--steps 0 --save " + tmp.file("m"));
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const std::string eval = "--seq 64 --batch 4 --threads 1 --init-from " + tmp.file("m") +
                           " --eval-only --val-data " + tmp.path();
  for (const std::string device : {"cpu", "sim:1GiB"}) {
    SCOPED_TRACE(device);
    const AppResult r = testing::run_built_app("gpt2_train", eval + " --device " + device);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("Adam m, v"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("evaluation forward (no grad)"), std::string::npos) << r.output;
    const bool cpu = device == "cpu";
    const double planned =
        number_after(r.output, cpu ? "total: host ([0-9.]+) MiB" : "\\| sim:0 ([0-9.]+) MiB \\|");
    const double used = number_after(
        r.output, cpu ? "host allocator peak ([0-9]+) MiB" : "sim:0 peak ([0-9]+) MiB");
    ASSERT_GT(planned, 0) << r.output;
    ASSERT_GT(used, 0) << r.output;
    // The peak is printed in whole MiB; the plan counts every tensor of the forward at its
    // 4096-byte granule, so it meets the peak within that rounding.
    EXPECT_NEAR(planned, used, 1.0) << r.output;
  }
}

}  // namespace
}  // namespace mw
