// Path identity for Note [Outputs apart]: the spellings a user types for one path are one path,
// and a sibling whose name merely starts with a folder's name is not inside it.
#include "train/run_paths.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "../data/temp_dir.h"

namespace mw::train {
namespace {

using data::testing::TempDir;

TEST(RunPaths, SpellingsOfOnePathAreOnePathAndPrefixesAreNotParents) {
  TempDir tmp;
  const std::string d = tmp.file("d");
  std::filesystem::create_directories(d + "/sub");
  std::filesystem::create_directory_symlink(d, tmp.file("link"));
  EXPECT_TRUE(same_path(d, d + "/"));
  EXPECT_TRUE(same_path(d + "/sub/../x.bin", d + "/x.bin"));          // x.bin does not exist yet
  EXPECT_TRUE(same_path(tmp.file("link") + "/x.bin", d + "/x.bin"));  // through a symbolic link
  EXPECT_FALSE(same_path(d + "/x.bin", d + "/y.bin"));
  EXPECT_TRUE(lies_inside(d + "/sub/new/log.jsonl", d + "/"));
  EXPECT_TRUE(lies_inside(tmp.file("link") + "/log.jsonl", d));
  EXPECT_FALSE(lies_inside(d, d));
  EXPECT_FALSE(lies_inside(tmp.file("dx"), d));  // a sibling, not a child
  EXPECT_FALSE(lies_inside(d, d + "/sub"));
}

}  // namespace
}  // namespace mw::train
