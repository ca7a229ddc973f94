// Strict JSON parser (recursive descent with a depth limit) and compact writer. See json.h for the
// accepted language and the round-trip guarantees.
#include "data/json.h"

#include <charconv>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace mw::json {

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::Null: return "null";
    case Kind::Bool: return "bool";
    case Kind::Number: return "number";
    case Kind::String: return "string";
    case Kind::Array: return "array";
    case Kind::Object: return "object";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Value

Value Value::array() {
  Value v;
  v.kind_ = Kind::Array;
  return v;
}

Value Value::object() {
  Value v;
  v.kind_ = Kind::Object;
  return v;
}

std::string Value::describe() const {
  switch (kind_) {
    case Kind::Null: return "null";
    case Kind::Bool: return bool_ ? "true" : "false";
    case Kind::Number: return "number " + dump();
    case Kind::String: {
      std::string shown = string_.size() > 40 ? string_.substr(0, 40) + "..." : string_;
      std::string out = "string ";
      append_quoted(out, shown);
      return out;
    }
    case Kind::Array: return str("array of ", elements_.size());
    case Kind::Object: return str("object of ", elements_.size(), " members");
  }
  return "?";
}

void Value::expect(Kind kind, const char* what) const {
  MW_CHECK_T(FormatError, kind_ == kind, "JSON: expected ", what, ", found ", describe());
}

bool Value::as_bool() const {
  expect(Kind::Bool, "true or false");
  return bool_;
}

int64_t Value::as_int() const {
  MW_CHECK_T(FormatError, is_integer(), "JSON: expected an integer, found ", describe());
  return int_;
}

double Value::as_double() const {
  expect(Kind::Number, "a number");
  return double_;
}

const std::string& Value::as_string() const {
  expect(Kind::String, "a string");
  return string_;
}

int64_t Value::size() const {
  MW_CHECK_T(FormatError, kind_ == Kind::Array || kind_ == Kind::Object,
             "JSON: expected an array or object, found ", describe());
  return static_cast<int64_t>(elements_.size());
}

const Value& Value::at(int64_t index) const {
  expect(Kind::Array, "an array");
  MW_CHECK_T(FormatError, index >= 0 && index < static_cast<int64_t>(elements_.size()),
             "JSON: array index ", index, " out of range for an array of ", elements_.size());
  return elements_[index];
}

const std::vector<Value>& Value::elements() const {
  expect(Kind::Array, "an array");
  return elements_;
}

const Value* Value::find(std::string_view key) const {
  expect(Kind::Object, "an object");
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &elements_[it->second];
}

const Value& Value::at(std::string_view key) const {
  const Value* v = find(key);
  MW_CHECK_T(FormatError, v != nullptr, "JSON: missing key '", key, "'");
  return *v;
}

const std::string& Value::key(int64_t index) const {
  expect(Kind::Object, "an object");
  MW_CHECK_T(FormatError, index >= 0 && index < static_cast<int64_t>(keys_.size()),
             "JSON: member index ", index, " out of range for an object of ", keys_.size());
  return keys_[index];
}

const Value& Value::value(int64_t index) const {
  key(index);  // checks kind and range
  return elements_[index];
}

namespace {
template <typename F>
auto with_key(std::string_view key, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const FormatError& e) {
    throw FormatError(str("key '", key, "': ", e.what()));
  }
}
}  // namespace

int64_t Value::get_int(std::string_view key) const {
  const Value& v = at(key);
  return with_key(key, [&] { return v.as_int(); });
}
double Value::get_double(std::string_view key) const {
  const Value& v = at(key);
  return with_key(key, [&] { return v.as_double(); });
}
const std::string& Value::get_string(std::string_view key) const {
  const Value& v = at(key);
  return with_key(key, [&]() -> const std::string& { return v.as_string(); });
}
bool Value::get_bool(std::string_view key) const {
  const Value& v = at(key);
  return with_key(key, [&] { return v.as_bool(); });
}

Value& Value::set(std::string key, Value value) {
  MW_CHECK_T(InvalidArgument, kind_ == Kind::Object, "JSON: set() needs an object, this is ",
             describe());
  auto it = index_.find(key);
  if (it != index_.end()) {
    elements_[it->second] = std::move(value);
    return elements_[it->second];
  }
  index_.emplace(key, static_cast<int64_t>(elements_.size()));
  keys_.push_back(std::move(key));
  elements_.push_back(std::move(value));
  return elements_.back();
}

Value& Value::push_back(Value value) {
  MW_CHECK_T(InvalidArgument, kind_ == Kind::Array, "JSON: push_back() needs an array, this is ",
             describe());
  elements_.push_back(std::move(value));
  return elements_.back();
}

bool operator==(const Value& a, const Value& b) {
  if (a.kind_ != b.kind_) return false;
  switch (a.kind_) {
    case Kind::Null: return true;
    case Kind::Bool: return a.bool_ == b.bool_;
    case Kind::Number:
      if (a.is_integer_ && b.is_integer_) return a.int_ == b.int_;
      return a.double_ == b.double_;
    case Kind::String: return a.string_ == b.string_;
    case Kind::Array: return a.elements_ == b.elements_;
    case Kind::Object: return a.keys_ == b.keys_ && a.elements_ == b.elements_;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Writer

void append_quoted(std::string& out, std::string_view s) {
  static const char* kHex = "0123456789abcdef";
  out.push_back('"');
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out.push_back(kHex[c >> 4]);
          out.push_back(kHex[c & 15]);
        } else {
          out.push_back(ch);  // UTF-8 bytes pass through
        }
    }
  }
  out.push_back('"');
}

void Value::dump_to(std::string& out) const {
  switch (kind_) {
    case Kind::Null: out += "null"; return;
    case Kind::Bool: out += bool_ ? "true" : "false"; return;
    case Kind::Number: {
      char buf[64];
      std::to_chars_result r;
      if (is_integer_) {
        r = std::to_chars(buf, buf + sizeof buf, int_);
      } else {
        MW_CHECK_T(InvalidArgument, std::isfinite(double_), "JSON cannot represent the number ",
                   double_, "; only finite numbers can be written");
        r = std::to_chars(buf, buf + sizeof buf, double_);  // shortest round-trip form
      }
      out.append(buf, r.ptr);
      // A double that prints like an integer ("2") gets ".0", so it reads back as a non-integer.
      if (!is_integer_ &&
          std::string_view(buf, r.ptr - buf).find_first_of(".e") == std::string_view::npos) {
        out += ".0";
      }
      return;
    }
    case Kind::String: append_quoted(out, string_); return;
    case Kind::Array:
      out.push_back('[');
      for (size_t i = 0; i < elements_.size(); ++i) {
        if (i) out.push_back(',');
        elements_[i].dump_to(out);
      }
      out.push_back(']');
      return;
    case Kind::Object:
      out.push_back('{');
      for (size_t i = 0; i < elements_.size(); ++i) {
        if (i) out.push_back(',');
        append_quoted(out, keys_[i]);
        out.push_back(':');
        elements_[i].dump_to(out);
      }
      out.push_back('}');
      return;
  }
}

std::string Value::dump() const {
  std::string out;
  dump_to(out);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Parser

class Parser {
 public:
  Parser(std::string_view text, const std::string& source, int64_t first_line)
      : text_(text), source_(source), first_line_(first_line) {}

  Value parse_document() {
    skip_ws();
    Value v = parse_value(0);
    skip_ws();
    if (pos_ != text_.size()) fail("end of input after the top-level value");
    return v;
  }

 private:
  // Throws FormatError "<source>:<line>:<col>: expected <what>, found <what is at pos_>".
  [[noreturn]] void fail(std::string_view expected) const { fail_at(pos_, expected); }
  [[noreturn]] void fail_at(size_t pos, std::string_view expected) const {
    int64_t line = first_line_, col = 1;
    for (size_t i = 0; i < pos && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw FormatError(str(source_, ":", line, ":", col, ": invalid JSON: expected ", expected,
                          ", found ", found_at(pos)));
  }
  std::string found_at(size_t pos) const {
    if (pos >= text_.size()) return "end of input";
    unsigned char c = static_cast<unsigned char>(text_[pos]);
    if (c >= 0x20 && c < 0x7f) return str("'", static_cast<char>(c), "'");
    char buf[16];
    std::snprintf(buf, sizeof buf, "byte 0x%02x", c);
    return buf;
  }

  void skip_ws() {
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else {
        break;
      }
    }
  }

  bool consume_literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  Value parse_value(int depth) {
    if (pos_ >= text_.size()) fail("a value");
    char c = text_[pos_];
    switch (c) {
      case '{': return parse_object(depth + 1);
      case '[': return parse_array(depth + 1);
      case '"': return Value(parse_string());
      case 't':
        if (consume_literal("true")) return Value(true);
        break;
      case 'f':
        if (consume_literal("false")) return Value(false);
        break;
      case 'n':
        if (consume_literal("null")) return Value();
        break;
      default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
    }
    fail("a value (object, array, string, number, true, false or null)");
  }

  void check_depth(int depth) {
    if (depth > kMaxDepth) fail(str("nesting at most ", kMaxDepth, " deep"));
  }

  Value parse_object(int depth) {
    check_depth(depth);
    Value obj = Value::object();
    ++pos_;  // '{'
    skip_ws();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      return obj;
    }
    while (true) {
      skip_ws();
      if (pos_ >= text_.size() || text_[pos_] != '"') fail("a string key");
      size_t key_pos = pos_;
      std::string key = parse_string();
      if (obj.index_.count(key)) fail_at(key_pos, str("unique keys; key \"", key, "\" repeats"));
      skip_ws();
      if (pos_ >= text_.size() || text_[pos_] != ':') fail("':' after an object key");
      ++pos_;
      skip_ws();
      obj.index_.emplace(key, static_cast<int64_t>(obj.elements_.size()));
      obj.keys_.push_back(std::move(key));
      obj.elements_.push_back(parse_value(depth));
      skip_ws();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == '}') {
        ++pos_;
        return obj;
      }
      fail("',' or '}' after an object member");
    }
  }

  Value parse_array(int depth) {
    check_depth(depth);
    Value arr = Value::array();
    ++pos_;  // '['
    skip_ws();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      return arr;
    }
    while (true) {
      skip_ws();
      arr.elements_.push_back(parse_value(depth));
      skip_ws();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == ']') {
        ++pos_;
        return arr;
      }
      fail("',' or ']' after an array element");
    }
  }

  Value parse_number() {
    size_t start = pos_;
    auto digit = [&](size_t i) { return i < text_.size() && text_[i] >= '0' && text_[i] <= '9'; };
    bool integral = true;
    if (text_[pos_] == '-') ++pos_;
    if (!digit(pos_)) fail("a digit");
    if (text_[pos_] == '0') {
      ++pos_;
      if (digit(pos_)) fail("no leading zeros in a number");
    } else {
      while (digit(pos_)) ++pos_;
    }
    if (pos_ < text_.size() && text_[pos_] == '.') {
      integral = false;
      ++pos_;
      if (!digit(pos_)) fail("a digit after the decimal point");
      while (digit(pos_)) ++pos_;
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      integral = false;
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (!digit(pos_)) fail("a digit in the exponent");
      while (digit(pos_)) ++pos_;
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    Value v;
    v.kind_ = Kind::Number;
    if (integral) {
      int64_t i = 0;
      auto r = std::from_chars(first, last, i);
      if (r.ec == std::errc() && r.ptr == last) {
        v.is_integer_ = true;
        v.int_ = i;
        v.double_ = static_cast<double>(i);
        return v;
      }
      // Too large for int64: kept as a double only.
    }
    double d = 0.0;
    auto r = std::from_chars(first, last, d);
    if (r.ec == std::errc::result_out_of_range) fail_at(start, "a number within double range");
    if (r.ec != std::errc() || r.ptr != last) fail_at(start, "a number");
    v.double_ = d;
    return v;
  }

  uint32_t parse_hex4() {
    if (pos_ + 4 > text_.size()) fail("4 hex digits after \\u");
    uint32_t cp = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_];
      uint32_t d;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        d = c - 'A' + 10;
      } else {
        fail("a hex digit in a \\u escape");
      }
      cp = cp * 16 + d;
      ++pos_;
    }
    return cp;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }

  // Validates one UTF-8 sequence starting at pos_ (first byte >= 0x80), appends it, advances.
  void copy_utf8_sequence(std::string& out) {
    auto byte = [&](size_t i) -> uint32_t {
      return i < text_.size() ? static_cast<unsigned char>(text_[i]) : 0;
    };
    uint32_t b0 = byte(pos_);
    int len;
    uint32_t cp, min_cp;
    if ((b0 & 0xe0) == 0xc0) {
      len = 2, cp = b0 & 0x1f, min_cp = 0x80;
    } else if ((b0 & 0xf0) == 0xe0) {
      len = 3, cp = b0 & 0x0f, min_cp = 0x800;
    } else if ((b0 & 0xf8) == 0xf0) {
      len = 4, cp = b0 & 0x07, min_cp = 0x10000;
    } else {
      fail("valid UTF-8 text");
    }
    for (int i = 1; i < len; ++i) {
      uint32_t b = byte(pos_ + i);
      if ((b & 0xc0) != 0x80) fail_at(pos_ + i, "a UTF-8 continuation byte");
      cp = (cp << 6) | (b & 0x3f);
    }
    if (cp < min_cp || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
      fail("valid UTF-8 text (no overlong forms or surrogates)");
    }
    out.append(text_.data() + pos_, len);
    pos_ += len;
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("a closing '\"'");
      unsigned char c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) fail("a control character inside a string to be escaped");
      if (c >= 0x80) {
        copy_utf8_sequence(out);
        continue;
      }
      if (c != '\\') {
        out.push_back(static_cast<char>(c));
        ++pos_;
        continue;
      }
      ++pos_;  // backslash
      if (pos_ >= text_.size()) fail("an escape character after '\\'");
      char e = text_[pos_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          size_t escape_pos = pos_ - 2;
          uint32_t cp = parse_hex4();
          if (cp >= 0xdc00 && cp <= 0xdfff) {
            fail_at(escape_pos, "a high surrogate before a low surrogate \\u escape");
          }
          if (cp >= 0xd800 && cp <= 0xdbff) {
            if (!consume_literal("\\u")) fail("a low surrogate \\uDC00-\\uDFFF after a high one");
            uint32_t lo = parse_hex4();
            if (lo < 0xdc00 || lo > 0xdfff) {
              fail_at(pos_ - 6, "a low surrogate \\uDC00-\\uDFFF after a high one");
            }
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          }
          append_utf8(out, cp);
          break;
        }
        default: fail_at(pos_ - 1, "one of \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX");
      }
    }
  }

  std::string_view text_;
  const std::string& source_;
  int64_t first_line_;
  size_t pos_ = 0;
};

Value parse(std::string_view text, const std::string& source_name, int64_t first_line) {
  return Parser(text, source_name, first_line).parse_document();
}

}  // namespace mw::json
