// Stop strings for streamed generation; see stop_strings.h (Note [Stop strings]).
#include "models/gpt2/stop_strings.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace mw::gpt2 {

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (size_t i = 0; i < stops_.size(); ++i)
    MW_CHECK_T(InvalidArgument, !stops_[i].empty(), "stop string ", i + 1, " of ", stops_.size(),
               " is empty: it would end every sample before its first token; pass the text to "
               "stop at, or no stop string");
}

std::string StopStrings::push(std::string_view token_text) {
  MW_CHECK_T(InvalidArgument, !stopped(), "the sample already stopped at a stop string; ",
             "a new sample needs a new StopStrings");
  held_ += token_text;
  // The first stop string the text holds: the earliest end, then (ending there) the earliest
  // start. held_ begins where a stop string could begin (Note [Stop strings]), and held no whole
  // one before this token, so each stop string's first occurrence in it is the one to compare.
  size_t cut = std::string::npos, end = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t at = held_.find(stops_[i]);
    if (at == std::string::npos) continue;
    const size_t at_end = at + stops_[i].size();
    if (at_end < end || (at_end == end && at < cut)) {
      end = at_end;
      cut = at;
      matched_ = static_cast<int>(i);
    }
  }
  if (stopped()) {
    std::string before = held_.substr(0, cut);
    held_.clear();
    return before;
  }
  // Hold back the longest end of the text that some stop string begins with; release the rest.
  size_t keep = held_.size();
  for (; keep > 0; --keep) {
    const std::string_view tail = std::string_view(held_).substr(held_.size() - keep);
    if (std::any_of(stops_.begin(), stops_.end(),
                    [&](const std::string& s) { return std::string_view(s).starts_with(tail); }))
      break;
  }
  std::string released = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return released;
}

std::string StopStrings::finish() { return std::exchange(held_, std::string()); }

std::string unescape_stop_string(std::string_view typed) {
  std::string text;
  for (size_t i = 0; i < typed.size(); ++i) {
    const char next = i + 1 < typed.size() ? typed[i + 1] : '\0';
    if (typed[i] == '\\' && (next == 'n' || next == 't' || next == '\\')) {
      text += next == 'n' ? '\n' : next == 't' ? '\t' : '\\';
      ++i;
    } else {
      text += typed[i];
    }
  }
  return text;
}

std::string escape_stop_string(std::string_view text) {
  std::string typed;
  for (const char c : text) {
    if (c == '\n')
      typed += "\\n";
    else if (c == '\t')
      typed += "\\t";
    else if (c == '\\')
      typed += "\\\\";
    else
      typed += c;
  }
  return typed;
}

}  // namespace mw::gpt2
