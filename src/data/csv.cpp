// CSV and TSV records (csv.h).
#include "data/csv.h"

#include "core/error.h"

namespace mw::data {

bool read_csv_record(std::istream& in, char delimiter, const std::string& source,
                     std::vector<std::string>& fields, CsvPosition& at) {
  fields.clear();
  std::string line;
  if (!std::getline(in, line)) return false;
  const int64_t first_line = ++at.line;
  at.bytes += static_cast<int64_t>(line.size()) + (in.eof() ? 0 : 1);
  if (line.empty() || line == "\r") return true;  // a blank line: no fields
  std::string field;
  bool in_quotes = false, quoted = false;
  for (size_t i = 0;; ++i) {
    if (i == line.size()) {
      if (!in_quotes) break;
      // A line break inside quotes belongs to the field.
      MW_CHECK_T(FormatError, std::getline(in, line), source, ":", first_line,
                 ": a quoted field is not closed before the end of the file (a '\"' is missing)");
      ++at.line;
      at.bytes += static_cast<int64_t>(line.size()) + (in.eof() ? 0 : 1);
      field += '\n';
      i = static_cast<size_t>(-1);
      continue;
    }
    const char c = line[i];
    if (in_quotes) {
      if (c != '"') {
        field += c;
      } else if (i + 1 < line.size() && line[i + 1] == '"') {
        field += '"';
        ++i;
      } else {
        in_quotes = false;
      }
    } else if (c == delimiter) {
      fields.push_back(std::move(field));
      field.clear();
      quoted = false;
    } else if (c == '"' && field.empty() && !quoted) {
      in_quotes = quoted = true;
    } else if (c == '\r' && i + 1 == line.size()) {  // "\r\n" ends the record
    } else {
      field += c;
    }
  }
  fields.push_back(std::move(field));
  return true;
}

}  // namespace mw::data
