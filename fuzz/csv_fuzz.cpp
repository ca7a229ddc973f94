// libFuzzer target: the CSV/TSV record reader (src/data/csv.h). Any input must read or throw a
// FormatError, count every byte it read, and its records written back with every field quoted
// must read back the same.
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/csv.h"

namespace {

using Records = std::vector<std::vector<std::string>>;

Records read_all(const std::string& text, char delimiter) {
  std::istringstream in(text);
  mw::data::CsvPosition at;
  Records out;
  for (std::vector<std::string> fields;
       mw::data::read_csv_record(in, delimiter, "fuzz.csv", fields, at);)
    out.push_back(fields);
  if (at.bytes != static_cast<int64_t>(text.size())) __builtin_trap();
  return out;
}

std::string quoted(const Records& records, char delimiter) {
  std::string out;
  for (const std::vector<std::string>& fields : records) {
    for (size_t i = 0; i < fields.size(); ++i) {
      if (i) out += delimiter;
      out += '"';
      for (char c : fields[i]) out += c == '"' ? std::string("\"\"") : std::string(1, c);
      out += '"';
    }
    out += '\n';
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const char delimiter = data[0] & 1 ? '\t' : ',';
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    const Records records = read_all(text, delimiter);
    if (read_all(quoted(records, delimiter), delimiter) != records) __builtin_trap();
  } catch (const mw::Error&) {
  }
  return 0;
}
