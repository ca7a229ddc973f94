// Usage errors a user makes (session 38, an end-to-end walkthrough by a new user): a mistyped
// option names the one meant, and a switch counts as given (--eval-only's given() was always
// false, so every --eval-only --init-from without --lr warned that it would train at the default
// rate).
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "../data/temp_dir.h"
#include "child.h"
#include "data/token_shard.h"

namespace mw {
namespace {

using data::testing::TempDir;
using testing::has;
using testing::Outcome;
using testing::run_app;

TEST(Usage, AMistypedOptionNamesTheOneMeant) {
  TempDir tmp;
  for (const auto& [app, typed, meant] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"gpt2_train", "--eval-evry", "--eval-every"},
           {"gpt2_train", "--step", "--steps"},
           {"gpt2_generate", "--promt", "--prompt"}}) {
    SCOPED_TRACE(typed);
    const Outcome o = run_app(tmp, app, {typed, "5"});
    EXPECT_EQ(o.exit_code, 2) << o.output;
    EXPECT_TRUE(has(o.output, "unknown option '" + typed + "'; did you mean " + meant + "?"))
        << o.output;
  }
  const Outcome far = run_app(tmp, "gpt2_train", {"--zzzzzzzz", "5"});
  EXPECT_TRUE(has(far.output, "unknown option '--zzzzzzzz'\n")) << far.output;
}

TEST(Usage, EvalOnlyDoesNotWarnAboutTrainingRates) {
  TempDir tmp;
  const std::string fixture = std::string(MW_SOURCE_DIR) + "/tests/fixtures/gpt2_tiny";
  std::vector<uint16_t> tokens(200);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 97);
  data::write_token_shard(tmp.file("val.bin"), tokens);
  const Outcome o = run_app(tmp, "gpt2_train",
                            {"--eval-only", "--init-from", fixture, "--val-data",
                             tmp.file("val.bin"), "--batch", "2", "--seq", "16", "--threads", "1"});
  EXPECT_EQ(o.exit_code, 0) << o.output;
  EXPECT_TRUE(has(o.output, "val loss")) << o.output;
  EXPECT_FALSE(has(o.output, "without --lr")) << o.output;
}

}  // namespace
}  // namespace mw
