// Where gpt2_train's outputs go: a --save folder that holds other files is never replaced, and
// every output may name directories that do not exist yet (docs/reliability.md, section 3).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "../data/temp_dir.h"
#include "child.h"

namespace mw {
namespace {

using data::testing::read_bytes;
using data::testing::TempDir;
using data::testing::write_bytes;
using testing::has;
using testing::hidden_entries;
using testing::Outcome;
using testing::run_app;
using testing::tiny;

// --save replaces its folder as a whole (Note [Replacing only what a save wrote]): `--save /tmp`
// replaced all of /tmp with the model. A folder holding anything else is refused before step 0 and
// kept as it was; one that an earlier save wrote is replaced as before.
TEST(Reliability, SaveNeverReplacesAFolderWithOtherFiles) {
  TempDir tmp;
  const std::string home = tmp.file("home");
  std::filesystem::create_directories(home + "/project");
  write_bytes(home + "/notes.txt", "mine");
  Outcome o = run_app(tmp, "gpt2_train", tiny({"--steps", "2", "--save", home}));
  EXPECT_EQ(o.exit_code, 1) << o.output;
  EXPECT_TRUE(has(o.output, "--save")) << o.output;
  EXPECT_TRUE(has(o.output, "'notes.txt', 'project'")) << o.output;
  EXPECT_FALSE(has(o.output, "[0] loss")) << o.output;
  EXPECT_EQ(read_bytes(home + "/notes.txt"), "mine");
  EXPECT_TRUE(std::filesystem::is_directory(home + "/project"));
  EXPECT_TRUE(hidden_entries(tmp.path()).empty());
  const std::string model = tmp.file("model");
  for (int run = 0; run < 2; ++run) {  // the second replaces the first's folder
    o = run_app(tmp, "gpt2_train", tiny({"--steps", "1", "--save", model}));
    EXPECT_EQ(o.exit_code, 0) << o.output;
  }
  EXPECT_TRUE(std::filesystem::is_regular_file(model + "/model.safetensors"));
}

// Every output may name directories that do not exist yet: the check before the run accepts them
// (the nearest existing one must be writable), so each writer creates them. Before, --log failed
// when the trainer opened it, and --trace and --nvme-timeline only after the last step.
TEST(Reliability, OutputsInMissingDirectoriesAreCreated) {
  TempDir tmp;
  const std::string d = tmp.file("new/deeper");
  Outcome o = run_app(tmp, "gpt2_train", tiny({"--steps",          "2",          "--device",
                                               "sim:64MiB",        "--gemini",   "auto",
                                               "--offload",        "nvme",       "--log",
                                               d + "/log.json",    "--trace",    d + "/trace.json",
                                               "--nvme-timeline",  d + "/t.csv", "--save-optimizer",
                                               d + "/opt.bin",     "--save",     d + "/model",
                                               "--checkpoint-dir", d + "/ck"}));
  EXPECT_EQ(o.exit_code, 0) << o.output;
  for (const char* f : {"log.json", "trace.json", "t.csv", "opt.bin", "model/model.safetensors",
                        "ck/step_000002/manifest.json"})
    EXPECT_TRUE(std::filesystem::is_regular_file(d + "/" + f)) << f << "\n" << o.output;
}

}  // namespace
}  // namespace mw
