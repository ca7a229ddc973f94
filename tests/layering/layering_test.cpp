// The layering of docs/architecture.md, checked against the code. The table under "## The layers"
// is the source of truth: one row per folder of src/ with the targets it links. These tests fail
// when a source file includes a header of a folder outside its row's closure (the folders it links,
// and what they link, transitively), when a folder's CMakeLists.txt links anything but its row,
// when a row links a folder above it, or when a folder of src/ is missing from the table. Known
// exceptions are listed below, each with its reason and the files it covers. The checker itself is
// tested on small made-up inputs, so that a checker which finds nothing cannot pass unnoticed.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct Layer {
  std::string folder;              // under src/, e.g. "offload/io"
  std::string target;              // CMake target, e.g. "mw_io"
  std::vector<std::string> links;  // folders it links directly
};

// An include the table does not allow, accepted for the files whose path (under src/) starts with
// file_prefix. Each one is a debt: the reason says what would remove it.
struct Exception {
  std::string file_prefix;
  std::string included_folder;
  const char* reason;
};

// None today. (The last, the memory plan's include of offload/gemini from models/gpt2, ended when
// the plan moved to train/, above both.)
const std::vector<Exception> kKnownExceptions = {};

struct Include {
  std::string file;    // path under src/
  int line = 0;        // 1-based
  std::string header;  // as written between the quotes
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<std::string> backticked(const std::string& cell) {
  std::vector<std::string> out;
  static const std::regex word("`([^`]+)`");
  for (std::sregex_iterator it(cell.begin(), cell.end(), word), end; it != end; ++it) {
    out.push_back((*it)[1]);
  }
  return out;
}

// The rows of the first table after the "## The layers" heading, in order (bottom up).
std::vector<Layer> parse_layer_table(const std::string& markdown) {
  std::vector<Layer> layers;
  const auto section = markdown.find("## The layers");
  if (section == std::string::npos) return layers;
  std::istringstream in(markdown.substr(section));
  std::string line;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (line.rfind("|", 0) != 0) {
      if (in_table) break;
      continue;
    }
    in_table = true;
    std::vector<std::string> cells;
    std::stringstream row(line.substr(1));
    std::string cell;
    while (std::getline(row, cell, '|')) cells.push_back(trim(cell));
    if (cells.size() < 4) continue;
    const auto folder = backticked(cells[0]);
    const auto target = backticked(cells[1]);
    if (folder.size() != 1 || target.size() != 1) continue;  // header and separator rows
    layers.push_back({folder[0], target[0], backticked(cells[3])});
  }
  return layers;
}

// Folder -> CMake targets it links, read from each src/**/CMakeLists.txt's mw_library(...) call.
std::map<std::string, std::vector<std::string>> read_cmake_links(const fs::path& src) {
  std::map<std::string, std::vector<std::string>> links;
  static const std::regex call(R"(mw_library\(\s*(\w+)\s+\S+([^)]*)\))");
  for (const auto& entry : fs::recursive_directory_iterator(src)) {
    if (entry.path().filename() != "CMakeLists.txt") continue;
    const std::string text = read_text(entry.path());
    std::smatch m;
    if (!std::regex_search(text, m, call)) continue;
    const std::string folder = fs::relative(entry.path().parent_path(), src).generic_string();
    std::istringstream deps(m[2].str());
    std::vector<std::string> targets = {m[1].str()};  // the target itself comes first
    for (std::string dep; deps >> dep;) {
      if (dep.rfind("mw_", 0) == 0) targets.push_back(dep);
    }
    links[folder] = targets;
  }
  return links;
}

std::vector<Include> scan_includes(const fs::path& src) {
  std::vector<Include> out;
  static const std::regex directive(R"(^\s*#\s*include\s*"([^"]+)\")");
  for (const auto& entry : fs::recursive_directory_iterator(src)) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".h" && ext != ".cpp" && ext != ".cu" && ext != ".cuh") continue;
    const std::string file = fs::relative(entry.path(), src).generic_string();
    std::istringstream in(read_text(entry.path()));
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      std::smatch m;
      if (std::regex_search(line, m, directive)) out.push_back({file, n, m[1].str()});
    }
  }
  return out;
}

// The table folder that owns a path under src/: the longest folder that is a prefix of it.
std::string owner(const std::vector<Layer>& layers, const std::string& path) {
  std::string best;
  for (const auto& l : layers) {
    if (path.rfind(l.folder + "/", 0) == 0 && l.folder.size() > best.size()) best = l.folder;
  }
  return best;
}

std::set<std::string> closure(const std::vector<Layer>& layers, const std::string& folder) {
  std::map<std::string, const Layer*> by_folder;
  for (const auto& l : layers) by_folder[l.folder] = &l;
  std::set<std::string> seen = {folder};
  std::vector<std::string> todo = {folder};
  while (!todo.empty()) {
    const std::string f = todo.back();
    todo.pop_back();
    if (!by_folder.count(f)) continue;
    for (const auto& dep : by_folder[f]->links) {
      if (seen.insert(dep).second) todo.push_back(dep);
    }
  }
  return seen;
}

std::string join(const std::set<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : ", ") + i;
  return s;
}

bool excepted(const Include& inc, const std::string& included_folder,
              const std::vector<Exception>& exceptions) {
  return std::any_of(exceptions.begin(), exceptions.end(), [&](const Exception& e) {
    return inc.file.rfind(e.file_prefix, 0) == 0 && included_folder == e.included_folder;
  });
}

// One message per include the table forbids, saying what was found and what to do.
std::vector<std::string> check_includes(
    const std::vector<Layer>& layers, const std::vector<Include>& includes,
    const std::vector<Exception>& exceptions = kKnownExceptions) {
  std::vector<std::string> problems;
  for (const auto& inc : includes) {
    const std::string from = owner(layers, inc.file);
    const auto where =
        "src/" + inc.file + ":" + std::to_string(inc.line) + " includes \"" + inc.header + "\"";
    if (from.empty()) {
      problems.push_back("src/" + inc.file + " is in no folder of the layering table");
      continue;
    }
    if (inc.header.find('/') == std::string::npos || inc.header.rfind("../", 0) == 0) {
      problems.push_back(where + ": include headers by their path under src/ (\"" + from +
                         "/...\") so that the layering can be checked");
      continue;
    }
    const std::string to = owner(layers, inc.header);
    if (to.empty()) {
      problems.push_back(where + ", which is in no folder of the layering table");
      continue;
    }
    const auto allowed = closure(layers, from);
    if (allowed.count(to) || excepted(inc, to, exceptions)) continue;
    problems.push_back(where + " (folder " + to + "), but " + from + " may include only " +
                       join(allowed) + ". Move the code down, or change the layering table " +
                       "in docs/architecture.md and src/" + from + "/CMakeLists.txt together");
  }
  return problems;
}

// Each row may link only rows above it in the table (folders lower in the stack), so the table is
// ordered bottom up and has no cycle.
std::vector<std::string> check_order(const std::vector<Layer>& layers) {
  std::vector<std::string> problems;
  std::set<std::string> below;
  for (const auto& l : layers) {
    for (const auto& dep : l.links) {
      if (!below.count(dep)) {
        problems.push_back(l.folder + " links " + dep + ", which is not listed before it");
      }
    }
    below.insert(l.folder);
  }
  return problems;
}

fs::path source_dir() { return fs::path(MW_SOURCE_DIR); }

std::vector<Layer> repo_layers() {
  return parse_layer_table(read_text(source_dir() / "docs" / "architecture.md"));
}

std::string lines(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += "\n  " + i;
  return s;
}

TEST(Layering, TheDocumentsTableParsesIntoEveryLibrary) {
  const auto layers = repo_layers();
  ASSERT_GE(layers.size(), 9u) << "the table under '## The layers' of docs/architecture.md";
  EXPECT_EQ(layers.front().folder, "core");
  EXPECT_TRUE(layers.front().links.empty());
  EXPECT_TRUE(check_order(layers).empty()) << lines(check_order(layers));
}

TEST(Layering, NoSourceFileIncludesAboveItsLayer) {
  const auto layers = repo_layers();
  const auto includes = scan_includes(source_dir() / "src");
  ASSERT_GT(includes.size(), 200u) << "the scan found too few includes to be reading src/";
  const auto problems = check_includes(layers, includes);
  EXPECT_TRUE(problems.empty()) << problems.size()
                                << " include(s) break the layering:" << lines(problems);
}

TEST(Layering, EachCMakeListsLinksExactlyItsRow) {
  const auto layers = repo_layers();
  const auto cmake = read_cmake_links(source_dir() / "src");
  std::map<std::string, std::string> target_of;
  for (const auto& l : layers) target_of[l.folder] = l.target;
  std::map<std::string, std::string> folder_of_target;
  for (const auto& [folder, targets] : cmake) folder_of_target[targets.front()] = folder;
  EXPECT_EQ(cmake.size(), layers.size()) << "src/ has a mw_library folder the table lacks, or the "
                                            "table has a row with no mw_library";
  for (const auto& l : layers) {
    ASSERT_TRUE(cmake.count(l.folder)) << "src/" << l.folder << "/CMakeLists.txt has no mw_library";
    const auto& targets = cmake.at(l.folder);
    EXPECT_EQ(targets.front(), l.target) << "src/" << l.folder << "/CMakeLists.txt";
    std::set<std::string> linked;
    for (size_t i = 1; i < targets.size(); ++i) linked.insert(folder_of_target[targets[i]]);
    std::set<std::string> expected(l.links.begin(), l.links.end());
    for (const auto& e : kKnownExceptions) {
      if (e.file_prefix.rfind(l.folder + "/", 0) == 0) expected.insert(e.included_folder);
    }
    EXPECT_EQ(linked, expected) << "src/" << l.folder << "/CMakeLists.txt links {" << join(linked)
                                << "}, the table in docs/architecture.md (with the known "
                                   "exceptions of this test) says {"
                                << join(expected) << "}";
  }
}

// The checker on made-up inputs: each forbidden include must be reported.
std::vector<Layer> toy_layers() {
  return parse_layer_table(
      "## The layers\n\n| folder | target | what | links |\n|---|---|---|---|\n"
      "| `core` | `mw_core` | base | (none) |\n"
      "| `autograd` | `mw_autograd` | graph | `core` |\n"
      "| `optim` | `mw_optim` | Adam | `autograd` |\n"
      "| `models/gpt2` | `mw_gpt2` | model | `autograd` |\n"
      "| `offload/gemini` | `mw_gemini` | chunks | `optim` |\n\nAfter the table.\n| `x` | `y` |");
}

TEST(Layering, CheckerParsesRowsInOrder) {
  const auto layers = toy_layers();
  ASSERT_EQ(layers.size(), 5u);
  EXPECT_EQ(layers[3].folder, "models/gpt2");
  EXPECT_EQ(layers[3].target, "mw_gpt2");
  EXPECT_EQ(layers[4].links, std::vector<std::string>{"optim"});
  EXPECT_EQ(closure(layers, "offload/gemini"),
            (std::set<std::string>{"offload/gemini", "optim", "autograd", "core"}));
}

TEST(Layering, CheckerReportsAnUpwardInclude) {
  const auto layers = toy_layers();
  const std::vector<Include> ok = {{"optim/adam.cpp", 3, "core/tensor.h"},
                                   {"optim/adam.cpp", 4, "optim/adam.h"},
                                   {"offload/gemini/chunk.cpp", 5, "core/tensor.h"}};
  EXPECT_TRUE(check_includes(layers, ok).empty()) << lines(check_includes(layers, ok));
  const std::vector<Include> upward = {{"core/tensor.cpp", 7, "optim/adam_math.h"}};
  const auto problems = check_includes(layers, upward);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("src/core/tensor.cpp:7"), std::string::npos) << problems[0];
  EXPECT_NE(problems[0].find("may include only core"), std::string::npos) << problems[0];
  // A sibling is not below: optim and models/gpt2 both sit on autograd.
  EXPECT_EQ(check_includes(layers, {{"optim/x.cpp", 1, "models/gpt2/spec.h"}}).size(), 1u);
  // A header named without its folder cannot be checked, so it is refused.
  EXPECT_EQ(check_includes(layers, {{"optim/x.cpp", 1, "adam.h"}}).size(), 1u);
}

TEST(Layering, KnownExceptionCoversOnlyItsFiles) {
  const auto layers = toy_layers();
  const std::vector<Exception> toy = {{"models/gpt2/memory_plan.", "offload/gemini", "a toy"}};
  EXPECT_TRUE(
      check_includes(layers, {{"models/gpt2/memory_plan.h", 2, "offload/gemini/gemini.h"}}, toy)
          .empty());
  EXPECT_EQ(
      check_includes(layers, {{"models/gpt2/model.cpp", 2, "offload/gemini/gemini.h"}}, toy).size(),
      1u);
  EXPECT_EQ(
      check_includes(layers, {{"models/gpt2/memory_plan.h", 2, "offload/gemini/gemini.h"}}).size(),
      1u);  // without the exception
}

TEST(Layering, CheckerReportsATableOutOfOrder) {
  auto layers = toy_layers();
  std::swap(layers[0], layers[1]);  // autograd before the core it links
  EXPECT_EQ(check_order(layers).size(), 1u);
}

}  // namespace
