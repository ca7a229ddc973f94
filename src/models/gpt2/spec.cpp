// GPT-2's tensor table (spec.h).
#include "models/gpt2/spec.h"

namespace mw::gpt2 {

std::vector<TensorSpec> tensor_specs(const Config& c) {
  const int64_t C = c.n_embd, F = c.mlp_width();  // F: the MLP's inner width
  std::vector<TensorSpec> s;
  s.push_back({"transformer.wte.weight", {c.vocab_size, C}, Init::Normal});
  s.push_back({"transformer.wpe.weight", {c.n_positions, C}, Init::Normal});
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    s.push_back({p + "ln_1.weight", {C}, Init::Ones});
    s.push_back({p + "ln_1.bias", {C}, Init::Zeros});
    s.push_back({p + "attn.c_attn.weight", {C, 3 * C}, Init::Normal});
    s.push_back({p + "attn.c_attn.bias", {3 * C}, Init::Zeros});
    s.push_back({p + "attn.c_proj.weight", {C, C}, Init::NormalResidProj});
    s.push_back({p + "attn.c_proj.bias", {C}, Init::Zeros});
    s.push_back({p + "ln_2.weight", {C}, Init::Ones});
    s.push_back({p + "ln_2.bias", {C}, Init::Zeros});
    s.push_back({p + "mlp.c_fc.weight", {C, F}, Init::Normal});
    s.push_back({p + "mlp.c_fc.bias", {F}, Init::Zeros});
    s.push_back({p + "mlp.c_proj.weight", {F, C}, Init::NormalResidProj});
    s.push_back({p + "mlp.c_proj.bias", {C}, Init::Zeros});
  }
  s.push_back({"transformer.ln_f.weight", {C}, Init::Ones});
  s.push_back({"transformer.ln_f.bias", {C}, Init::Zeros});
  return s;
}

int64_t num_parameters(const Config& c) {
  int64_t n = 0;
  for (const auto& t : tensor_specs(c)) n += shape_numel(t.shape);
  return n;
}

bool read_only_by_products(const TensorSpec& spec) {
  return spec.shape.size() == 2 && spec.name.rfind("transformer.h.", 0) == 0;
}

std::vector<char> read_only_by_products(const Config& config) {
  std::vector<char> out;
  for (const TensorSpec& spec : tensor_specs(config)) out.push_back(read_only_by_products(spec));
  return out;
}

}  // namespace mw::gpt2
