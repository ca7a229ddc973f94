// GPT-2's pre-tokenisation, hand-written (std::regex has no \p{...}): splits text into the pieces
// that the regex
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// finds with Python's `regex` module (GPT-2's encoder.py) or Oniguruma (HF tokenizers' ByteLevel).
//
// Invariants (Note [Pre-tokenizer classes]):
// - Text is UTF-8 bytes. A byte that does not start a valid UTF-8 sequence (strict: no overlongs,
// no
//   surrogates, nothing above U+10FFFF) is one code point of its own of class Other, and decoding
//   resumes at the next byte. So any byte string splits, nothing is dropped, and the pieces
//   concatenate to exactly the input.
// - Classes come from unicode_tables.h (generated from Python's unicodedata, see its header):
//   Letter = \p{L}, Number = \p{N}, Space = \s (White_Space), Other = everything else.
// - Contractions are matched case-sensitively, as in GPT-2: "DON'T" gives "DON", "'", "T".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/unicode_tables.h"

namespace mw::data {

struct Utf8Char {
  uint32_t code_point;   // the byte itself when !valid
  int32_t length_bytes;  // 1..4; 1 when !valid
  bool valid;
};

// Decodes the UTF-8 character that starts at text[pos] (pos < text.size()).
Utf8Char decode_utf8(std::string_view text, size_t pos);

// The regex class of a code point (Other for an invalid byte: see decode_utf8).
unicode::CharClass char_class(uint32_t code_point);

// Walks the pieces of a text in order without copying: `while (p.next(piece)) ...`.
class Pretokenizer {
 public:
  explicit Pretokenizer(std::string_view text) : text_(text) {}
  // Sets piece to the next piece (a view into the text) and returns true; false at the end.
  bool next(std::string_view& piece);

 private:
  struct Char {
    unicode::CharClass cls;
    uint32_t code_point;
    int32_t length_bytes;
  };
  Char char_at(size_t pos) const;
  size_t end_of_run(size_t pos, unicode::CharClass cls) const;
  size_t whitespace_piece_end(size_t pos) const;

  std::string_view text_;
  size_t pos_ = 0;
};

// All pieces of a text (views into it).
std::vector<std::string_view> pretokenize(std::string_view text);

}  // namespace mw::data
