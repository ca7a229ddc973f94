// Stop strings for streamed generation (gpt2_generate --stop; as OpenAI's `stop` and llama.cpp's
// reverse prompt: transformers' stop_strings also match one begun in the prompt, and keep it): a
// sample ends as soon as its generated text contains one of them, and the text printed is what
// came before it.
//
// Note [Stop strings]: the text is streamed token by token, and a token's text may hold the start
// of a stop string whose end is still to come ("\n" of a stop "\nQ:"), or a stop string may start
// or end inside a token. So StopStrings holds back the longest end of the text so far that is the
// beginning of some stop string (it may yet become one), and releases everything before it, which
// no stop string can begin (a stop starting there would make a longer such end). When the text
// first contains a stop string (the earliest end among all occurrences; of the occurrences ending
// there, the one starting first), the sample is cut at that occurrence's first byte: exactly the
// bytes before it have been released, and the rest is dropped. Held text is released when the
// sample ends for another reason (finish()). What is printed is therefore a function of the text
// alone, not of where its tokens split it, and is never printed twice or lost. Matching is on
// bytes: a stop string may cut a multi-byte character; the prompt is not matched.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mw::gpt2 {

class StopStrings {
 public:
  // Each stop string non-empty (an empty one would end every sample before its first token):
  // InvalidArgument otherwise. No stop strings: every text is released as it comes.
  explicit StopStrings(std::vector<std::string> stops);

  // Appends a token's text; returns the text now safe to print (Note [Stop strings]). When the text
  // reaches a stop string, stopped() turns true and what is returned ends before it; the sample
  // then ends, and another push() is an InvalidArgument.
  std::string push(std::string_view token_text);
  // The sample ended for another reason (max tokens, <|endoftext|>): the held text, which is no
  // stop string's beginning after all. Empty after a stop.
  std::string finish();

  bool stopped() const { return matched_ >= 0; }
  // The stop string the sample stopped at (as the user meant it, escapes read); stopped() only.
  const std::string& matched() const { return stops_.at(static_cast<size_t>(matched_)); }
  // Bytes held back now, for tests and messages.
  size_t held_bytes() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // the end of the text that some stop string begins with
  int matched_ = -1;  // index into stops_, -1 while none
};

// A stop string as typed on a command line, with the escapes of --template (Note [Document
// templates]): \n, \t and \\ are a newline, a tab and a backslash; any other backslash is itself.
std::string unescape_stop_string(std::string_view typed);
// The inverse, for messages: newlines, tabs and backslashes written \n, \t and \\ (what to type
// between a shell's single quotes; unescape_stop_string reads it back).
std::string escape_stop_string(std::string_view text);

}  // namespace mw::gpt2
