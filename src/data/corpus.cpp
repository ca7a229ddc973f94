// Streaming a corpus in chunks cut at piece boundaries: see corpus.h and Note [Chunk boundaries].
#include "data/corpus.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string_view>

#include "core/error.h"
#include "data/bpe.h"
#include "data/file_io.h"
#include "data/json.h"
#include "data/pretokenize.h"
#include "data/token_shard.h"

namespace mw::data {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_csv(const std::string& path) { return ends_with(path, ".csv") || ends_with(path, ".tsv"); }
bool is_json(const std::string& path) {
  return ends_with(path, ".json") || ends_with(path, ".jsonl");
}

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Note [Chunk boundaries]: text[q] is ASCII whitespace and the character that ends at text[q - 1]
// is a whole, valid one that is not \s: a printable ASCII byte, or a multi-byte character decoded
// from the non-continuation byte before it (a decoder reading the text from its start begins a
// character there, whatever precedes it). Until session 39 only printable ASCII counted, so Hindi
// or Chinese text, whose words and sentences end in multi-byte characters ("क ", "。\n"), had no
// cut at all: one chunk per 64 MiB (one worker), forced cuts inside a character.
bool is_safe_cut(std::string_view text, size_t q) {
  if (q == 0 || q >= text.size() || !is_ascii_space(text[q])) return false;
  const auto before = static_cast<unsigned char>(text[q - 1]);
  if (before < 0x80) return before > ' ' && before < 0x7F;
  size_t start = q - 1;
  while (start > 0 && q - start < 4 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80)
    --start;
  const Utf8Char c = decode_utf8(text, start);
  return c.valid && start + static_cast<size_t>(c.length_bytes) == q &&
         char_class(c.code_point) != unicode::CharClass::Space;
}

// The last cut of Note [Chunk boundaries] in text (0 when there is none).
size_t last_safe_cut(std::string_view text) {
  for (size_t q = text.size(); q-- > 1;)
    if (is_safe_cut(text, q)) return q;
  return 0;
}

}  // namespace

size_t first_safe_cut(std::string_view text, size_t from) {
  for (size_t q = std::max<size_t>(from, 1); q < text.size(); ++q)
    if (is_safe_cut(text, q)) return q;
  return std::string_view::npos;
}

namespace {

// Note [Not UTF-8]: text in another encoding (Latin-1 or Windows-1252: older Project Gutenberg
// files, exports of Windows software) is tokenized byte by byte as GPT-2's BPE allows, but each
// accented letter becomes a byte no UTF-8 text has, so the model learns to write that encoding and
// gpt2_generate prints replacement characters. It is legal input (any bytes are), so it is named
// with the iconv command that converts it, not refused: the first invalid byte of the first 64 KiB
// and how many there are (a sequence cut by the 64 KiB boundary is not counted).
std::string not_utf8_warning(const std::string& path, std::string_view head, bool cut) {
  int64_t invalid = 0;
  size_t first = 0;
  for (size_t pos = 0; pos < head.size();) {
    const Utf8Char c = decode_utf8(head, pos);
    if (!c.valid && !(cut && head.size() - pos < 4)) {
      if (invalid++ == 0) first = pos;
    }
    pos += static_cast<size_t>(c.length_bytes);
  }
  if (invalid == 0) return "";
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned char>(head[first]));
  return str(
      "input '", path, "' is not UTF-8 text: byte ", byte, " at offset ", first, " (", invalid,
      " such byte", invalid == 1 ? "" : "s", " in its first ", head.size(),
      " bytes); it is tokenized byte by byte and the model will learn to write that encoding. If "
      "it is Latin-1 or Windows-1252, convert it first: iconv -f WINDOWS-1252 -t UTF-8 '",
      path, "' > converted.txt");
}

// Note [Not text]: gpt2_tokenize takes any bytes (invalid UTF-8 is tokenized byte by byte), so a
// compressed corpus, a token shard or a UTF-16 file became tokens without a word: 79,025 tokens of
// noise from a shard, at "1.00 bytes per token". Their first bytes tell them apart from text: the
// magic numbers of gzip, bzip2, xz, zstd, zip and Parquet, llm.c's shard header, a UTF-16
// byte-order mark, and, for any other binary file, a NUL byte in the first 64 KiB (text has none).
// Returns a warning for text that is not UTF-8 (Note [Not UTF-8]), else "".
std::string check_is_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string head(64 * 1024, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  auto starts = [&](std::string_view magic) { return head.rfind(magic, 0) == 0; };
  const std::string_view xz("\xfd\x37\x7a\x58\x5a\x00", 6), bzip2_block("1AY&SY");
  const char* compressed =
      starts("\x1f\x8b")                                                           ? "gzip"
      : starts("BZh") && head.size() >= 10 && head.compare(4, 6, bzip2_block) == 0 ? "bzip2"
      : starts(xz)                                                                 ? "xz"
      : starts("\x28\xb5\x2f\xfd")                                                 ? "zstd"
      : starts("PK\x03\x04")                                                       ? "zip"
                                                                                   : nullptr;
  MW_CHECK_T(FormatError, !compressed, "input '", path, "' is ", compressed ? compressed : "",
             "-compressed, not text: decompress it first and pass the text");
  int32_t magic = 0;
  if (head.size() >= 4) std::memcpy(&magic, head.data(), 4);
  MW_CHECK_T(FormatError, magic != kTokenShardMagic, "input '", path,
             "' is a token shard (llm.c's header), already tokenized: pass it to gpt2_train "
             "--data, or tokenize the text it came from");
  // HF datasets publish Parquet (FineWeb, the Hub's converted datasets): binary, columnar.
  MW_CHECK_T(FormatError, !starts("PAR1"), "input '", path,
             "' is a Parquet file, not text: write its text column as JSONL first, e.g. python3 "
             "-c \"import pandas as p; p.read_parquet('",
             path, "').to_json('", path,
             ".jsonl', orient='records', lines=True)\" (needs pyarrow), and pass the .jsonl");
  MW_CHECK_T(FormatError, !starts("\xff\xfe") && !starts("\xfe\xff"), "input '", path,
             "' is UTF-16 text (a byte-order mark): convert it to UTF-8 first (iconv -f UTF-16 -t "
             "UTF-8)");
  const size_t nul = head.find('\0');
  MW_CHECK_T(FormatError, nul == std::string::npos, "input '", path,
             "' holds a NUL byte at offset ", nul,
             ": a binary file, not text; pass text files (one document each), .jsonl, .json or "
             ".csv files");
  return is_json(path)  // its parser refuses it
             ? ""
             : not_utf8_warning(path, head, in.gcount() == 64 * 1024 && !in.eof());
}

// A folder gpt2_tokenize wrote: its shards are not text, its tokenizer files not documents.
bool is_shard_folder(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::exists(dir / "train_000000.bin", ec) ||
         std::filesystem::exists(dir / "val_000000.bin", ec);
}
}  // namespace

bool is_plain_text_input(const std::string& path) { return !is_json(path) && !is_csv(path); }

std::vector<std::string> expand_corpus_inputs(const std::vector<std::string>& inputs,
                                              const std::string& out_dir,
                                              const std::vector<std::string>& leave_out) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::error_code ec;
    if (!fs::is_directory(input, ec)) {
      files.push_back(input);  // a file, or a bad path named by the reader
      continue;
    }
    std::vector<std::string> under;
    auto it = fs::recursive_directory_iterator(input, ec);
    MW_CHECK_T(IoError, !ec, "input folder '", input, "' cannot be read: ", ec.message());
    for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
      MW_CHECK_T(IoError, !ec, "reading input folder '", input, "' failed: ", ec.message());
      const std::string name = it->path().filename().string();
      const bool out = (!out_dir.empty() && fs::equivalent(it->path(), out_dir, ec)) ||
                       (it->is_directory(ec) && is_shard_folder(it->path())) ||
                       std::any_of(leave_out.begin(), leave_out.end(), [&](const std::string& f) {
                         return !f.empty() && fs::equivalent(it->path(), f, ec);
                       });
      if (name.starts_with(".") || out) {
        if (it->is_directory(ec)) it.disable_recursion_pending();
        continue;
      }
      if (it->is_regular_file(ec)) under.push_back(it->path().string());
    }
    MW_CHECK_T(IoError, !under.empty(), "input folder '", input,
               "' holds no file to tokenize; pass text, .jsonl, .json or .csv files, or folders "
               "of them");
    std::sort(under.begin(), under.end());
    files.insert(files.end(), under.begin(), under.end());
  }
  return files;
}

CorpusReader::CorpusReader(std::vector<std::string> paths, DocumentTemplate doc)
    : paths_(std::move(paths)), template_(std::move(doc)) {
  for (const std::string& path : paths_) {
    std::error_code ec;
    MW_CHECK_T(IoError, std::filesystem::is_regular_file(path, ec), "input '", path,
               "' is not a readable file; pass text files (one document each), .jsonl, .json or "
               ".csv files");
    std::ifstream probe(path, std::ios::binary);
    MW_CHECK_T(IoError, probe.good(), "cannot open input '", path, "' for reading");
    total_bytes_ += static_cast<int64_t>(std::filesystem::file_size(path));
    if (std::string w = check_is_text(path); !w.empty()) warnings_.push_back(std::move(w));
  }
  // The same file twice (a glob and a name, a link): its documents would be tokenized twice, and
  // with --val-fraction could land in train and in val. One stat per file: comparing every pair
  // took 23 s for 5,000 files (a folder of documents), and grows with the square.
  std::map<std::pair<dev_t, ino_t>, size_t> seen;
  for (size_t j = 0; j < paths_.size(); ++j) {
    struct stat st {};
    if (::stat(paths_[j].c_str(), &st) != 0) continue;  // named by the open, above
    const auto [it, fresh] = seen.emplace(std::pair{st.st_dev, st.st_ino}, j);
    MW_CHECK_T(InvalidArgument, fresh, "input '", paths_[j], "' is '", paths_[it->second],
               "' again: its documents would be tokenized twice (and could land in both train "
               "and val); pass each file once");
  }
}

bool CorpusReader::open_next_file() {
  if (in_.is_open()) {
    in_.close();
    bytes_done_ += bytes_in_file_;
    bytes_in_file_ = 0;
    ++file_index_;
  }
  if (file_index_ >= paths_.size()) return false;
  const std::string& path = paths_[file_index_];
  in_.open(path, std::ios::binary);
  MW_CHECK_T(IoError, in_.good(), "cannot open input '", path, "' for reading");
  // Note [Byte-order mark] (file_io.h): not text, and not JSON.
  char head[3] = {};
  in_.read(head, 3);
  if (in_.gcount() == 3 && std::string_view(head, 3) == kUtf8ByteOrderMark) {
    bytes_in_file_ = 3;
  } else {
    in_.clear();
    in_.seekg(0);
  }
  kind_ = is_json(path) ? Kind::kJsonl : Kind::kText;
  file_bytes_ = static_cast<int64_t>(std::filesystem::file_size(path));
  if (is_csv(path)) open_csv(ends_with(path, ".csv") ? ',' : '\t');
  if (ends_with(path, ".json") && first_non_space_byte() == '[') {  // Note [JSON arrays]
    kind_ = Kind::kJsonArray;
    array_ = json::parse(
        read_text_file(path, "JSON corpus",
                       "a .json array is read whole; make JSONL of it, which streams: jq -c '.[]' "
                       "FILE.json > FILE.jsonl",
                       kMaxJsonArrayBytes),
        path);
    array_index_ = 0;
  }
  document_started_ = false;
  line_number_ = 0;
  buffer_.clear();
  return true;
}

char CorpusReader::first_non_space_byte() {
  const std::streampos start = in_.tellg();
  char c = 0;
  while (in_.get(c) && is_ascii_space(c)) {
  }
  in_.clear();
  in_.seekg(start);
  return c;
}

bool CorpusReader::next(CorpusChunk& chunk) {
  for (;;) {
    if (next_piece(chunk)) return true;
    CorpusChunk raw;
    if (in_.is_open() && (kind_ == Kind::kJsonl       ? next_jsonl(raw)
                          : kind_ == Kind::kJsonArray ? next_json_element(raw)
                          : kind_ == Kind::kCsv       ? next_csv(raw)
                                                      : next_text(raw))) {
      if (raw.starts_document) pending_start_ = true;
      if (raw.starts_document && raw.text.empty()) {  // an empty document: an empty file or field
        pending_start_ = false;
        ++num_documents_;
        chunk = raw;
        return true;
      }
      raw_ = raw, piece_pos_ = 0;
      continue;
    }
    if (!open_next_file()) return false;
  }
}

// Note [End-of-text markers].
constexpr std::string_view kMarker = kEndOfText;

MarkersAround markers_around(const std::string& path, int64_t at, int64_t reach) {
  constexpr int64_t kBlock = int64_t{1} << 20, kOverlap = int64_t(kMarker.size()) - 1;
  const ReadOnlyFile file(path, "input", "pass an existing text file");
  const int64_t size = file.size_bytes();
  // The bytes a marker starting in [at - reach, at + reach) lies in, and no more: a text without
  // markers is not read twice.
  const int64_t lo = std::clamp<int64_t>(at - reach, 0, size);
  const int64_t hi = std::clamp<int64_t>(at + reach + kOverlap, 0, size);
  std::string block;
  const auto read = [&](int64_t from, int64_t to) {
    block.resize(static_cast<size_t>(to - from));
    file.read_exact(block.data(), to - from, from);
  };
  MarkersAround r;
  for (int64_t from = std::clamp<int64_t>(at, 0, size); from + kOverlap < hi; from += kBlock) {
    read(from, std::min(hi, from + kBlock + kOverlap));
    if (const size_t m = block.find(kMarker); m != std::string::npos) {
      r.after = from + static_cast<int64_t>(m);
      break;
    }
  }
  // Backwards from the last marker that could start before `at`, a block at a time.
  for (int64_t to = std::clamp<int64_t>(at + kOverlap, 0, size); to - lo > kOverlap;) {
    const int64_t from = std::max<int64_t>(lo, to - kBlock - kOverlap);
    read(from, to);
    if (const size_t m = block.rfind(kMarker); m != std::string::npos) {
      r.before = from + static_cast<int64_t>(m);
      break;
    }
    to = from + kOverlap;
    if (from == lo) break;
  }
  return r;
}

bool CorpusReader::next_piece(CorpusChunk& chunk) {
  while (piece_pos_ != std::string_view::npos) {
    const std::string_view rest = raw_.text.substr(piece_pos_);
    const size_t marker = rest.find(kMarker);
    const std::string_view piece = rest.substr(0, marker);
    const int64_t offset = raw_.offset + static_cast<int64_t>(piece_pos_);
    piece_pos_ = marker == std::string_view::npos ? std::string_view::npos
                                                  : piece_pos_ + marker + kMarker.size();
    const bool starts = pending_start_;
    if (marker != std::string_view::npos) ++num_markers_;
    if (!piece.empty()) pending_start_ = false;
    if (marker != std::string_view::npos) pending_start_ = true;  // the next piece starts one
    if (piece.empty()) continue;
    if (starts) ++num_documents_;
    text_bytes_ += static_cast<int64_t>(piece.size());
    chunk = {piece, starts, offset};
    return true;
  }
  return false;
}

bool CorpusReader::next_jsonl(CorpusChunk& chunk) {
  std::string line;
  while (std::getline(in_, line)) {
    ++line_number_;
    bytes_in_file_ += static_cast<int64_t>(line.size()) + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = paths_[file_index_] + ":" + std::to_string(line_number_);
    document_text(json::parse(line, paths_[file_index_], line_number_), where, false, chunk_);
    chunk = {chunk_, true, bytes_done_ + bytes_in_file_ - static_cast<int64_t>(line.size()) - 1};
    return true;
  }
  return false;
}

bool CorpusReader::next_json_element(CorpusChunk& chunk) {
  if (array_index_ >= array_.size()) {
    array_ = json::Value();  // its memory goes before the next file's
    bytes_in_file_ = file_bytes_;
    return false;
  }
  const std::string where = str(paths_[file_index_], " element ", array_index_);
  document_text(array_.at(array_index_), where, true, chunk_);
  ++array_index_;
  // Progress in bytes, as the elements go; the val cut of Note [One document] is for text files.
  bytes_in_file_ = file_bytes_ * array_index_ / std::max<int64_t>(1, array_.size());
  chunk = {chunk_, true, bytes_done_ + bytes_in_file_};
  return true;
}

void CorpusReader::open_csv(char delimiter) {
  kind_ = Kind::kCsv;
  csv_delimiter_ = delimiter;
  csv_at_ = {0, bytes_in_file_};  // after a byte-order mark
  const std::string& path = paths_[file_index_];
  std::vector<std::string> header;
  if (!read_csv_record(in_, delimiter, path, header, csv_at_)) return;  // an empty file
  csv_columns_.clear();
  for (const std::string& field : template_.fields()) {
    const auto column = std::find(header.begin(), header.end(), field);
    if (column == header.end()) {
      std::string names;
      for (const std::string& name : header) names += (names.empty() ? "" : ", ") + name;
      throw FormatError(str(path, ": its header (", names, ") has no column \"", field, "\"; ",
                            template_.is_single_field()
                                ? "pass --field the column that holds the text"
                                : "every {field} of " + template_.option() + " must be a column"));
    }
    csv_columns_.push_back(static_cast<size_t>(column - header.begin()));
  }
  bytes_in_file_ = csv_at_.bytes;
}

bool CorpusReader::next_csv(CorpusChunk& chunk) {
  const std::string& path = paths_[file_index_];
  for (;;) {
    const int64_t offset = bytes_done_ + csv_at_.bytes;
    if (!read_csv_record(in_, csv_delimiter_, path, csv_fields_, csv_at_)) return false;
    bytes_in_file_ = csv_at_.bytes;
    if (csv_fields_.empty()) continue;  // a blank line
    std::vector<std::string_view> values;
    for (size_t i = 0; i < csv_columns_.size(); ++i) {
      MW_CHECK_T(FormatError, csv_columns_[i] < csv_fields_.size(), path, ":", csv_at_.line,
                 ": the row has ", csv_fields_.size(), " field(s), and the column \"",
                 template_.fields()[i], "\" is field ", csv_columns_[i] + 1, " of the header");
      values.push_back(csv_fields_[csv_columns_[i]]);
    }
    template_.render(values, chunk_);
    chunk = {chunk_, true, offset};
    return true;
  }
}

void CorpusReader::document_text(const json::Value& doc, const std::string& where, bool strings,
                                 std::string& out) const {
  if (template_.is_single_field()) {
    if (strings && doc.is_string()) {
      out = doc.as_string();
      return;
    }
    MW_CHECK_T(FormatError, doc.is_object(), where, ": expected a JSON object",
               strings ? " or string" : " per line", ", found ", doc.describe());
    const std::string& field = template_.fields()[0];
    const json::Value* text = doc.find(field);
    MW_CHECK_T(FormatError, text && text->is_string(), where, ": expected a string field \"", field,
               "\", found ", text ? text->describe() : std::string("no such field"),
               "; pass --field NAME to read another field");
    out = text->as_string();
    return;
  }
  // Note [Document templates].
  MW_CHECK_T(FormatError, doc.is_object(), where, ": expected a JSON object with the fields of ",
             template_.option(), ", found ", doc.describe());
  const std::vector<std::string>& fields = template_.fields();
  std::vector<std::string> spelled(fields.size());
  std::vector<std::string_view> values(fields.size());
  for (size_t i = 0; i < fields.size(); ++i) {
    const json::Value* v = doc.find(fields[i]);
    if (v == nullptr) {
      std::string names;
      for (int64_t k = 0; k < doc.size(); ++k) names += (k ? ", " : "") + doc.key(k);
      throw FormatError(str(
          where, ": no field \"", fields[i], "\" (the object has: ", names.empty() ? "none" : names,
          "); every {field} of ", template_.option(), " must be in every record"));
    }
    MW_CHECK_T(FormatError, !v->is_array() && !v->is_object(), where, ": the field \"", fields[i],
               "\" is ", v->describe(),
               "; a template takes strings, numbers, booleans and null (the empty text)");
    if (v->is_string()) {
      values[i] = v->as_string();
    } else if (!v->is_null()) {
      spelled[i] = v->dump();
      values[i] = spelled[i];
    }
  }
  template_.render(values, out);
}

bool CorpusReader::read_more() {
  const size_t old = buffer_.size();
  buffer_.resize(old + kChunkBytes);
  in_.read(buffer_.data() + old, kChunkBytes);
  buffer_.resize(old + static_cast<size_t>(in_.gcount()));
  bytes_in_file_ += in_.gcount();
  MW_CHECK_T(IoError, !in_.bad(), "reading input '", paths_[file_index_], "' failed");
  return !in_.eof();
}

bool CorpusReader::next_text(CorpusChunk& chunk) {
  while (static_cast<int64_t>(buffer_.size()) < kChunkBytes && !in_.eof()) read_more();
  size_t cut = in_.eof() ? buffer_.size() : last_safe_cut(buffer_);
  while (cut == 0 && !in_.eof() && static_cast<int64_t>(buffer_.size()) < kMaxChunkBytes) {
    read_more();
    cut = in_.eof() ? buffer_.size() : last_safe_cut(buffer_);
  }
  if (cut == 0) {
    if (document_started_ && buffer_.empty()) return false;  // the document is done
    cut = buffer_.size();  // an empty document, or kMaxChunkBytes with no safe cut (see the Note)
  }
  const int64_t offset = bytes_done_ + bytes_in_file_ - static_cast<int64_t>(buffer_.size());
  chunk_.assign(buffer_, 0, cut);
  buffer_.erase(0, cut);
  chunk = {chunk_, !document_started_, offset};
  document_started_ = true;
  return true;
}

}  // namespace mw::data
