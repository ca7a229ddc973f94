// Checkpoint folders: the manifest catches truncation and corruption naming the file, only whole
// step_* folders are listed, the newest is found, and --keep prunes the oldest.
#include "train/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "../data/temp_dir.h"
#include "core/error.h"

namespace mw::train {
namespace {

using data::testing::read_bytes;
using data::testing::TempDir;
using data::testing::write_bytes;
namespace fs = std::filesystem;

std::string save(const std::string& dir, int64_t step) {
  TrainState s;
  s.step = step;
  s.micro_batch = 2 * step;
  s.dropout_rng = {~uint64_t{0}, 12345};  // above INT64_MAX: stored exactly as text
  s.run.set("batch", 4);
  return write_checkpoint(
      dir, s,
      [](const std::string& model) {
        fs::create_directories(model);
        write_bytes(model + "/model.safetensors", std::string(1000, 'w'));
      },
      [](const std::string& opt) { write_bytes(opt, std::string(333, 'o')); });
}

void expect_corrupt(const std::string& path, const std::string& needle) {
  try {
    verify_checkpoint(path);
    FAIL() << "accepted a corrupt checkpoint";
  } catch (const FormatError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(needle), std::string::npos) << m;
    EXPECT_NE(m.find(path), std::string::npos) << m;
  }
}

TEST(Checkpoint, RoundTripsTheTrainingState) {
  TempDir tmp;
  const std::string path = save(tmp.file("ckpt"), 7);
  EXPECT_EQ(fs::path(path).filename(), "step_000007");
  const TrainState s = verify_checkpoint(path);
  EXPECT_EQ(s.step, 7);
  EXPECT_EQ(s.micro_batch, 14);
  EXPECT_EQ(s.dropout_rng.seed, ~uint64_t{0});
  EXPECT_EQ(s.dropout_rng.offset, 12345u);
  EXPECT_EQ(s.run.get_int("batch"), 4);
  EXPECT_EQ(find_checkpoint(tmp.file("ckpt")), path);
  EXPECT_EQ(find_checkpoint(path), path);  // a step folder itself
}

// Evaluations without a best (their loss was not finite) still count towards --early-stop, and
// the last evaluation's step is kept: both were lost (evals_since_best was written only with a
// best) or absent until session 38.
TEST(Checkpoint, EvaluationsWithoutABestAndTheLastEvaluationRoundTrip) {
  TrainState s;
  s.best.evals_since = 2;
  s.last_eval_step = 5;
  const TrainState back = train_state_from_json(to_json(s), "test");
  EXPECT_EQ(back.best.step, -1);
  EXPECT_EQ(back.best.evals_since, 2);
  EXPECT_EQ(back.last_eval_step, 5);
  json::Value older = to_json(TrainState{});  // a checkpoint from before: neither field
  EXPECT_EQ(train_state_from_json(older, "test").last_eval_step, -1);
}

TEST(Checkpoint, TruncationAndCorruptionAreNamed) {
  TempDir tmp;
  const std::string path = save(tmp.file("ckpt"), 1);
  const std::string opt = path + "/optimizer.bin";
  std::string bytes = read_bytes(opt);
  bytes[100] ^= 1;  // one bit
  write_bytes(opt, bytes);
  expect_corrupt(path, "'optimizer.bin' has checksum");
  fs::resize_file(path + "/model/model.safetensors", 999);
  expect_corrupt(path, "'model/model.safetensors' is 999 bytes");
  fs::remove(path + "/manifest.json");
  expect_corrupt(path, "manifest.json is missing");
  // A manifest that is cut short, is not the manifest's shape, or lists nothing: each was a bare
  // JSON error (one without a path) or, for an empty list, a checkpoint resumed unverified.
  write_bytes(path + "/manifest.json", "{\"checksum\": \"fnv1a64-words\", \"files\": [{\"pa");
  expect_corrupt(path, "its manifest.json cannot be read");
  write_bytes(path + "/manifest.json", "{}");
  expect_corrupt(path, "its manifest.json cannot be read");
  write_bytes(path + "/manifest.json", "{\"checksum\": \"fnv1a64-words\", \"files\": []}");
  expect_corrupt(path, "its manifest.json does not list trainer.json");
}

TEST(Checkpoint, OnlyWholeFoldersCountAndKeepPrunesTheOldest) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  for (int64_t step : {2, 10, 4}) save(dir, step);
  fs::create_directories(dir + "/.step_000012.tmp-999999");  // a save killed half-way
  fs::create_directories(dir + "/step_x");
  EXPECT_EQ(list_checkpoints(dir).size(), 3u);
  EXPECT_EQ(fs::path(find_checkpoint(dir)).filename(), "step_000010");  // by number
  EXPECT_EQ(prune_checkpoints(dir, 2), 1);
  EXPECT_FALSE(fs::exists(dir + "/step_000002"));
  EXPECT_TRUE(fs::exists(dir + "/step_000004"));
  EXPECT_THROW(find_checkpoint(tmp.file("none")), IoError);
}

// Saves killed mid-write leave ".step_N.tmp-PID" folders; they are removed for every step once
// the folder is locked (they were removed only by a later save of the same step), and a live
// process's, and anything not a checkpoint's, stay.
TEST(Checkpoint, StaleTemporariesOfEveryStepAreRemoved) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  const std::string dead = "999999999";  // above any pid Linux gives (pid_max <= 2^22)
  for (const std::string& name :
       {".step_000001.tmp-" + dead, ".step_000007.tmp-" + dead,
        ".step_000002.tmp-" + std::to_string(::getpid()), ".other.tmp-" + dead})
    fs::create_directories(dir + "/" + name);
  EXPECT_EQ(remove_stale_checkpoint_temporaries(dir), 2);
  EXPECT_FALSE(fs::exists(dir + "/.step_000001.tmp-" + dead));
  EXPECT_FALSE(fs::exists(dir + "/.step_000007.tmp-" + dead));
  EXPECT_TRUE(fs::exists(dir + "/.step_000002.tmp-" + std::to_string(::getpid())));
  EXPECT_TRUE(fs::exists(dir + "/.other.tmp-" + dead));
}

TEST(Checkpoint, ChecksumDependsOnEveryByteAndTheLength) {
  TempDir tmp;
  write_bytes(tmp.file("a"), std::string(17, '\0'));
  write_bytes(tmp.file("b"), std::string(16, '\0'));  // a zero tail must not hide a truncation
  write_bytes(tmp.file("c"), std::string(16, '\0') + "\x01");
  EXPECT_NE(file_checksum(tmp.file("a")), file_checksum(tmp.file("b")));
  EXPECT_NE(file_checksum(tmp.file("a")), file_checksum(tmp.file("c")));
  EXPECT_EQ(file_checksum(tmp.file("a")).size(), 16u);
}

}  // namespace
}  // namespace mw::train
