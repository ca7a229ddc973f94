// Note [Document templates], doc_template.h.
#include "data/doc_template.h"

#include <algorithm>

#include "core/error.h"

namespace mw::data {

DocumentTemplate DocumentTemplate::field(std::string name) {
  MW_CHECK_T(InvalidArgument, !name.empty(), "--field must name a field, e.g. --field text");
  DocumentTemplate t;
  t.option_ = "--field " + name;
  t.fields_ = {std::move(name)};
  t.parts_ = {Part{{}, 0}};
  t.single_ = true;
  return t;
}

DocumentTemplate DocumentTemplate::parse(std::string_view spec) {
  DocumentTemplate t;
  t.option_ = "--template '" + std::string(spec) + "'";
  std::string literal;
  const auto fail = [&](size_t at, const std::string& what) {
    return InvalidArgument(str("--template: ", what, " at byte ", at + 1, " of '", spec,
                               "'; write {name} for a field, {{ and }} for braces"));
  };
  for (size_t i = 0; i < spec.size(); ++i) {
    const char c = spec[i];
    if (c == '\\' && i + 1 < spec.size() &&
        (spec[i + 1] == 'n' || spec[i + 1] == 't' || spec[i + 1] == '\\')) {
      literal += spec[i + 1] == 'n' ? '\n' : spec[i + 1] == 't' ? '\t' : '\\';
      ++i;
    } else if ((c == '{' || c == '}') && i + 1 < spec.size() && spec[i + 1] == c) {
      literal += c;
      ++i;
    } else if (c == '}') {
      throw fail(i, "a '}' that closes no {field}");
    } else if (c == '{') {
      const size_t close = spec.find_first_of("{}", i + 1);
      if (close == std::string_view::npos || spec[close] != '}')
        throw fail(i, "a '{' with no '}' after it");
      const std::string name(spec.substr(i + 1, close - i - 1));
      if (name.empty()) throw fail(i, "an empty {}");
      if (!literal.empty()) t.parts_.push_back(Part{std::move(literal), -1});
      literal.clear();
      auto at = std::find(t.fields_.begin(), t.fields_.end(), name);
      if (at == t.fields_.end()) at = t.fields_.insert(t.fields_.end(), name);
      t.parts_.push_back(Part{{}, static_cast<int>(at - t.fields_.begin())});
      i = close;
    } else {
      literal += c;
    }
  }
  if (!literal.empty()) t.parts_.push_back(Part{std::move(literal), -1});
  MW_CHECK_T(InvalidArgument, !t.fields_.empty(), "--template '", spec,
             "' names no {field}: every document would be that same text; write {name} where "
             "a record's field goes");
  return t;
}

void DocumentTemplate::render(const std::vector<std::string_view>& values, std::string& out) const {
  out.clear();
  for (const Part& part : parts_) {
    if (part.field < 0)
      out += part.text;
    else
      out += values.at(static_cast<size_t>(part.field));
  }
}

}  // namespace mw::data
