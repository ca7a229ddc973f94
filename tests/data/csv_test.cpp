// CSV and TSV records (data/csv.h) against what Python's csv module writes: quotes, doubled
// quotes, delimiters and line breaks inside quoted fields, "\r\n" records, blank lines, and an
// unclosed quote named by the line where its record starts.
#include "data/csv.h"

#include <gtest/gtest.h>

#include <sstream>

#include "core/error.h"
#include "temp_dir.h"

namespace mw::data {
namespace {

using testing::expect_throw_with;
using Records = std::vector<std::vector<std::string>>;

Records read_all(const std::string& text, char delimiter, CsvPosition* end = nullptr) {
  std::istringstream in(text);
  CsvPosition at;
  Records out;
  for (std::vector<std::string> fields; read_csv_record(in, delimiter, "t.csv", fields, at);)
    out.push_back(fields);
  if (end) *end = at;
  return out;
}

TEST(Csv, ReadsWhatPythonsCsvWriterWrites) {
  // csv.writer(f).writerows([["id", "text"], [1, 'say "hi", then\r\nleave'], [2, ""], [3, "x"]])
  const std::string text = "id,text\r\n1,\"say \"\"hi\"\", then\r\nleave\"\r\n2,\"\"\r\n3,x\r\n";
  CsvPosition end;
  EXPECT_EQ(read_all(text, ',', &end),
            (Records{{"id", "text"}, {"1", "say \"hi\", then\r\nleave"}, {"2", ""}, {"3", "x"}}));
  EXPECT_EQ(end.line, 5);  // the quoted field spans two lines
  EXPECT_EQ(end.bytes, static_cast<int64_t>(text.size()));
  // Blank lines are records of no fields; a last line without a break is a record; tabs.
  EXPECT_EQ(read_all("a\tb\n\nc\t\"d\te\"", '\t'), (Records{{"a", "b"}, {}, {"c", "d\te"}}));
  // Quotes inside an unquoted field are kept as they are (as Python's reader does).
  EXPECT_EQ(read_all("a\"b,c\n", ','), (Records{{"a\"b", "c"}}));
}

TEST(Csv, AnUnclosedQuoteNamesTheLineItsRecordStartsOn) {
  expect_throw_with<FormatError>(
      [] { read_all("h\nok\n\"never\nclosed\n", ','); },
      {"t.csv:3: a quoted field is not closed before the end of the file"});
}

}  // namespace
}  // namespace mw::data
