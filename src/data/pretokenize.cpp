// GPT-2's pre-tokenizer regex as a hand-written matcher; see pretokenize.h and
// Note [Pre-tokenizer classes]. The alternatives are tried in the regex's order at each position.
#include "data/pretokenize.h"

#include <algorithm>
#include <array>

namespace mw::data {

using unicode::CharClass;

namespace {

bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// The ASCII classes, looked up without a search.
std::array<CharClass, 128> make_ascii_classes() {
  std::array<CharClass, 128> table{};
  for (uint32_t c = 0; c < 128; ++c) {
    table[c] = CharClass::Other;
    for (const auto& r : unicode::kClassRanges)
      if (c >= r.first && c <= r.last) table[c] = r.cls;
  }
  return table;
}
const std::array<CharClass, 128> kAsciiClasses = make_ascii_classes();

}  // namespace

Utf8Char decode_utf8(std::string_view text, size_t pos) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  const uint8_t b0 = s[pos];
  const Utf8Char invalid{b0, 1, false};
  if (b0 < 0x80) return {b0, 1, true};
  int32_t length = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return invalid;
  }
  if (pos + length > n || s[pos + 1] < lo || s[pos + 1] > hi) return invalid;
  uint32_t cp = b0 & (0x7F >> length);
  for (int32_t i = 1; i < length; ++i) {
    if (!is_continuation(s[pos + i])) return invalid;
    cp = (cp << 6) | (s[pos + i] & 0x3F);
  }
  return {cp, length, true};
}

CharClass char_class(uint32_t code_point) {
  if (code_point < 128) return kAsciiClasses[code_point];
  const auto* begin = std::begin(unicode::kClassRanges);
  const auto* end = std::end(unicode::kClassRanges);
  // The first range whose last code point is >= code_point.
  const auto* it =
      std::lower_bound(begin, end, code_point,
                       [](const unicode::ClassRange& r, uint32_t cp) { return r.last < cp; });
  return (it != end && it->first <= code_point) ? it->cls : CharClass::Other;
}

Pretokenizer::Char Pretokenizer::char_at(size_t pos) const {
  const Utf8Char c = decode_utf8(text_, pos);
  return {c.valid ? char_class(c.code_point) : CharClass::Other, c.code_point, c.length_bytes};
}

size_t Pretokenizer::end_of_run(size_t pos, CharClass cls) const {
  while (pos < text_.size()) {
    const Char c = char_at(pos);
    if (c.cls != cls) break;
    pos += c.length_bytes;
  }
  return pos;
}

// `\s+(?!\S)|\s+` at a whitespace character: the whole run when it ends the text; otherwise the
// run less its last character (which then leads the next piece, " word"), or the single
// character when the run is one character long.
size_t Pretokenizer::whitespace_piece_end(size_t pos) const {
  size_t last_start = pos, end = pos;
  while (end < text_.size()) {
    const Char c = char_at(end);
    if (c.cls != CharClass::Space) break;
    last_start = end;
    end += c.length_bytes;
  }
  if (end == text_.size() || last_start == pos) return end;
  return last_start;
}

bool Pretokenizer::next(std::string_view& piece) {
  const size_t n = text_.size();
  if (pos_ >= n) return false;
  const size_t start = pos_;
  const char c0 = text_[start];
  size_t end = 0;
  // 's|'t|'re|'ve|'m|'ll|'d
  if (c0 == '\'' && start + 1 < n) {
    const char c1 = text_[start + 1];
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
      end = start + 2;
    } else if (start + 2 < n) {
      const std::string_view two = text_.substr(start + 1, 2);
      if (two == "re" || two == "ve" || two == "ll") end = start + 3;
    }
  }
  if (end == 0) {
    // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: an optional space, then a run of one class.
    const size_t body = (c0 == ' ' && start + 1 < n) ? start + 1 : start;
    const CharClass cls = char_at(body).cls;
    if (cls != CharClass::Space)
      end = end_of_run(body, cls);
    else
      end = whitespace_piece_end(start);
  }
  piece = text_.substr(start, end - start);
  pos_ = end;
  return true;
}

std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  Pretokenizer p(text);
  for (std::string_view piece; p.next(piece);) pieces.push_back(piece);
  return pieces;
}

}  // namespace mw::data
