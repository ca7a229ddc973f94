// Reading a text corpus as documents, streamed in bounded chunks, for tokenizing and BPE training.
//
// Inputs: a file whose name ends in ".jsonl" holds one document per non-empty line, a JSON object
// whose string field `field` is the text; one ending in ".json" holds a JSON array of documents,
// objects with that field or strings (Note [JSON arrays]); one ending in ".csv" or ".tsv" is a
// table whose column `field` (named in its header) holds a document per row (data/csv.h); a
// template of several fields makes a record's text instead (Note [Document templates]); any
// other file is one document of raw bytes (invalid UTF-8 is tokenized byte by byte). Compressed
// files, token shards, UTF-16 and other binary files are refused, and so is a file given twice
// (Note [Not text], corpus.cpp).
//
// Note [JSON arrays]: TinyStories' data00.json ... data49.json (llama2.c's and llm.c's source for
// it) and Alpaca's alpaca_data.json are one JSON array each, not JSONL; such a file was one
// document of raw JSON, so the model learned the brackets, keys and escapes. A .json file that
// starts with '[' is now parsed as a whole (about 5x its size in memory: 63 MB took 296 MB) and
// each element is a document; files over kMaxJsonArrayBytes are refused with how to make JSONL of
// them, which streams. Any other .json is read as JSONL, which HF datasets' to_json() writes under
// that name.
//
// Note [Chunk boundaries]: a large document is handed out in chunks of about kChunkBytes, and the
// tokenizer pre-tokenises each chunk on its own. That gives exactly the pieces of the whole
// document because a chunk ends only between a whole character that is not \s (printable ASCII,
// or a valid multi-byte character: a Devanagari letter, a CJK full stop) and an ASCII whitespace
// byte (' ', '\t', '\n', '\r'): GPT-2's regex always has a piece boundary there (no run or
// contraction spans a non-space followed by whitespace), and it has no look-behind, so the pieces
// after the cut do not depend on the text before it. A document with no such place in
// kMaxChunkBytes (64 MiB without an ASCII space after a non-space character) is cut there anyway;
// only the pieces at that one cut can differ from an unchunked run, never the bytes.
//
// Note [End-of-text markers]: the literal text "<|endoftext|>" in a document ends that document
// there and starts the next; its 13 bytes are not text. TinyStories' .txt files (the commonest
// small corpus for training from scratch) separate their stories so, as do dumps of other GPT-2
// corpora; each marker became 5 ordinary tokens ("<|", "end", "of", "text", "|>" in GPT-2's
// vocabulary), so the model learned to write the marker and never the <|endoftext|> token at which
// gpt2_generate stops, and a corpus of 2.7 million stories was one document. HF's tokenizer
// encodes the marker as the special id, tiktoken's encode() refuses it unless told; here it is the
// boundary it names. A document left empty by markers (a file that starts with one, two in a row)
// is dropped. A marker is never split by a chunk cut (it holds no whitespace), except at
// kMaxChunkBytes' forced cut.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "data/csv.h"
#include "data/doc_template.h"
#include "data/json.h"

namespace mw::data {

inline constexpr int64_t kChunkBytes = 1 << 20;
inline constexpr int64_t kMaxChunkBytes = 64LL << 20;
inline constexpr int64_t kMaxJsonArrayBytes = int64_t{2} << 30;  // Note [JSON arrays]

// The first cut of Note [Chunk boundaries] in text at or after `from` (npos when there is none):
// the text before it and after it pre-tokenise as the whole does.
size_t first_safe_cut(std::string_view text, size_t from);

// The byte offsets in the file at `path` of the first <|endoftext|> marker that starts at or after
// `at` and of the last that starts before it, within `reach` bytes of `at`; -1 where there is
// none (Note [One document] cuts a text file of marked documents at one of them).
struct MarkersAround {
  int64_t before = -1, after = -1;
};
MarkersAround markers_around(const std::string& path, int64_t at, int64_t reach);

// True for an input read as one document of raw bytes: not .jsonl, .json, .csv or .tsv.
bool is_plain_text_input(const std::string& path);

// `inputs` with each folder replaced by the regular files under it, recursively, in path order,
// leaving out names that start with '.' (.DS_Store, .git), the folder `out_dir` and any folder
// holding train_000000.bin or val_000000.bin (the shards and tokenizer of earlier runs). A folder
// tens of thousands of documents long no longer has to be globbed onto a command line (bash:
// "Argument list too long" past about 2 MB of names). IoError for a folder that holds no file.
// `leave_out`: files a folder may hold that are not corpus (the tokenizer's own vocab.json,
// merges.txt or tokenizer.json, which were read as documents: a vocab.json refused as a JSONL
// line, merges.txt tokenized as text).
std::vector<std::string> expand_corpus_inputs(const std::vector<std::string>& inputs,
                                              const std::string& out_dir,
                                              const std::vector<std::string>& leave_out = {});

struct CorpusChunk {
  std::string_view text;  // valid until the next call to next()
  bool starts_document;   // the first chunk of a document (a document may be empty)
  int64_t offset = 0;     // the byte of the corpus (its files one after another) text starts at
};

class CorpusReader {
 public:
  // IoError naming a file that cannot be opened (checked here, before any work). A structured
  // record's text is `doc` of its fields (Note [Document templates], doc_template.h).
  CorpusReader(std::vector<std::string> paths, DocumentTemplate doc);
  CorpusReader(std::vector<std::string> paths, std::string jsonl_field)
      : CorpusReader(std::move(paths), DocumentTemplate::field(std::move(jsonl_field))) {}

  // The next chunk; false at the end of the last file. FormatError naming file and line for a
  // JSONL line that is not an object with a string `field`.
  bool next(CorpusChunk& chunk);

  int64_t total_bytes() const { return total_bytes_; }  // of all files, at open
  int64_t bytes_read() const { return bytes_done_ + bytes_in_file_; }
  int64_t num_documents() const { return num_documents_; }
  int64_t num_markers() const { return num_markers_; }  // Note [End-of-text markers]
  // One per input that is not UTF-8 text (Note [Not UTF-8], corpus.cpp), found at construction.
  const std::vector<std::string>& warnings() const { return warnings_; }
  // Bytes of document text handed out: without JSON or CSV syntax, markers and byte-order marks.
  int64_t text_bytes() const { return text_bytes_; }

 private:
  bool open_next_file();
  bool next_jsonl(CorpusChunk& chunk);
  bool next_json_element(CorpusChunk& chunk);  // Note [JSON arrays]
  void open_csv(char delimiter);               // reads the header, finds the column
  bool next_csv(CorpusChunk& chunk);
  char first_non_space_byte();  // of in_, left where it was
  // A JSON document's text into `out`: template_ of its fields (or itself, a string where
  // `strings` and the template is one field).
  void document_text(const json::Value& doc, const std::string& where, bool strings,
                     std::string& out) const;
  bool next_text(CorpusChunk& chunk);
  // The next non-empty piece of raw_ between markers; false once raw_ is used up.
  bool next_piece(CorpusChunk& chunk);
  // Appends up to kChunkBytes of the file to buffer_; false once the file's end is reached.
  bool read_more();

  std::vector<std::string> paths_, warnings_;
  DocumentTemplate template_;
  size_t file_index_ = 0;
  std::ifstream in_;
  enum class Kind { kText, kJsonl, kJsonArray, kCsv } kind_ = Kind::kText;
  char csv_delimiter_ = ',';
  std::vector<size_t> csv_columns_;  // of template_.fields(), in the header
  CsvPosition csv_at_;
  std::vector<std::string> csv_fields_;
  json::Value array_;  // a .json file's documents
  int64_t array_index_ = 0, file_bytes_ = 0;
  bool document_started_ = false;
  int64_t line_number_ = 0;
  std::string buffer_;  // text read but not yet handed out, after the chunk handed out
  std::string chunk_;
  CorpusChunk raw_;                            // a document's chunk, before markers split it
  size_t piece_pos_ = std::string_view::npos;  // where raw_'s next piece starts
  bool pending_start_ = false;                 // the next piece starts a document
  int64_t total_bytes_ = 0, bytes_done_ = 0, bytes_in_file_ = 0, num_documents_ = 0;
  int64_t num_markers_ = 0, text_bytes_ = 0;
};

}  // namespace mw::data
