// Atomic saves under injected faults and stop signals (data/file_io.h, data/atomic_save.h): an
// earlier file or folder is never lost, nothing temporary is left, special files are refused as
// inputs, and output paths are probed without leaving anything behind.
#include "data/atomic_save.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "core/interrupt.h"
#include "data/file_io.h"
#include "temp_dir.h"

namespace mw::data {
namespace {

using testing::expect_throw_with;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;
namespace fs = std::filesystem;

int64_t entries(const std::string& dir) {
  return std::distance(fs::directory_iterator(dir), fs::directory_iterator());
}

// The entries the test saves write ("a" and "b").
bool ab(const std::string& name) { return name == "a" || name == "b"; }

void write_pieces(const std::string& path, const std::string& a, const std::string& b) {
  write_file_atomically(path, {{a.data(), int64_t(a.size())}, {b.data(), int64_t(b.size())}},
                        "test hint");
}

class AtomicSave : public ::testing::Test {
 protected:
  void TearDown() override {
    set_write_fault_for_testing(WriteFault::kNone, 0);
    clear_stop_request_for_testing();
  }
  TempDir tmp;
};

TEST_F(AtomicSave, DiskFullOrIoErrorAtEveryWriteKeepsTheEarlierFile) {
  const std::string path = tmp.file("state.bin");
  write_bytes(path, "old");
  for (WriteFault fault : {WriteFault::kNoSpace, WriteFault::kIoError}) {
    for (int nth : {1, 2}) {
      SCOPED_TRACE(nth);
      set_write_fault_for_testing(fault, nth);
      expect_throw_with<IoError>([&] { write_pieces(path, "new-a", "new-b"); },
                                 {fault == WriteFault::kNoSpace ? "ENOSPC" : "EIO", "state.bin",
                                  fault == WriteFault::kNoSpace ? "free disk space" : "test hint"});
      EXPECT_EQ(read_bytes(path), "old");
      EXPECT_EQ(entries(tmp.path()), 1);  // no temporary file left
    }
  }
}

TEST_F(AtomicSave, AShortWriteIsFinishedByTheLoop) {
  const std::string path = tmp.file("state.bin");
  set_write_fault_for_testing(WriteFault::kShortWrite, 1);
  write_pieces(path, "0123456789", "abc");
  EXPECT_EQ(read_bytes(path), "0123456789abc");
}

TEST_F(AtomicSave, AStopSignalDuringAWriteRemovesTheTemporaryFile) {
  const std::string path = tmp.file("state.bin");
  write_bytes(path, "old");
  install_stop_signal_handlers();
  ::raise(SIGTERM);  // only sets the flag (Note [Stop signals])
  try {
    write_pieces(path, "new", "er");
    ADD_FAILURE() << "not interrupted";
  } catch (const Interrupted& e) {
    EXPECT_EQ(e.exit_code(), 143);
    EXPECT_NE(std::string(e.what()).find("SIGTERM"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_bytes(path), "old");
  EXPECT_EQ(entries(tmp.path()), 1);
}

class AtomicFolder : public AtomicSave, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override { set_refuse_rename_exchange_for_testing(GetParam()); }
  void TearDown() override {
    set_refuse_rename_exchange_for_testing(false);
    AtomicSave::TearDown();
  }
};
INSTANTIATE_TEST_SUITE_P(ExchangeAndRenameAside, AtomicFolder, ::testing::Bool());

TEST_P(AtomicFolder, AFolderIsReplacedWholeOrNotAtAll) {
  const std::string dir = tmp.file("model");
  auto save = [&](const std::string& a, const std::string& b) {
    StagedDirectory staged(dir, "test hint", ab);
    write_file(staged.file("a"), {{a.data(), int64_t(a.size())}}, "test hint");
    write_file(staged.file("b"), {{b.data(), int64_t(b.size())}}, "test hint");
    staged.commit();
  };
  save("a1", "b1");
  EXPECT_EQ(read_bytes(dir + "/a"), "a1");
  // Disk full at the second file: the folder keeps both old files, matching each other.
  set_write_fault_for_testing(WriteFault::kNoSpace, 2);
  expect_throw_with<IoError>([&] { save("a2", "b2"); }, {"ENOSPC"});
  set_write_fault_for_testing(WriteFault::kNone, 0);
  EXPECT_EQ(read_bytes(dir + "/a"), "a1");
  EXPECT_EQ(read_bytes(dir + "/b"), "b1");
  EXPECT_EQ(entries(tmp.path()), 1);
  save("a3", "b3");
  EXPECT_EQ(read_bytes(dir + "/a"), "a3");
  EXPECT_EQ(read_bytes(dir + "/b"), "b3");
  EXPECT_EQ(entries(dir), 2);
  EXPECT_EQ(entries(tmp.path()), 1);
  // A plain file where the folder should be is refused, untouched.
  write_bytes(tmp.file("file"), "x");
  expect_throw_with<IoError>([&] { StagedDirectory s(tmp.file("file"), "hint", ab); },
                             {"not a directory"});
  EXPECT_EQ(read_bytes(tmp.file("file")), "x");
}

// Note [Replacing only what a save wrote]: `gpt2_train --save /tmp` replaced all of /tmp with the
// model. A folder holding anything a save does not write is refused before a byte is written, and
// again at the swap if something arrived meanwhile; it is left exactly as it was.
TEST_F(AtomicSave, AFolderWithOtherFilesIsNeverReplaced) {
  const std::string dir = tmp.file("work");
  fs::create_directories(dir + "/sub");
  write_bytes(dir + "/a", "a0");
  write_bytes(dir + "/notes.txt", "mine");
  expect_throw_with<IoError>([&] { StagedDirectory s(dir, "hint", ab); },
                             {"'notes.txt', 'sub'", "would delete", "nothing was written"});
  expect_throw_with<IoError>([&] { check_output_path(dir, "--save", true, ab); },
                             {"--save", "'notes.txt', 'sub'", "a new folder"});
  check_output_path(dir, "--checkpoint-dir", true);  // a container: nothing in it is replaced
  EXPECT_EQ(read_bytes(dir + "/notes.txt"), "mine");
  EXPECT_EQ(entries(dir), 3);
  EXPECT_EQ(entries(tmp.path()), 1) << "no temporary left";
  // A file that arrives while the save is staged stops the swap; the folder keeps it.
  fs::remove_all(dir + "/sub");
  fs::remove(dir + "/notes.txt");
  {
    StagedDirectory staged(dir, "hint", ab);
    write_bytes(staged.file("a"), "a1");
    write_bytes(dir + "/late.txt", "arrived");
    expect_throw_with<IoError>([&] { staged.commit(); }, {"'late.txt'"});
  }
  EXPECT_EQ(read_bytes(dir + "/a"), "a0");
  EXPECT_EQ(read_bytes(dir + "/late.txt"), "arrived");
  EXPECT_EQ(entries(tmp.path()), 1) << "no temporary left";
}

TEST_F(AtomicSave, LeftoversOfDeadProcessesAreRemovedByTheNextSave) {
  const std::string dir = tmp.file("model");
  fs::create_directories(dir);
  write_bytes(dir + "/a", "kept");
  // A pid that cannot be running (above the kernel's pid_max of 2^22).
  const std::string dead_tmp = tmp.file(".model.tmp-99999999");
  fs::create_directories(dead_tmp);
  write_bytes(dead_tmp + "/a", "half");
  write_bytes(tmp.file(".other.tmp-99999999"), "someone else's");
  const std::string live = tmp.file(str(".model.tmp-", ::getppid()));  // a live process's
  fs::create_directories(live);
  EXPECT_EQ(remove_stale_temporaries(dir), 1);
  EXPECT_FALSE(fs::exists(dead_tmp));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(tmp.file(".other.tmp-99999999")));
  EXPECT_EQ(read_bytes(dir + "/a"), "kept");
  // Killed between the fallback's two renames: the folder is put back.
  fs::rename(dir, tmp.file(".model.old-99999999"));
  remove_stale_temporaries(dir);
  EXPECT_EQ(read_bytes(dir + "/a"), "kept");
}

TEST_F(AtomicSave, SpecialFilesAreRefusedAsInputsAtOnce) {
  const std::string fifo = tmp.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  int64_t size = 0;
  // Would block forever in open() without O_NONBLOCK: the test's own timeout catches a hang.
  expect_throw_with<IoError>([&] { open_regular_file(fifo, "token shard", "the hint", &size); },
                             {"FIFO", fifo, "regular file", "the hint"});
  expect_throw_with<IoError>([&] { ReadOnlyFile f(tmp.path(), "config.json", "hint"); },
                             {"a directory"});
  expect_throw_with<IoError>([&] { read_text_file("/dev/null", "config.json", "hint"); },
                             {"character device"});
}

// Note [Byte-order mark]: a config.json or vocab.json saved by a Windows editor starts with EF BB
// BF, which is not JSON; it is dropped, and nothing else is.
TEST_F(AtomicSave, ReadTextFileDropsALeadingUtf8ByteOrderMark) {
  const std::string bom = tmp.file("bom.json"), mid = tmp.file("mid.txt");
  write_file_atomically(bom, {{"\xEF\xBB\xBF{}", 5}}, "hint");
  write_file_atomically(mid, {{"a\xEF\xBB\xBF", 4}}, "hint");
  EXPECT_EQ(read_text_file(bom, "config.json", "hint"), "{}");
  EXPECT_EQ(read_text_file(mid, "text", "hint"), "a\xEF\xBB\xBF");
}

TEST_F(AtomicSave, OutputPathsAreProbedWithoutLeavingAnything) {
  check_output_path(tmp.file("log.jsonl"), "--log", false);
  check_output_path(tmp.file("new/deeper/model"), "--save", true);  // created by the save itself
  EXPECT_EQ(entries(tmp.path()), 0);
  expect_throw_with<IoError>([&] { check_output_path(tmp.path(), "--log", false); },
                             {"--log", "is a directory"});
  const std::string fifo = tmp.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_throw_with<IoError>([&] { check_output_path(fifo, "--log", false); },
                             {"--log", "no reader"});  // instead of blocking in open()
  check_output_path("/dev/null", "--log", false);
  fs::remove(fifo);
  for (const std::string& odd : {std::string("."), std::string("/"), tmp.path() + "/.."})
    expect_throw_with<IoError>([&] { check_output_path(odd, "--save", true); },
                               {"--save", "a name of its own"});
  write_bytes(tmp.file("f"), "x");
  expect_throw_with<IoError>([&] { check_output_path(tmp.file("f"), "--save", true); },
                             {"--save", "not a directory"});
  expect_throw_with<IoError>([&] { check_output_path(tmp.file("f/x"), "--save-optimizer", false); },
                             {"--save-optimizer", "not a directory"});
  if (::geteuid() != 0) {  // root writes anywhere
    ::chmod(tmp.path().c_str(), 0500);
    expect_throw_with<IoError>([&] { check_output_path(tmp.file("log"), "--log", false); },
                               {"--log", "EACCES"});
    ::chmod(tmp.path().c_str(), 0700);
  }
}

}  // namespace
}  // namespace mw::data
