// GPT-2 presets, validation, and HF config.json reading and writing.
#include "models/gpt2/config.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/json.h"

namespace mw::gpt2 {

Config Config::preset(const std::string& name) {
  Config c;
  if (name == "small") return c;
  if (name == "medium") {
    c.n_layer = 24;
    c.n_head = 16;
    c.n_embd = 1024;
    return c;
  }
  if (name == "large") {
    c.n_layer = 36;
    c.n_head = 20;
    c.n_embd = 1280;
    return c;
  }
  if (name == "xl") {
    c.n_layer = 48;
    c.n_head = 25;
    c.n_embd = 1600;
    return c;
  }
  if (name == "tiny") {
    c.n_layer = 2;
    c.n_head = 4;
    c.n_embd = 32;
    c.vocab_size = 97;
    c.n_positions = 32;
    return c;
  }
  throw InvalidArgument(
      str("unknown GPT-2 preset '", name, "': expected tiny, small, medium, large or xl"));
}

void Config::validate() const {
  MW_CHECK_T(
      InvalidArgument, n_layer > 0 && n_head > 0 && n_embd > 0 && vocab_size > 0 && n_positions > 0,
      "GPT-2 config: n_layer, n_head, n_embd, vocab_size and n_positions must be positive (got ",
      n_layer, ", ", n_head, ", ", n_embd, ", ", vocab_size, ", ", n_positions, ")");
  MW_CHECK_T(InvalidArgument, n_embd % n_head == 0, "GPT-2 config: n_embd ", n_embd,
             " is not divisible by n_head ", n_head);
  MW_CHECK_T(InvalidArgument, layer_norm_epsilon > 0,
             "GPT-2 config: layer_norm_epsilon must be > 0");
  for (double p : {embd_pdrop, attn_pdrop, resid_pdrop})
    MW_CHECK_T(InvalidArgument, p >= 0 && p < 1, "GPT-2 config: dropout ", p, " must be in [0, 1)");
}

Config Config::from_json_file(const std::string& path) {
  std::ifstream in(path);
  MW_CHECK_T(IoError, in.good(), "cannot open '", path,
             "': expected a HuggingFace GPT-2 config.json there");
  std::stringstream ss;
  ss << in.rdbuf();
  json::Value v = json::parse(ss.str(), path);
  MW_CHECK_T(FormatError, v.is_object(), path, ": expected a JSON object");
  Config c;
  auto get_int = [&](const char* key, int64_t& field, bool required) {
    if (const json::Value* f = v.find(key))
      field = f->as_int();
    else
      MW_CHECK_T(FormatError, !required, path, ": missing \"", key, "\"");
  };
  auto get_double = [&](const char* key, double& field) {
    if (const json::Value* f = v.find(key); f && f->is_number()) field = f->as_double();
  };
  get_int("n_layer", c.n_layer, true);
  get_int("n_head", c.n_head, true);
  get_int("n_embd", c.n_embd, true);
  get_int("vocab_size", c.vocab_size, true);
  get_int("n_positions", c.n_positions, true);
  get_double("layer_norm_epsilon", c.layer_norm_epsilon);
  get_double("embd_pdrop", c.embd_pdrop);
  get_double("attn_pdrop", c.attn_pdrop);
  get_double("resid_pdrop", c.resid_pdrop);
  if (const json::Value* f = v.find("activation_function"))
    MW_CHECK_T(FormatError, f->as_string() == "gelu_new", path, ": activation_function \"",
               f->as_string(), "\" is not supported; memwall implements GPT-2's gelu_new");
  try {
    c.validate();
  } catch (const InvalidArgument& e) {
    throw FormatError(str(path, ": ", e.what()));
  }
  return c;
}

void Config::to_json_file(const std::string& path) const {
  json::Value v = json::Value::object();
  v.set("model_type", "gpt2");
  json::Value arch = json::Value::array();
  arch.push_back("GPT2LMHeadModel");
  v.set("architectures", arch);
  v.set("n_layer", n_layer);
  v.set("n_head", n_head);
  v.set("n_embd", n_embd);
  v.set("vocab_size", vocab_size);
  v.set("n_positions", n_positions);
  v.set("n_ctx", n_positions);
  v.set("layer_norm_epsilon", layer_norm_epsilon);
  v.set("activation_function", "gelu_new");
  v.set("embd_pdrop", embd_pdrop);
  v.set("attn_pdrop", attn_pdrop);
  v.set("resid_pdrop", resid_pdrop);
  v.set("tie_word_embeddings", true);
  std::ofstream out(path);
  MW_CHECK_T(IoError, out.good(), "cannot write '", path, "': ", errno_text(errno),
             "; pass --save a writable directory");
  out << v.dump() << "\n";
  out.close();
  MW_CHECK_T(IoError, out.good(), "writing '", path, "' failed: ", errno_text(errno));
}

}  // namespace mw::gpt2
