// HF config.json for GPT-2: reading with every field accounted for, and writing.
//
// Note [GPT2Config fields]: transformers' GPT2Config (and the PretrainedConfig keys such files
// carry) is walked as one table, kFields. Each field is one of:
// - Honoured: read into Config and used (the shapes, n_inner, the dropouts, layer_norm_epsilon,
//   initializer_range, activation_function when it means tanh-GELU, the token ids);
// - Fixed: memwall implements only one value (scale_attn_weights true, scale_attn_by_inverse_
//   layer_idx false, reorder_and_upcast_attn false, tie_word_embeddings true, ...); any other
//   value is refused with an error naming the field, because loading would silently compute a
//   different model;
// - Inert: no effect on the language model's function (the double-heads model's summary_* head,
//   use_cache, generation settings, labels, bookkeeping); only its JSON type is checked.
// A value of the wrong type, or one outside its range, is a FormatError naming the file and the
// field; a missing field takes GPT2Config's default, as HF does. Keys outside the table are
// collected in Config::unknown_fields for the caller to warn about. tests/gpt2/config_test.cpp
// walks the full GPT2Config list.
#include <functional>

#include "core/error.h"
#include "data/file_io.h"
#include "data/json.h"
#include "models/gpt2/config.h"

namespace mw::gpt2 {

namespace {

using json::Value;

enum class Type { Int, IntOrNull, IdOrIds, Number, Bool, String, StringOrNull, Array, Object, Any };

// bos/eos_token_id: an integer, null (-1: none), or a non-empty list of integers (its first).
int64_t first_id(const Value& v) {
  if (v.is_null()) return -1;
  return v.is_integer() ? v.as_int() : v.elements().front().as_int();
}

// eos_token_id as read: an id, null, or the list of ids.
Value eos_json(const Config& c) {
  if (c.eos_token_id < 0) return Value(nullptr);
  if (c.more_eos_token_ids.empty()) return Value(c.eos_token_id);
  Value ids = Value::array();
  ids.push_back(Value(c.eos_token_id));
  for (int64_t id : c.more_eos_token_ids) ids.push_back(Value(id));
  return ids;
}

bool is_id_list(const Value& v) {
  if (!v.is_array() || v.elements().empty()) return false;
  for (const Value& x : v.elements())
    if (!x.is_integer()) return false;
  return true;
}

bool has_type(const Value& v, Type t) {
  switch (t) {
    case Type::Int: return v.is_integer();
    case Type::IntOrNull: return v.is_integer() || v.is_null();
    case Type::IdOrIds: return v.is_integer() || v.is_null() || is_id_list(v);
    case Type::Number: return v.is_number();
    case Type::Bool: return v.is_bool();
    case Type::String: return v.is_string();
    case Type::StringOrNull: return v.is_string() || v.is_null();
    case Type::Array: return v.is_array();
    case Type::Object: return v.is_object();
    case Type::Any: return true;
  }
  return false;
}

const char* type_text(Type t) {
  switch (t) {
    case Type::Int: return "an integer";
    case Type::IntOrNull: return "an integer or null";
    case Type::IdOrIds: return "an integer, null or a list of integers";
    case Type::Number: return "a number";
    case Type::Bool: return "true or false";
    case Type::String: return "a string";
    case Type::StringOrNull: return "a string or null";
    case Type::Array: return "an array";
    case Type::Object: return "an object";
    case Type::Any: return "any value";
  }
  return "?";
}

struct Field {
  const char* name;
  Type type;
  // Honoured: stores the value (after the type check); Fixed: returns "" when the value is the one
  // memwall implements, else why not; Inert: null.
  std::function<void(const Value&, Config&)> honour;
  std::function<std::string(const Value&)> fixed;
};

Field honoured(const char* name, Type type, std::function<void(const Value&, Config&)> set) {
  return {name, type, std::move(set), nullptr};
}
Field fixed(const char* name, Type type, std::function<std::string(const Value&)> check) {
  return {name, type, nullptr, std::move(check)};
}
Field inert(const char* name, Type type) { return {name, type, nullptr, nullptr}; }

std::string require_bool(const Value& v, bool want, const char* why) {
  return v.as_bool() == want ? "" : why;
}

std::string activation_check(const Value& v) {
  const std::string& a = v.as_string();
  // transformers' NewGELU, PytorchGELUTanh, FastGELU and AccurateGELU: one tanh formula.
  if (a == "gelu_new" || a == "gelu_pytorch_tanh" || a == "gelu_fast" || a == "gelu_accurate")
    return "";
  return "\"" + a +
         "\" is not supported; memwall implements the tanh-approximated GELU (gelu_new, "
         "gelu_pytorch_tanh, gelu_fast, gelu_accurate)";
}

const std::vector<Field>& fields() {
  static const std::vector<Field> kFields = {
      // GPT2Config.__init__, in its order.
      honoured("vocab_size", Type::Int,
               [](const Value& v, Config& c) { c.vocab_size = v.as_int(); }),
      honoured("n_positions", Type::Int,
               [](const Value& v, Config& c) { c.n_positions = v.as_int(); }),
      honoured("n_embd", Type::Int, [](const Value& v, Config& c) { c.n_embd = v.as_int(); }),
      honoured("n_layer", Type::Int, [](const Value& v, Config& c) { c.n_layer = v.as_int(); }),
      honoured("n_head", Type::Int, [](const Value& v, Config& c) { c.n_head = v.as_int(); }),
      honoured("n_inner", Type::IntOrNull,
               [](const Value& v, Config& c) {
                 c.n_inner = v.is_null() ? 0 : v.as_int();
                 MW_CHECK_T(InvalidArgument, v.is_null() || c.n_inner > 0, "must be positive");
               }),
      fixed("activation_function", Type::String, activation_check),
      honoured("resid_pdrop", Type::Number,
               [](const Value& v, Config& c) { c.resid_pdrop = v.as_double(); }),
      honoured("embd_pdrop", Type::Number,
               [](const Value& v, Config& c) { c.embd_pdrop = v.as_double(); }),
      honoured("attn_pdrop", Type::Number,
               [](const Value& v, Config& c) { c.attn_pdrop = v.as_double(); }),
      honoured("layer_norm_epsilon", Type::Number,
               [](const Value& v, Config& c) { c.layer_norm_epsilon = v.as_double(); }),
      honoured("initializer_range", Type::Number,
               [](const Value& v, Config& c) { c.initializer_range = v.as_double(); }),
      inert("summary_type", Type::StringOrNull),
      inert("summary_use_proj", Type::Bool),
      inert("summary_activation", Type::StringOrNull),
      inert("summary_proj_to_labels", Type::Bool),
      inert("summary_first_dropout", Type::Number),
      fixed("scale_attn_weights", Type::Bool,
            [](const Value& v) {
              return require_bool(v, true,
                                  "false is not supported: memwall always scales "
                                  "attention scores by 1/sqrt(head dim)");
            }),
      inert("use_cache", Type::Bool),
      // An id, null, or a list of ids (transformers allows several end tokens): bos the first,
      // eos all of them (generate stops at any).
      honoured("bos_token_id", Type::IdOrIds,
               [](const Value& v, Config& c) { c.bos_token_id = first_id(v); }),
      honoured("eos_token_id", Type::IdOrIds,
               [](const Value& v, Config& c) {
                 c.eos_token_id = first_id(v);
                 c.more_eos_token_ids.clear();
                 if (v.is_array())
                   for (size_t i = 1; i < v.elements().size(); ++i)
                     c.more_eos_token_ids.push_back(v.elements()[i].as_int());
               }),
      fixed("scale_attn_by_inverse_layer_idx", Type::Bool,
            [](const Value& v) {
              return require_bool(v, false,
                                  "true is not supported: memwall does not divide "
                                  "attention scores by the layer index");
            }),
      fixed("reorder_and_upcast_attn", Type::Bool,
            [](const Value& v) {
              return require_bool(v, false,
                                  "true is not supported: memwall does not implement "
                                  "the reordered, upcast attention");
            }),
      // GPT2Config's attribute_map aliases: refused, to keep one spelling per field.
      fixed("hidden_size", Type::Any, [](const Value&) { return "write it as n_embd"; }),
      fixed("max_position_embeddings", Type::Any,
            [](const Value&) { return "write it as n_positions"; }),
      fixed("num_attention_heads", Type::Any, [](const Value&) { return "write it as n_head"; }),
      fixed("num_hidden_layers", Type::Any, [](const Value&) { return "write it as n_layer"; }),
      // PretrainedConfig keys that change the model: only GPT-2's own values.
      fixed("model_type", Type::String,
            [](const Value& v) {
              return v.as_string() == "gpt2" ? "" : "\"" + v.as_string() + "\" is not gpt2";
            }),
      fixed("tie_word_embeddings", Type::Bool,
            [](const Value& v) {
              return require_bool(v, true, "false is not supported: GPT-2's head is tied to wte");
            }),
      fixed("add_cross_attention", Type::Bool,
            [](const Value& v) {
              return require_bool(v, false, "true is not supported (no encoder-decoder GPT-2)");
            }),
      fixed("is_encoder_decoder", Type::Bool,
            [](const Value& v) { return require_bool(v, false, "true is not supported"); }),
      fixed("pruned_heads", Type::Object,
            [](const Value& v) {
              return v.size() == 0 ? "" : "pruned attention heads are not supported";
            }),
      fixed("chunk_size_feed_forward", Type::Int,
            [](const Value& v) {
              return v.as_int() == 0 ? ""
                                     : "chunked feed-forward is not "
                                       "supported; use 0";
            }),
      // Written by old GPT-2 configs; HF ignores it, and so does memwall since session 38 (it
      // refused a folder whose n_ctx differed from n_positions, which transformers loads).
      inert("n_ctx", Type::Int),
      // Bookkeeping, generation settings and labels: no effect on the language model.
      inert("architectures", Type::Array),
      inert("transformers_version", Type::String),
      inert("torch_dtype", Type::StringOrNull),
      inert("dtype", Type::StringOrNull),  // newer transformers' name for torch_dtype
      inert("_name_or_path", Type::String),
      inert("task_specific_params", Type::Any),
      inert("pad_token_id", Type::IntOrNull),
      inert("sep_token_id", Type::IntOrNull),
      inert("decoder_start_token_id", Type::IntOrNull),
      inert("id2label", Type::Object),
      inert("label2id", Type::Object),
      inert("num_labels", Type::Int),
      inert("_num_labels", Type::Int),
      inert("problem_type", Type::StringOrNull),
      inert("finetuning_task", Type::StringOrNull),
      inert("tokenizer_class", Type::StringOrNull),
      inert("prefix", Type::StringOrNull),
      inert("output_hidden_states", Type::Bool),
      inert("output_attentions", Type::Bool),
      inert("return_dict", Type::Bool),
      inert("torchscript", Type::Bool),
      inert("is_decoder", Type::Bool),
      inert("use_return_dict", Type::Bool),
      inert("gradient_checkpointing", Type::Bool),
      inert("max_length", Type::Int),
      inert("do_sample", Type::Bool),
      inert("temperature", Type::Number),
      inert("top_k", Type::Int),
      inert("top_p", Type::Number),
  };
  return kFields;
}

const Field* find_field(const std::string& name) {
  for (const Field& f : fields())
    if (name == f.name) return &f;
  return nullptr;
}

}  // namespace

Config Config::from_json_file(const std::string& path) {
  return from_json_text(
      data::read_text_file(path, "config.json",
                           "expected a HuggingFace GPT-2 config.json (a regular file)"),
      path);
}

Config Config::from_json_text(const std::string& text, const std::string& path) {
  Value v = json::parse(text, path);
  MW_CHECK_T(FormatError, v.is_object(), path, ": expected a JSON object, found ", v.describe());
  Config c;
  for (const char* required : {"n_layer", "n_head", "n_embd", "vocab_size", "n_positions"})
    MW_CHECK_T(FormatError, v.contains(required), path, ": missing \"", required,
               "\"; a GPT-2 config.json names every shape");
  for (int64_t i = 0; i < v.size(); ++i) {
    const std::string& key = v.key(i);
    const Value& value = v.value(i);
    const Field* f = find_field(key);
    if (!f) {
      c.unknown_fields.push_back(key);
      continue;
    }
    MW_CHECK_T(FormatError, has_type(value, f->type), path, ": field \"", key, "\": expected ",
               type_text(f->type), ", found ", value.describe());
    try {
      if (f->honour) f->honour(value, c);
      if (f->fixed) {
        const std::string why = f->fixed(value);
        MW_CHECK_T(FormatError, why.empty(), path, ": field \"", key, "\" = ", value.dump(), ": ",
                   why);
      }
    } catch (const InvalidArgument& e) {
      throw FormatError(str(path, ": field \"", key, "\" = ", value.dump(), ": ", e.what()));
    }
  }
  try {
    c.validate();
  } catch (const InvalidArgument& e) {
    throw FormatError(str(path, ": ", e.what()));
  }
  return c;
}

std::string Config::to_json(const std::string& torch_dtype) const {
  Value v = Value::object();
  v.set("model_type", "gpt2");
  Value arch = Value::array();
  arch.push_back("GPT2LMHeadModel");
  v.set("architectures", arch);
  v.set("n_layer", n_layer);
  v.set("n_head", n_head);
  v.set("n_embd", n_embd);
  v.set("n_inner", n_inner > 0 ? Value(n_inner) : Value(nullptr));
  v.set("vocab_size", vocab_size);
  v.set("n_positions", n_positions);
  v.set("n_ctx", n_positions);
  v.set("layer_norm_epsilon", layer_norm_epsilon);
  v.set("initializer_range", initializer_range);
  v.set("activation_function", "gelu_new");
  v.set("embd_pdrop", embd_pdrop);
  v.set("attn_pdrop", attn_pdrop);
  v.set("resid_pdrop", resid_pdrop);
  v.set("scale_attn_weights", true);
  v.set("scale_attn_by_inverse_layer_idx", false);
  v.set("reorder_and_upcast_attn", false);
  v.set("bos_token_id", bos_token_id >= 0 ? Value(bos_token_id) : Value(nullptr));
  v.set("eos_token_id", eos_json(*this));
  v.set("tie_word_embeddings", true);
  v.set("torch_dtype", torch_dtype);
  return v.dump() + "\n";
}

void Config::to_json_file(const std::string& path) const {
  const std::string text = to_json();
  data::write_file_atomically(path, {{text.data(), static_cast<int64_t>(text.size())}},
                              "pass --save a writable directory");
}

std::string Config::generation_config_json() const {
  Value v = Value::object();
  v.set("_from_model_config", true);
  v.set("bos_token_id", bos_token_id >= 0 ? Value(bos_token_id) : Value(nullptr));
  v.set("eos_token_id", eos_json(*this));
  return v.dump() + "\n";
}

}  // namespace mw::gpt2
