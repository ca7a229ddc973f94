// GPT-2's byte-level BPE: the byte characters, the HF file formats, and encode/decode. See bpe.h
// and Note [Byte-level tokens].
#include "data/bpe.h"

#include <algorithm>
#include <array>
#include <queue>
#include <sstream>
#include <unordered_set>

#include "core/error.h"
#include "data/file_io.h"
#include "data/json.h"
#include "data/pretokenize.h"

namespace mw::data {

namespace {

std::string utf8_encode(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {  // byte characters are all below U+0800
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order.
struct ByteChars {
  std::array<std::string, 256> of_byte;
  std::array<int16_t, 0x144> byte_of_code_point;  // -1: not a byte character
  ByteChars() {
    byte_of_code_point.fill(-1);
    uint32_t next_extra = 0x100;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? b : next_extra++;
      of_byte[b] = utf8_encode(cp);
      byte_of_code_point[cp] = static_cast<int16_t>(b);
    }
  }
};
const ByteChars& byte_chars() {
  static const ByteChars chars;
  return chars;
}

// What to pass instead, appended to every open or read failure of a tokenizer file.
constexpr const char* kTokenizerHint =
    "pass --tokenizer a HuggingFace tokenizer.json, or --vocab a GPT-2 vocab.json with --merges "
    "its merges.txt";

void add_vocab(BpeModel& model, const json::Value& vocab, const std::string& where) {
  MW_CHECK_T(FormatError, vocab.is_object(), where, ": expected an object {token: id}, found ",
             vocab.describe());
  for (int64_t i = 0; i < vocab.size(); ++i) {
    const json::Value& id = vocab.value(i);
    MW_CHECK_T(FormatError, id.is_integer() && id.as_int() >= 0 && id.as_int() < (1LL << 31), where,
               ": token \"", vocab.key(i), "\": expected a non-negative integer id, found ",
               id.describe());
    model.vocab.emplace_back(vocab.key(i), static_cast<int32_t>(id.as_int()));
  }
}

// "a b" -> {a, b}; nullopt unless exactly two non-empty halves separated by one space.
std::optional<std::pair<std::string, std::string>> split_merge(std::string_view line) {
  const size_t space = line.find(' ');
  if (space == 0 || space == std::string_view::npos || space + 1 >= line.size() ||
      line.find(' ', space + 1) != std::string_view::npos)
    return std::nullopt;
  return std::make_pair(std::string(line.substr(0, space)), std::string(line.substr(space + 1)));
}

}  // namespace

const std::string& byte_to_token_char(uint8_t b) { return byte_chars().of_byte[b]; }

std::string bytes_to_token_chars(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += byte_chars().of_byte[static_cast<uint8_t>(c)];
  return out;
}

std::optional<std::string> token_chars_to_bytes(std::string_view chars) {
  std::string out;
  for (size_t pos = 0; pos < chars.size();) {
    const Utf8Char c = decode_utf8(chars, pos);
    if (!c.valid || c.code_point >= byte_chars().byte_of_code_point.size()) return std::nullopt;
    const int16_t b = byte_chars().byte_of_code_point[c.code_point];
    if (b < 0) return std::nullopt;
    out += static_cast<char>(b);
    pos += c.length_bytes;
  }
  return out;
}

BpeModel load_vocab_and_merges(const std::string& vocab_json_path,
                               const std::string& merges_txt_path) {
  BpeModel model;
  const std::string vocab_text =
      read_text_file(vocab_json_path, "GPT-2 vocab.json", kTokenizerHint);
  // merges.txt given as --vocab (the two swapped) failed with a bare "invalid JSON ... found '#'".
  MW_CHECK_T(FormatError, vocab_text.rfind("#version", 0) != 0, vocab_json_path,
             " starts with \"#version\": it is a merges.txt, not a vocab.json; are --vocab and "
             "--merges swapped?");
  add_vocab(model, json::parse(vocab_text, vocab_json_path), vocab_json_path);
  std::istringstream merges(read_text_file(merges_txt_path, "GPT-2 merges.txt", kTokenizerHint));
  int64_t line_number = 0;
  for (std::string line; std::getline(merges, line);) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_number == 1 && line.rfind("#version", 0) == 0)) continue;
    auto merge = split_merge(line);
    MW_CHECK_T(FormatError, merge.has_value(), merges_txt_path, " line ", line_number,
               ": expected two tokens separated by one space (\"Ġ t\"), found \"", line, "\"");
    model.merges.push_back(std::move(*merge));
  }
  return model;
}

namespace {
// An added token (Note [Added tokens]): in the vocabulary and, but for <|endoftext|>, matched in
// text.
void add_token(BpeModel& model, const std::string& content, int64_t id, const std::string& path) {
  MW_CHECK_T(FormatError, id >= 0 && id <= BpeTokenizer::kMaxTokenId, path, ": added token \"",
             content, "\" has id ", id, "; expected 0 to ", BpeTokenizer::kMaxTokenId);
  model.vocab.emplace_back(content, static_cast<int32_t>(id));
  if (content == kEndOfText) return;  // a document boundary (Note [End-of-text markers])
  MW_CHECK_T(FormatError, !content.empty() && content.find_first_of(" \t\n\r") == std::string::npos,
             path, ": added token \"", content,
             "\" is empty or holds ASCII whitespace, which is not supported (a corpus is cut "
             "into chunks at whitespace and would split it)");
  model.added.emplace_back(content, static_cast<int32_t>(id));
}
}  // namespace

BpeModel load_tokenizer_json(const std::string& path) {
  const json::Value root =
      json::parse(read_text_file(path, "HuggingFace tokenizer.json", kTokenizerHint), path);
  MW_CHECK_T(FormatError, root.is_object() && root.contains("model"), path,
             ": expected a HuggingFace tokenizer.json (an object with a \"model\")");
  const json::Value& m = root.at("model");
  if (const json::Value* type = m.find("type"))
    MW_CHECK_T(FormatError, type->is_string() && type->as_string() == "BPE", path,
               ": model.type is ", type->describe(), "; only \"BPE\" (GPT-2) is supported");
  if (const json::Value* n = root.find("normalizer"); n && !n->is_null())
    throw FormatError(str(path, ": normalizer ", n->dump(),
                          " changes the text before HF's tokenizer encodes it, and is not "
                          "supported (a GPT-2 tokenizer.json has \"normalizer\": null): the ids "
                          "would differ from HF's; pass a GPT-2 byte-level BPE tokenizer"));
  if (const json::Value* pre = root.find("pre_tokenizer"); pre && !pre->is_null()) {
    MW_CHECK_T(FormatError,
               pre->is_object() && pre->contains("type") && pre->at("type").is_string() &&
                   pre->at("type").as_string() == "ByteLevel",
               path, ": pre_tokenizer must be ByteLevel (a GPT-2 byte-level BPE), found ",
               pre->dump());
    if (const json::Value* prefix = pre->find("add_prefix_space"))
      MW_CHECK_T(FormatError, !prefix->is_bool() || !prefix->as_bool(), path,
                 ": pre_tokenizer.add_prefix_space true is not supported (GPT-2 uses false)");
    if (const json::Value* regex = pre->find("use_regex"))
      MW_CHECK_T(
          FormatError, !regex->is_bool() || regex->as_bool(), path,
          ": pre_tokenizer.use_regex false is not supported (HF then does not split the "
          "text with GPT-2's regex, which is how this tokenizer splits it; GPT-2 uses true)");
  }
  BpeModel model;
  add_vocab(model, m.at("vocab"), path + " model.vocab");
  for (int64_t i = 0; i < m.at("merges").size(); ++i) {
    const json::Value& entry = m.at("merges").at(i);
    std::optional<std::pair<std::string, std::string>> merge;
    if (entry.is_string())
      merge = split_merge(entry.as_string());
    else if (entry.is_array() && entry.size() == 2 && entry.at(0).is_string() &&
             entry.at(1).is_string())
      merge = std::make_pair(entry.at(0).as_string(), entry.at(1).as_string());
    MW_CHECK_T(FormatError, merge.has_value(), path, " model.merges[", i,
               "]: expected \"a b\" or [\"a\", \"b\"], found ", entry.dump());
    model.merges.push_back(std::move(*merge));
  }
  if (const json::Value* added = root.find("added_tokens"); added && added->is_array())
    for (const json::Value& t : added->elements()) {
      const std::string content = t.get_string("content");
      for (const char* flag : {"lstrip", "rstrip", "single_word"})
        if (const json::Value* f = t.find(flag); f && content != kEndOfText)
          MW_CHECK_T(FormatError, !f->is_bool() || !f->as_bool(), path, ": added token \"", content,
                     "\" has ", flag, " true, which is not supported (HF then matches it ",
                     "with the whitespace around it or only as a whole word); set it to false");
      add_token(model, content, t.get_int("id"), path);
    }
  return model;
}

void add_added_tokens_json(BpeModel& model, const std::string& path) {
  const json::Value root =
      json::parse(read_text_file(path, "HuggingFace added_tokens.json", kTokenizerHint), path);
  MW_CHECK_T(FormatError, root.is_object(), path,
             ": expected an object of added tokens and their ids ({\"<|sep|>\": 50257})");
  for (int64_t i = 0; i < root.size(); ++i) {
    const std::string& content = root.key(i);
    const json::Value& id = root.value(i);
    MW_CHECK_T(FormatError, id.is_integer(), path, ": the id of added token \"", content, "\" is ",
               id.describe(), "; expected an integer");
    add_token(model, content, id.as_int(), path);
  }
}

void save_vocab_and_merges(const BpeModel& model, const std::string& vocab_json_path,
                           const std::string& merges_txt_path) {
  json::Value vocab = json::Value::object();
  for (const auto& [token, id] : model.vocab) vocab.set(token, json::Value(int64_t{id}));
  const std::string vocab_text = vocab.dump() + "\n";
  std::string merges_text = "#version: 0.2\n";
  for (const auto& [a, b] : model.merges) merges_text += a + " " + b + "\n";
  const std::string hint = "pass a writable output directory";
  write_file_atomically(vocab_json_path,
                        {{vocab_text.data(), static_cast<int64_t>(vocab_text.size())}}, hint);
  write_file_atomically(merges_txt_path,
                        {{merges_text.data(), static_cast<int64_t>(merges_text.size())}}, hint);
}

BpeTokenizer::BpeTokenizer(const BpeModel& model, const std::string& source) : source_(source) {
  std::unordered_set<int32_t> added_ids;  // Note [Added tokens]
  for (const auto& [content, id] : model.added) added_ids.insert(id);
  for (const auto& [token, id] : model.vocab) {
    MW_CHECK_T(FormatError, id >= 0 && id < kMaxTokenId, source_, ": token \"", token, "\" has id ",
               id, "; ids must be in [0, ", kMaxTokenId, ")");
    auto [it, inserted] = token_to_id_.emplace(token, id);
    MW_CHECK_T(FormatError, inserted || it->second == id, source_, ": token \"", token,
               "\" has two ids, ", it->second, " and ", id);
    if (static_cast<size_t>(id) >= id_to_bytes_.size()) {
      id_to_bytes_.resize(id + 1);
      id_present_.resize(id + 1, false);
    }
    // A token that is not made of byte characters (as "<|endoftext|>") decodes to its own text,
    // and so does an added token whatever it is made of: "<|né|>" is all characters of GPT-2's
    // byte map (é is byte 0xE9's), which decoded to the one byte E9 where its text is C3 A9, so
    // decode(encode(x)) was not x (HF's GPT2Tokenizer gives an added token its content).
    std::string bytes =
        added_ids.count(id) > 0 ? token : token_chars_to_bytes(token).value_or(token);
    MW_CHECK_T(FormatError, !id_present_[id] || id_to_bytes_[id] == bytes, source_, ": id ", id,
               " names two tokens");
    id_to_bytes_[id] = std::move(bytes);
    id_present_[id] = true;
  }
  for (int b = 0; b < 256; ++b) {
    auto id = token_id(byte_to_token_char(static_cast<uint8_t>(b)));
    MW_CHECK_T(FormatError, id.has_value(), source_, ": the vocabulary lacks the token of byte ", b,
               " (\"", byte_to_token_char(static_cast<uint8_t>(b)),
               "\"); a byte-level BPE vocabulary holds all 256 byte tokens");
    byte_id_[b] = *id;
  }
  for (size_t rank = 0; rank < model.merges.size(); ++rank) {
    const auto& [a, b] = model.merges[rank];
    const auto ia = token_id(a), ib = token_id(b), im = token_id(a + b);
    MW_CHECK_T(FormatError, ia && ib && im, source_, ": merge ", rank, " \"", a, " ", b,
               "\" uses a token that is not in the vocabulary (\"",
               !ia   ? a
               : !ib ? b
                     : a + b,
               "\")");
    // A repeated merge keeps its first (lowest) rank, as HF does.
    merge_of_pair_.emplace(pair_key(*ia, *ib), Merge{static_cast<int32_t>(rank), *im});
  }
  added_ = model.added;  // Note [Added tokens]
  std::stable_sort(added_.begin(), added_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

std::optional<int32_t> BpeTokenizer::token_id(std::string_view token) const {
  auto it = token_to_id_.find(token);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

int32_t BpeTokenizer::eot_id() const {
  auto id = token_id(kEndOfText);
  MW_CHECK_T(FormatError, id.has_value(), source_, ": the vocabulary has no \"", kEndOfText,
             "\" token; GPT-2 vocabularies end with it (id 50256)");
  return *id;
}

// Note [Byte-level tokens]: the piece's bytes start as single-byte tokens; the adjacent pair of
// lowest merge rank is merged until no pair has a rank. The live symbols form a linked list and
// the candidate pairs a min-heap on (rank, position), so a piece of n bytes costs O(n log n)
// (a megabyte-long run of '=' is no problem). A heap entry whose symbols changed since it was
// pushed is stale and skipped.
void BpeTokenizer::merge_symbols(std::vector<int32_t>& ids) const {
  const int32_t n = static_cast<int32_t>(ids.size());
  if (n < 2) return;
  std::vector<int32_t> prev(n), next(n);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank, pos, left_id, right_id, merged_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int32_t pos) {
    if (next[pos] < 0) return;
    auto it = merge_of_pair_.find(pair_key(ids[pos], ids[next[pos]]));
    if (it != merge_of_pair_.end())
      heap.push({it->second.rank, pos, ids[pos], ids[next[pos]], it->second.merged_id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> alive(n, true);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int32_t right = next[c.pos];
    if (!alive[c.pos] || right < 0 || ids[c.pos] != c.left_id || ids[right] != c.right_id) continue;
    ids[c.pos] = c.merged_id;
    alive[right] = false;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    if (prev[c.pos] >= 0) push(prev[c.pos]);
    push(c.pos);
  }
  int32_t kept = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) ids[kept++] = ids[i];
  ids.resize(kept);
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) {
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  if (cacheable) {
    if (auto it = cache_.find(piece); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) ids[i] = byte_id_[static_cast<uint8_t>(piece[i])];
  merge_symbols(ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(piece), std::move(ids));
  }
}

void BpeTokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) {
  Pretokenizer pieces(text);
  for (std::string_view piece; pieces.next(piece);) encode_piece(piece, out);
}

// Note [Added tokens]: a tokenizer.json's added tokens (chat markers such as "<|im_start|>" added
// for fine-tuning) are found in the text before pre-tokenisation, leftmost first and the longest
// of those starting there, and each is its own id, as HF's AddedVocabulary matches them. Until
// session 39 they joined the vocabulary but were never matched: "<|im_start|>" became about ten
// ordinary tokens where HF gives one id. <|endoftext|> is left to its callers: a document boundary
// in a corpus (corpus.h), eot_id() in a prompt (encode_prompt). Each token's next occurrence is
// kept, so the text is scanned once per token.
void BpeTokenizer::encode(std::string_view text, std::vector<int32_t>& out) {
  if (added_.empty()) return encode_ordinary(text, out);
  constexpr size_t kUnknown = std::string_view::npos - 1;
  std::vector<size_t> next(added_.size(), kUnknown);
  for (size_t from = 0;;) {
    size_t at = std::string_view::npos, hit = 0;
    for (size_t k = 0; k < added_.size(); ++k) {  // longest first: ties keep the longest
      if (next[k] == kUnknown || (next[k] != std::string_view::npos && next[k] < from))
        next[k] = text.find(added_[k].first, from);
      if (next[k] < at) at = next[k], hit = k;
    }
    encode_ordinary(text.substr(from, at == std::string_view::npos ? at : at - from), out);
    if (at == std::string_view::npos) return;
    out.push_back(added_[hit].second);
    from = at + added_[hit].first.size();
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) {
  std::vector<int32_t> out;
  encode(text, out);
  return out;
}

const std::string& BpeTokenizer::token_bytes(int32_t id) const {
  MW_CHECK_T(
      InvalidArgument, id >= 0 && static_cast<size_t>(id) < id_to_bytes_.size() && id_present_[id],
      "token id ", id, " is not in the vocabulary of ", source_, " (", vocab_size(), " ids)");
  return id_to_bytes_[id];
}

std::vector<int32_t> BpeTokenizer::encode_prompt(std::string_view text) {
  const std::string_view marker = kEndOfText;
  std::vector<int32_t> out;
  for (size_t from = 0;;) {
    const size_t at = text.find(marker, from);
    encode(text.substr(from, at == std::string_view::npos ? at : at - from), out);
    if (at == std::string_view::npos) return out;
    out.push_back(eot_id());
    from = at + marker.size();
  }
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

uint64_t BpeTokenizer::fingerprint() const {
  uint64_t h = 0xcbf29ce484222325ULL;
  const auto mix = [&](uint8_t byte) { h = (h ^ byte) * 0x100000001b3ULL; };
  for (size_t id = 0; id < id_to_bytes_.size(); ++id) {
    const std::string& bytes = id_present_[id] ? id_to_bytes_[id] : std::string();
    mix(id_present_[id] ? 1 : 0);
    for (int shift = 0; shift < 64; shift += 8) mix(static_cast<uint8_t>(bytes.size() >> shift));
    for (char c : bytes) mix(static_cast<uint8_t>(c));
  }
  return h;
}

}  // namespace mw::data
