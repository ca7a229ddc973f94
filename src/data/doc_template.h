// How a record of a structured corpus (a .jsonl line, a .json element, a .csv/.tsv row) becomes a
// document's text: one field (`--field NAME`) or a template of several (`--template`).
//
// Note [Document templates]: the data a person fine-tunes on is rarely one text field. OpenAI's
// fine-tuning files are {"prompt": ..., "completion": ...}, Alpaca's records hold "instruction",
// "input" and "output", a CSV export has a question and an answer column; with one field the model
// learned the answers without their questions, or the user wrote a jq or pandas step first. A
// template is text with {name} placeholders, each replaced by that field of the record:
//   --template '### Question:\n{question}\n\n### Answer:\n{answer}'
// \n, \t and \\ are a newline, a tab and a backslash (a shell's single quotes keep them as
// typed), {{ and }} are literal braces. A field that is a string is its text, a number or a bool
// its JSON spelling, null the empty text (HF datasets write null for a missing value); a field
// the record lacks, an array or an object is an error naming the record and what it has. A
// template without a placeholder would make every document the same text and is refused.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mw::data {

class DocumentTemplate {
 public:
  // `--field NAME`: the document is that field alone (it must be a string: Note [JSON arrays]).
  static DocumentTemplate field(std::string name);
  // `--template SPEC`; InvalidArgument naming what is wrong and where.
  static DocumentTemplate parse(std::string_view spec);

  // The fields the template names, each once, in order of first use.
  const std::vector<std::string>& fields() const { return fields_; }
  bool is_single_field() const { return single_; }
  // How the user named it, for messages: "--field text" or "--template '...'".
  const std::string& option() const { return option_; }

  // The text of a record whose fields()[i] has the text values[i].
  void render(const std::vector<std::string_view>& values, std::string& out) const;

 private:
  struct Part {
    std::string text;  // literal text, when field < 0
    int field = -1;    // index into fields_
  };
  std::vector<Part> parts_;
  std::vector<std::string> fields_;
  std::string option_;
  bool single_ = false;
};

}  // namespace mw::data
