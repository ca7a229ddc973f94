// Reading CSV and TSV records (RFC 4180) from a stream, one record at a time, for corpora whose
// documents are a column of a table (data/corpus.h).
//
// Invariants: fields are separated by `delimiter`; a field that starts with '"' is quoted and ends
// at the next lone '"' (a doubled "" is one quote), and may hold delimiters and line breaks; a
// record ends at a line break outside quotes ("\n" or "\r\n"). Bytes are kept as they are (no
// trimming, no encoding assumed). A quote left open at the end of the input is a FormatError naming
// the line where its record started.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace mw::data {

struct CsvPosition {
  int64_t line = 0;   // lines read so far (a record's first line is line + 1 before the call)
  int64_t bytes = 0;  // bytes read so far
};

// The next record's fields; false at the end of the input. A blank line is a record of no fields
// (a quoted empty field, "", is one). `source` names the file in errors.
bool read_csv_record(std::istream& in, char delimiter, const std::string& source,
                     std::vector<std::string>& fields, CsvPosition& at);

}  // namespace mw::data
