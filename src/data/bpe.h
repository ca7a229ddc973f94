// GPT-2's byte-level BPE tokenizer: HF vocab.json + merges.txt (or tokenizer.json) in, token ids
// out, and back.
//
// Invariants:
// - Note [Byte-level tokens]: every token is a string of "byte characters": GPT-2's
//   bytes_to_unicode() maps each of the 256 byte values to one printable code point (the printable
//   Latin-1 bytes to themselves, the others to U+0100..U+0143), so any byte string, valid UTF-8 or
//   not, is a string of byte characters. The vocabulary must hold all 256 single-byte tokens; so
//   encode() never needs an unknown token and decode(encode(x)) == x for every byte string x.
// - encode() = pre-tokenise (pretokenize.h) then, per piece, BPE with the merge ranks: the adjacent
//   pair of lowest rank is merged first, leftmost first on ties (HF tokenizers' order; equal to
//   GPT-2's encoder.py for merge lists learned in order). Text is ordinary text: a literal
//   "<|endoftext|>" in it is encoded as characters, not as the special token (tiktoken's
//   encode_ordinary); documents are separated by adding eot_id() explicitly (CorpusReader ends a
//   document at a marker, and encode_prompt() makes one the token).
// - Every merge's two halves and its result are in the vocabulary (FormatError at load otherwise).
// - Ids are those of the vocabulary file; they need not be dense, but decode() of an id that names
//   no token is an InvalidArgument.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mw::data {

inline constexpr const char* kEndOfText = "<|endoftext|>";

// Note [Byte-level tokens]: the byte character of byte b, UTF-8 encoded.
const std::string& byte_to_token_char(uint8_t b);
// A byte string written in byte characters, and back (nullopt when `chars` holds a character that
// is not a byte character).
std::string bytes_to_token_chars(std::string_view bytes);
std::optional<std::string> token_chars_to_bytes(std::string_view chars);

// A BPE vocabulary and merge list as the files hold them (byte-character strings).
struct BpeModel {
  std::vector<std::pair<std::string, int32_t>> vocab;       // token -> id, in file order
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  // Note [Added tokens]: a tokenizer.json's added_tokens other than <|endoftext|> (text -> id),
  // matched in the text before pre-tokenisation, as HF's tokenizer does.
  std::vector<std::pair<std::string, int32_t>> added;
};

// HF's GPT-2 files. Errors name the file and line (or key) and say what was expected.
BpeModel load_vocab_and_merges(const std::string& vocab_json_path,
                               const std::string& merges_txt_path);
// HF tokenizer.json with a "BPE" model (merges as "a b" strings or [a, b] pairs); added_tokens
// join the vocabulary and are matched in text (Note [Added tokens]). What would make HF's ids
// differ is refused: a pre_tokenizer other than ByteLevel with its regex, a normalizer, an added
// token with lstrip, rstrip or single_word, or holding ASCII whitespace.
BpeModel load_tokenizer_json(const std::string& path);
// The added tokens of a slow tokenizer's added_tokens.json ({"<|sep|>": 50257}), which HF's
// GPT2Tokenizer matches as tokenizer.json's (Note [Added tokens]), into `model`.
void add_added_tokens_json(BpeModel& model, const std::string& path);
// Writes vocab.json (ids in order) and merges.txt ("#version: 0.2" then "a b" lines), atomically.
void save_vocab_and_merges(const BpeModel& model, const std::string& vocab_json_path,
                           const std::string& merges_txt_path);

// encode() caches pieces, so one BpeTokenizer must not encode on two threads at once; decode() and
// the lookups are const and may.
class BpeTokenizer {
 public:
  // Vocabularies are dense tables of ids; a larger id is a corrupt file, not a vocabulary.
  static constexpr int32_t kMaxTokenId = 1 << 24;

  // `source` names the files in error messages.
  BpeTokenizer(const BpeModel& model, const std::string& source);

  // Appends the ids of `text` to out: its added tokens (Note [Added tokens]) matched first, the
  // text between them pre-tokenised and merged.
  void encode(std::string_view text, std::vector<int32_t>& out);
  std::vector<int32_t> encode(std::string_view text);
  // A prompt's ids: its literal "<|endoftext|>" markers are eot_id(), as they are in a corpus
  // (Note [End-of-text markers], corpus.h), and the text between them is encoded.
  std::vector<int32_t> encode_prompt(std::string_view text);
  // The bytes of the tokens, concatenated. InvalidArgument naming an id that is no token.
  std::string decode(const std::vector<int32_t>& ids) const;
  // The bytes of one token (InvalidArgument as above).
  const std::string& token_bytes(int32_t id) const;

  // The id of a token written in byte characters ("Ġthe", "<|endoftext|>"), if any.
  std::optional<int32_t> token_id(std::string_view token) const;
  // The id of "<|endoftext|>": FormatError naming the source when the vocabulary lacks it.
  int32_t eot_id() const;
  // One more than the largest id.
  int64_t vocab_size() const { return static_cast<int64_t>(id_to_bytes_.size()); }
  const std::string& source() const { return source_; }  // the files, as errors name them
  int64_t num_merges() const { return static_cast<int64_t>(merge_of_pair_.size()); }
  // What the ids mean: FNV-1a (64 bits) over each id's presence, length and bytes, in id order.
  // Equal for one vocabulary from vocab.json or tokenizer.json (Note [Shard tokenizer stamp]).
  uint64_t fingerprint() const;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void encode_piece(std::string_view piece, std::vector<int32_t>& out);
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out);
  void merge_symbols(std::vector<int32_t>& symbols) const;

  std::string source_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> token_to_id_;
  std::vector<std::string> id_to_bytes_;
  std::vector<bool> id_present_;
  int32_t byte_id_[256];
  std::vector<std::pair<std::string, int32_t>> added_;  // Note [Added tokens], longest first
  std::unordered_map<uint64_t, Merge> merge_of_pair_;
  // Pieces seen before -> their ids. Cleared when it reaches kMaxCacheEntries, so memory stays
  // bounded on any corpus.
  static constexpr size_t kMaxCacheEntries = 1 << 18;
  static constexpr size_t kMaxCachedPieceBytes = 64;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace mw::data
