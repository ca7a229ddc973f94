// One writer per output (Note [One writer per output]): a second run on a --checkpoint-dir or a
// --log that a running run writes is refused, the lock goes with the run, and what the lock
// created for a run that was then refused is gone again.
#include "data/output_lock.h"

#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "../data/temp_dir.h"
#include "core/error.h"
#include "trainer_fixtures.h"

namespace mw::train {
using data::OutputLock;
namespace {

namespace fs = std::filesystem;
using data::testing::expect_throw_with;
using data::testing::read_bytes;
using data::testing::TempDir;
using data::testing::write_bytes;

TEST(OutputLock, ASecondWriterIsRefusedWhileTheFirstHoldsTheLock) {
  TempDir tmp;
  const std::string dir = tmp.file("ck"), log = tmp.file("log.jsonl");
  {
    OutputLock first_dir(dir, true, "--checkpoint-dir", "would clash");
    OutputLock first_log(log, false, "--log", "would clash");
    EXPECT_TRUE(first_dir.held() && first_log.held());
    // flock holds between two opens of one process as between two processes.
    expect_throw_with<InvalidArgument>(
        [&] { OutputLock(dir, true, "--checkpoint-dir", "would clash"); },
        {"--checkpoint-dir '" + dir + "'", "another run", "Wait for that run to end",
         "pass another"});
    expect_throw_with<InvalidArgument>([&] { OutputLock(log, false, "--log", "would clash"); },
                                       {"--log '" + log + "'", "another run"});
  }
  OutputLock again(dir, true, "--checkpoint-dir", "would clash");  // released with the first
  EXPECT_TRUE(again.held());
  // A log on a device is not locked: two runs may both log to /dev/null or one terminal.
  OutputLock null_a("/dev/null", false, "--log", "would clash");
  OutputLock null_b("/dev/null", false, "--log", "would clash");
  EXPECT_FALSE(null_a.held() || null_b.held());
  EXPECT_TRUE(std::filesystem::exists("/dev/null"));
}

TEST(OutputLock, TheRefusalNamesTheProcessThatHoldsTheLock) {
  TempDir tmp;
  const std::string dir = tmp.file("ck");
  fs::create_directory(dir);
  int ready[2], quit[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(quit), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // another run: holds the folder's lock until told to end
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    const char ok = fd >= 0 && ::flock(fd, LOCK_EX) == 0 ? 1 : 0;
    (void)!::write(ready[1], &ok, 1);
    char c;
    (void)!::read(quit[0], &c, 1);
    ::_exit(0);
  }
  char ok = 0;
  ASSERT_EQ(::read(ready[0], &ok, 1), 1);
  ASSERT_EQ(ok, 1);
  expect_throw_with<InvalidArgument>(
      [&] { OutputLock(dir, true, "--checkpoint-dir", "would clash"); },
      {"process " + std::to_string(child) + " holds its lock"});
  ASSERT_EQ(::write(quit[1], "q", 1), 1);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(
      OutputLock(dir, true, "--checkpoint-dir", "would clash").held());  // the kernel dropped it
  for (int fd : {ready[0], ready[1], quit[0], quit[1]}) ::close(fd);
}

TEST(OutputLock, WhatTheLockCreatedIsRemovedWhileEmptyAndNothingElse) {
  TempDir tmp;
  { OutputLock dir(tmp.file("a/b/ck"), true, "--checkpoint-dir", "would clash"); }
  EXPECT_FALSE(fs::exists(tmp.file("a")));  // refused after locking: no folder left
  { OutputLock log(tmp.file("logs/run.jsonl"), false, "--log", "would clash"); }
  EXPECT_FALSE(fs::exists(tmp.file("logs")));
  {
    OutputLock log(tmp.file("logs/run.jsonl"), false, "--log", "would clash");
    write_bytes(tmp.file("logs/run.jsonl"), "{\"step\":0}\n");  // the run logged: kept
  }
  EXPECT_EQ(read_bytes(tmp.file("logs/run.jsonl")), "{\"step\":0}\n");
  fs::create_directory(tmp.file("old"));
  write_bytes(tmp.file("empty.jsonl"), "");
  {
    OutputLock dir(tmp.file("old"), true, "--checkpoint-dir", "would clash");
    OutputLock log(tmp.file("empty.jsonl"), false, "--log", "would clash");
  }
  EXPECT_TRUE(fs::is_directory(tmp.file("old")));  // the user's, not the lock's
  EXPECT_TRUE(fs::exists(tmp.file("empty.jsonl")));
}

TEST(OutputLock, ASecondRunOnOneCheckpointFolderOrLogIsRefusedBeforeItsModelIsBuilt) {
  TempDir tmp;
  TrainOptions o = testing::tiny(testing::write_shard(tmp, "train.bin", 1), 2);
  o.checkpoint_dir = tmp.file("ck");
  Trainer first(o, nullptr);
  expect_throw_with<InvalidArgument>([&] { Trainer second(o, nullptr); },
                                     {"--checkpoint-dir '" + o.checkpoint_dir + "'"});
  TrainOptions other = o;
  other.checkpoint_dir = tmp.file("ck2");
  other.log = tmp.file("log.jsonl");
  Trainer with_log(other, nullptr);
  other.checkpoint_dir = tmp.file("ck3");
  expect_throw_with<InvalidArgument>([&] { Trainer second(other, nullptr); },
                                     {"--log '" + other.log});
  EXPECT_FALSE(fs::exists(tmp.file("ck3")));  // the refused run left nothing
}

}  // namespace
}  // namespace mw::train
