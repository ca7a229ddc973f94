// The scanner behind room_size_test.cpp: file lengths, and where each function of a C++ or Python
// file starts and ends. It is a heuristic, not a parser, tuned to this repository's clang-format
// style and tested on made-up inputs in room_size_test.cpp:
//  - C++: comments and string/character literals (raw strings included) are blanked first; a `{`
//    opens a function when the text since the previous `;`, `{` or `}` holds a `(` and no `=`
//    outside parentheses (so `x = {...}` tables and namespace-scope lambdas are data), a
//    namespace/class/struct/union/enum scope is entered, and anything else (brace initialisers,
//    a constructor's `member{x}` initialisers) is skipped whole. A function's length runs from
//    the first line of its signature to its closing brace; lambdas and nested blocks count toward
//    the function that holds them. TEST(...) bodies are functions.
//  - Python: a `def` runs to the last non-blank line before the next line indented no deeper.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <vector>

namespace room_size {

struct Function {
  std::string name;                   // as written: `Class::method`, `TEST(Suite, Name)`
  int first_line = 0, last_line = 0;  // 1-based, the signature's first line to the closing brace
  int lines() const { return last_line - first_line + 1; }
};

inline int count_lines(const std::string& text) {
  if (text.empty()) return 0;
  const auto n = std::count(text.begin(), text.end(), '\n');
  return static_cast<int>(n) + (text.back() == '\n' ? 0 : 1);
}

inline bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Skips a literal starting at the quote at i (of kind `quote`); returns the index of its closing
// quote. Blanks what lies between.
inline size_t blank_literal(std::string& s, size_t i, char quote) {
  size_t j = i + 1;
  for (; j < s.size() && s[j] != quote && s[j] != '\n'; ++j) {
    if (s[j] == '\\' && j + 1 < s.size()) s[j++] = ' ';
    s[j] = ' ';
  }
  return j;
}

// A raw string R"delim(...)delim" whose quote is at i; returns the index of its closing quote.
inline size_t blank_raw_string(std::string& s, size_t i) {
  const size_t paren = s.find('(', i);
  if (paren == std::string::npos) return s.size();
  std::string close(1, ')');  // not ")" + ...: GCC 12 -Wrestrict false positive
  close += s.substr(i + 1, paren - i - 1);
  close += '"';
  const size_t end = s.find(close, paren);
  const size_t stop = end == std::string::npos ? s.size() : end + close.size() - 1;
  for (size_t j = i + 1; j < stop; ++j)
    if (s[j] != '\n') s[j] = ' ';
  return stop;
}

// Comments and literals become spaces; newlines stay, so positions keep their lines.
inline std::string blank_comments_and_literals(std::string s) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 2, "//") == 0) {
      for (; i < s.size() && s[i] != '\n'; ++i) s[i] = ' ';
    } else if (s.compare(i, 2, "/*") == 0) {
      const size_t end = std::min(s.find("*/", i + 2), s.size() - 2);
      for (size_t j = i; j < end + 2; ++j)
        if (s[j] != '\n') s[j] = ' ';
      i = end + 1;
    } else if (s[i] == '"' && i > 0 && s[i - 1] == 'R' &&
               (i < 2 || !ident_char(s[i - 2]) || s[i - 2] == '8' || s[i - 2] == 'L')) {
      i = blank_raw_string(s, i);
    } else if (s[i] == '"') {
      i = blank_literal(s, i, '"');
    } else if (s[i] == '\'' && !(i > 0 && std::isxdigit(static_cast<unsigned char>(s[i - 1])))) {
      i = blank_literal(s, i, '\'');  // not a digit separator (1'000)
    }
  }
  return s;
}

// The index of the bracket closing the one at `open` (same kind), or s.size().
inline size_t match_close(const std::string& s, size_t open) {
  const char o = s[open], c = o == '{' ? '}' : o == '(' ? ')' : ']';
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == o) ++depth;
    if (s[i] == c && --depth == 0) return i;
  }
  return s.size();
}

enum class BraceKind { kScope, kFunction, kMemberInit, kData };

inline bool has_word(const std::string& text, const std::string& word) {
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    const bool left = at == 0 || !ident_char(text[at - 1]);
    const bool right = at + word.size() >= text.size() || !ident_char(text[at + word.size()]);
    if (left && right) return true;
  }
  return false;
}

// What a `{` opens, from the text since the previous `;`, `{` or `}` at this level.
inline BraceKind classify(const std::string& header) {
  std::string top;  // the header outside parentheses
  int depth = 0;
  for (char c : header) {
    if (c == '(') ++depth;
    if (depth == 0) top += c;
    if (c == ')') --depth;
  }
  if (has_word(top, "namespace") || has_word(top, "extern")) return BraceKind::kScope;
  for (const char* word : {"class", "struct", "union", "enum"})
    if (has_word(top, word) && header.find('(') == std::string::npos) return BraceKind::kScope;
  if (header.find('(') == std::string::npos) return BraceKind::kData;
  for (size_t at = top.find('='); at != std::string::npos; at = top.find('=', at + 1)) {
    const bool comparison =
        (at > 0 && std::string("=!<>").find(top[at - 1]) != std::string::npos) ||
        (at + 1 < top.size() && top[at + 1] == '=');
    const bool assignment_operator = at >= 8 && top.compare(at - 8, 8, "operator") == 0;
    if (!comparison && !assignment_operator) return BraceKind::kData;
  }
  bool single_colon = false;  // a constructor's initialiser list, not `Class::`
  for (size_t at = 0; at < top.size(); ++at)
    single_colon |= top[at] == ':' && (at == 0 || top[at - 1] != ':') &&
                    (at + 1 == top.size() || top[at + 1] != ':');
  const size_t end = header.find_last_not_of(" \t\n");
  const bool after_init_list = single_colon && ident_char(header[end]) &&
                               !has_word(header.substr(header.rfind(')') + 1), "const") &&
                               !has_word(header.substr(header.rfind(')') + 1), "override") &&
                               !has_word(header.substr(header.rfind(')') + 1), "noexcept");
  return after_init_list ? BraceKind::kMemberInit : BraceKind::kFunction;
}

// `Class::method`, or the whole macro call for an all-capitals name (TEST(Suite, Name)).
inline std::string function_name(const std::string& header) {
  const size_t paren = header.find('(');
  const size_t op = header.rfind("operator", paren);
  if (op != std::string::npos && op + 8 < paren && !ident_char(header[op + 8])) {
    std::string symbol;
    for (size_t i = op + 8; i < paren; ++i)
      if (header[i] != ' ') symbol += header[i];
    return "operator" + symbol;
  }
  size_t b = paren;
  while (b > 0 && (ident_char(header[b - 1]) || header[b - 1] == ':' || header[b - 1] == '~')) --b;
  std::string name = header.substr(b, paren - b);
  const bool macro = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isupper(static_cast<unsigned char>(c)) || c == '_';
  });
  if (macro) {
    const size_t close = match_close(header, paren);
    name = header.substr(b, std::min(close, header.size() - 1) - b + 1);
  }
  return name.empty() ? "(operator)" : name;
}

// Preprocessor lines (with their continuations) become spaces: a macro's braces are not code.
inline std::string blank_preprocessor(std::string s) {
  bool line_start = true, in_directive = false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n') {
      in_directive = in_directive && i > 0 && s[i - 1] == '\\';
      line_start = true;
      continue;
    }
    if (line_start && s[i] == '#') in_directive = true;
    if (s[i] != ' ' && s[i] != '\t') line_start = false;
    if (in_directive && s[i] != '\\') s[i] = ' ';
  }
  return s;
}

inline std::vector<Function> cpp_functions(const std::string& source) {
  const std::string s = blank_preprocessor(blank_comments_and_literals(source));
  std::vector<int> line_of(s.size() + 1, 1);
  for (size_t i = 1; i <= s.size(); ++i) line_of[i] = line_of[i - 1] + (s[i - 1] == '\n');
  std::vector<Function> out;
  size_t header_start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == ';' || s[i] == '}') header_start = i + 1;
    if (s[i] != '{') continue;
    const std::string header = s.substr(header_start, i - header_start);
    const BraceKind kind = classify(header);
    if (kind == BraceKind::kScope) {
      header_start = i + 1;
      continue;
    }
    const size_t close = match_close(s, i);
    if (kind == BraceKind::kFunction) {
      const size_t first = s.find_first_not_of(" \t\n", header_start);
      out.push_back({function_name(header), line_of[first], line_of[std::min(close, s.size())]});
    }
    i = std::min(close, s.size() - 1);
    if (kind != BraceKind::kMemberInit) header_start = i + 1;
  }
  return out;
}

inline int indent_of(const std::string& line) {
  return static_cast<int>(line.find_first_not_of(' '));
}

inline std::vector<Function> python_functions(const std::string& source) {
  std::vector<std::string> lines;
  size_t at = 0;
  while (at <= source.size()) {
    const size_t nl = std::min(source.find('\n', at), source.size());
    lines.push_back(source.substr(at, nl - at));
    at = nl + 1;
  }
  std::vector<Function> out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const int indent = indent_of(lines[i]);
    if (indent < 0 || lines[i].compare(static_cast<size_t>(indent), 4, "def ") != 0) continue;
    const size_t name_end = lines[i].find('(', static_cast<size_t>(indent));
    Function f{lines[i].substr(static_cast<size_t>(indent) + 4, name_end - indent - 4),
               static_cast<int>(i) + 1, static_cast<int>(i) + 1};
    for (size_t j = i + 1; j < lines.size(); ++j) {
      const int in = indent_of(lines[j]);
      if (in < 0) continue;  // blank
      if (in <= indent && lines[j][static_cast<size_t>(in)] != ')') break;
      f.last_line = static_cast<int>(j) + 1;
    }
    out.push_back(f);
  }
  return out;
}

}  // namespace room_size
