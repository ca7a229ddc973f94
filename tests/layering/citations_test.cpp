// Docs and comments cite only what is in the repository: the facts from other systems live in
// docs/references.md, and no file points at the project's private notes (REFERENCES.md), which a
// reader of the repository cannot open.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

std::vector<std::string> files_citing(const std::string& needle) {
  const fs::path root(MW_SOURCE_DIR);
  std::vector<fs::path> files = {root / "README.md", root / "CMakeLists.txt"};
  for (const char* dir : {"src", "apps", "tools", "docs", "cmake", ".ci", "fuzz"}) {
    if (!fs::exists(root / dir)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      if (e.is_regular_file() && e.file_size() < (int64_t{4} << 20)) files.push_back(e.path());
    }
  }
  std::vector<std::string> hits;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    if (s.str().find(needle) != std::string::npos) {
      hits.push_back(fs::relative(f, root).generic_string());
    }
  }
  return hits;
}

TEST(Citations, NoFileCitesNotesOutsideTheRepository) {
  const auto hits = files_citing(
      "REFERENCES"
      ".md");
  std::string list;
  for (const auto& h : hits) list += "\n  " + h;
  EXPECT_TRUE(hits.empty()) << "these files cite REFERENCES.md, which is not in the repository; "
                               "cite docs/references.md and copy the fact there:"
                            << list;
}

TEST(Citations, TheReferencesPageExistsAndIsCited) {
  EXPECT_TRUE(fs::exists(fs::path(MW_SOURCE_DIR) / "docs" / "references.md"));
  EXPECT_GE(files_citing("docs/references.md").size(), 5u);
}

}  // namespace
