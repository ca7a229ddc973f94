// DocumentTemplate (Note [Document templates], data/doc_template.h): placeholders, escapes,
// braces, and what is refused.
#include "data/doc_template.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace mw::data {
namespace {

std::string render(const DocumentTemplate& t, const std::vector<std::string_view>& values) {
  std::string out = "stale";
  t.render(values, out);
  return out;
}

TEST(DocumentTemplate, FieldsAreNamedOnceInOrderAndEscapesAreText) {
  const DocumentTemplate t = DocumentTemplate::parse("{b}\\n{a}\\t{{{b}}}\\\\n \\x{a}");
  EXPECT_EQ(t.fields(), (std::vector<std::string>{"b", "a"}));
  EXPECT_FALSE(t.is_single_field());
  // \\n is a backslash then n; an unknown escape (\x) is kept as typed.
  EXPECT_EQ(render(t, {"B", "A"}), "B\nA\t{B}\\n \\xA");
  EXPECT_EQ(render(t, {"", ""}), "\n\t{}\\n \\x");
  EXPECT_EQ(DocumentTemplate::parse("{text}").fields(), (std::vector<std::string>{"text"}));
}

TEST(DocumentTemplate, OneFieldIsWhatFieldMeans) {
  const DocumentTemplate t = DocumentTemplate::field("story");
  EXPECT_TRUE(t.is_single_field());
  EXPECT_EQ(t.fields(), (std::vector<std::string>{"story"}));
  EXPECT_EQ(t.option(), "--field story");
  EXPECT_EQ(render(t, {"Once."}), "Once.");
  EXPECT_THROW(DocumentTemplate::field(""), InvalidArgument);
}

TEST(DocumentTemplate, MalformedTemplatesAreRefusedWithWhere) {
  for (const char* bad : {"{a", "a}", "{}", "{a{b}}", "plain text", "", "}}{{"}) {
    try {
      DocumentTemplate::parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace mw::data
