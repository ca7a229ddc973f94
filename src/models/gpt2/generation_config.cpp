// read_generation_defaults (Note [Generation defaults], generation_config.h).
#include "models/gpt2/generation_config.h"

#include <filesystem>

#include "core/error.h"
#include "core/numbers.h"
#include "data/file_io.h"
#include "data/json.h"

namespace mw::gpt2 {

GenerationDefaults read_generation_defaults(const std::string& dir) {
  GenerationDefaults d;
  const std::string path = (std::filesystem::path(dir) / "generation_config.json").string();
  if (!std::filesystem::exists(path)) return d;
  const json::Value v =
      json::parse(data::read_text_file(path, "generation_config.json", "fix or remove it"), path);
  MW_CHECK_T(FormatError, v.is_object(), path, ": expected a JSON object");
  auto number = [&](const char* key) -> std::optional<double> {
    const json::Value* x = v.find(key);
    if (x == nullptr || x->is_null()) return std::nullopt;
    MW_CHECK_T(FormatError, x->is_number(), path, ": \"", key, "\" must be a number, found ",
               x->describe());
    return x->as_double();
  };
  auto whole = [&](const char* key) -> std::optional<int64_t> {
    const json::Value* x = v.find(key);
    if (x == nullptr || x->is_null()) return std::nullopt;
    MW_CHECK_T(FormatError, x->is_integer() && x->as_int() >= 0, path, ": \"", key,
               "\" must be a non-negative integer, found ", x->describe());
    return x->as_int();
  };
  auto note = [&](const std::string& what) { d.said += (d.said.empty() ? "" : ", ") + what; };
  if (const json::Value* sample = v.find("do_sample"); sample && !sample->is_null()) {
    MW_CHECK_T(FormatError, sample->is_bool(), path,
               ": \"do_sample\" must be true or false, found ", sample->describe());
    if (!sample->as_bool()) {
      d.temperature = 0;
      note("do_sample false (greedy)");
    } else {  // transformers' defaults for what the file leaves out
      d.temperature = number("temperature").value_or(1.0);
      const json::Value* k = v.find("top_k");  // null: no top-k (HF's None); absent: 50
      d.top_k = k != nullptr && k->is_null() ? 0 : whole("top_k").value_or(50);
      d.top_p = number("top_p").value_or(1.0);
      note(str("do_sample true: temperature ", *d.temperature, ", top_k ", *d.top_k, ", top_p ",
               *d.top_p));
    }
  }
  if ((d.repetition_penalty = number("repetition_penalty")))
    note(str("repetition_penalty ", *d.repetition_penalty));
  if ((d.max_new_tokens = whole("max_new_tokens"))) note(str("max_new_tokens ", *d.max_new_tokens));
  if (const json::Value* eos = v.find("eos_token_id"); eos && !eos->is_null()) {
    std::vector<int64_t> ids;
    for (const json::Value& x :
         eos->is_array() ? eos->elements() : std::vector<json::Value>{*eos}) {
      MW_CHECK_T(FormatError, x.is_integer() && x.as_int() >= 0, path,
                 ": \"eos_token_id\" must be a token id or a list of them, found ",
                 eos->describe());
      ids.push_back(x.as_int());
    }
    MW_CHECK_T(FormatError, !ids.empty(), path, ": \"eos_token_id\" is an empty list");
    d.eos_token_ids = std::move(ids);
  }
  return d;
}

}  // namespace mw::gpt2
