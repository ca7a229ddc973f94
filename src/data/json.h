// A small, strict JSON value, parser and writer (RFC 8259), for config.json and safetensors
// headers.
//
// Invariants:
// - parse() accepts exactly RFC 8259 JSON: no comments, no trailing commas, no NaN/Infinity, no
//   leading zeros, no unescaped control characters, valid UTF-8 only, no duplicate object keys, and
//   nothing but whitespace after the value. Anything else is a mw::FormatError naming the source,
//   the line and column, what was expected and what was found.
// - Nesting deeper than kMaxDepth is a FormatError, so hostile input cannot exhaust the stack.
// - A number written as an integer literal that fits int64 keeps that exact value (is_integer());
//   every number also has a double value.
// - Objects keep their members in insertion (file) order.
// - dump() is compact and round-trips: integers are written exactly, doubles in the shortest form
//   that reads back to the same bits. Non-finite doubles cannot be written (InvalidArgument).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace mw::json {

inline constexpr int kMaxDepth = 512;

enum class Kind : uint8_t { Null, Bool, Number, String, Array, Object };
const char* kind_name(Kind kind);

class Value {
 public:
  Value() = default;  // null
  Value(std::nullptr_t) {}
  Value(bool b) : kind_(Kind::Bool), bool_(b) {}
  Value(int v) : Value(static_cast<int64_t>(v)) {}
  Value(int64_t v)
      : kind_(Kind::Number), is_integer_(true), int_(v), double_(static_cast<double>(v)) {}
  Value(double v) : kind_(Kind::Number), double_(v) {}
  Value(std::string s) : kind_(Kind::String), string_(std::move(s)) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(std::string_view s) : Value(std::string(s)) {}
  static Value array();
  static Value object();

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::Null; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_number() const { return kind_ == Kind::Number; }
  // True for a number written (or constructed) as an integer that fits int64.
  bool is_integer() const { return kind_ == Kind::Number && is_integer_; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_array() const { return kind_ == Kind::Array; }
  bool is_object() const { return kind_ == Kind::Object; }

  // Typed access; each throws FormatError saying what was expected and what was found.
  bool as_bool() const;
  int64_t as_int() const;    // only integer literals: 2 yes, 2.0 / 2e0 / 1.5 no
  double as_double() const;  // any number
  const std::string& as_string() const;

  // Arrays and objects: number of elements / members.
  int64_t size() const;
  // Array element i (FormatError when out of range or not an array).
  const Value& at(int64_t index) const;
  const std::vector<Value>& elements() const;

  // Object member by key: at() throws FormatError naming the key when missing; find() returns null.
  const Value& at(std::string_view key) const;
  const Value* find(std::string_view key) const;
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  // Member i in insertion order.
  const std::string& key(int64_t index) const;
  const Value& value(int64_t index) const;
  // Typed member access naming the key in the error ("key 'n_layer': expected an integer, found
  // string \"12\"").
  int64_t get_int(std::string_view key) const;
  double get_double(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  bool get_bool(std::string_view key) const;

  // Building. set() replaces an existing member's value in place or appends a new member.
  Value& set(std::string key, Value value);
  Value& push_back(Value value);

  std::string dump() const;
  // A short description for error messages: `string "abc"`, `number 1.5`, `object`.
  std::string describe() const;

  friend bool operator==(const Value& a, const Value& b);

 private:
  void expect(Kind kind, const char* what) const;
  void dump_to(std::string& out) const;
  friend class Parser;

  Kind kind_ = Kind::Null;
  bool bool_ = false;
  bool is_integer_ = false;
  int64_t int_ = 0;
  double double_ = 0.0;
  std::string string_;
  std::vector<Value> elements_;                        // array elements, or object values
  std::vector<std::string> keys_;                      // object keys, parallel to elements_
  std::map<std::string, int64_t, std::less<>> index_;  // object key -> position
};

// Parses `text`; source_name (a file path, or "config.json") prefixes every error message, with
// the line and column, counting lines from `first_line` (a JSONL file's line number).
Value parse(std::string_view text, const std::string& source_name, int64_t first_line = 1);

// Appends `s` as a JSON string literal (with quotes and escapes) to out.
void append_quoted(std::string& out, std::string_view s);

}  // namespace mw::json
