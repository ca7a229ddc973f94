// Note [Offload in RAM] (offload/io/scratch_dir.h): a folder on tmpfs is told apart from one on a
// disk, and the default base of the private offload folders skips a /tmp that lives in RAM.
#include "offload/io/scratch_dir.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "../data/temp_dir.h"

namespace mw::io {
namespace {

// The file system type /proc/mounts gives for the mount point `dir`, "" when it is not one.
std::string mount_type(const std::string& dir) {
  std::ifstream in("/proc/mounts");
  std::string type;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string device, point, t;
    if (words >> device >> point >> t && point == dir) type = t;  // the last mount wins
  }
  return type;
}

TEST(ScratchDir, AFolderOnTmpfsIsToldApartFromOneOnADisk) {
  if (mount_type("/dev/shm") != "tmpfs") GTEST_SKIP() << "/dev/shm is not a tmpfs mount here";
  EXPECT_EQ(memory_file_system("/dev/shm"), "tmpfs");
  EXPECT_EQ(memory_file_system("/dev/shm/memwall-no-such-dir/a"), "tmpfs");  // yet to be made
  data::testing::TempDir tmp;
  const std::string type = mount_type("/tmp");
  if (type == "tmpfs" || type == "ramfs") GTEST_SKIP() << "/tmp is in RAM here";
  EXPECT_EQ(memory_file_system(tmp.path()), "") << tmp.path();
}

TEST(ScratchDir, TheDefaultBaseSkipsAFolderInRamForOneOnADisk) {
  if (mount_type("/dev/shm") != "tmpfs") GTEST_SKIP() << "/dev/shm is not a tmpfs mount here";
  data::testing::TempDir disk;  // under /tmp
  if (!memory_file_system(disk.path()).empty()) GTEST_SKIP() << "/tmp is in RAM here";
  EXPECT_EQ(offload_base_among({"/dev/shm", disk.path()}), disk.path());
  EXPECT_EQ(offload_base_among({disk.path(), "/dev/shm"}), disk.path());
  EXPECT_EQ(offload_base_among({"/dev/shm"}), "/dev/shm");  // nothing better: as asked
  // No writable folder on a disk: the first, as before (its mkdtemp names what is wrong).
  EXPECT_EQ(offload_base_among({disk.file("missing"), "/dev/shm"}), disk.file("missing"));
}

}  // namespace
}  // namespace mw::io
