// GPT-2 construction from the tensor table, HF initialisation, and the forward pass.
#include "models/gpt2/model.h"

#include <cmath>

#include "core/parallel.h"

namespace mw::gpt2 {

namespace {

// Fills t per its Init with draws (seed, offset..offset+numel) of the counter-based generator, so
// initialisation is deterministic and independent of the thread count.
void initialise(Tensor& t, Init init, RngState rng, const Config& c) {
  const double range = c.initializer_range;  // 0.02 for GPT-2
  double stddev = init == Init::NormalResidProj
                      ? range / std::sqrt(2.0 * static_cast<double>(c.n_layer))
                      : range;
  if (init == Init::Zeros) return t.fill_(0.0);
  if (init == Init::Ones) return t.fill_(1.0);
  if (!t.device().is_host_addressable()) {  // draw on the host, then copy: the same values
    Tensor host = Tensor::empty(t.shape(), t.dtype(), Device::cpu());
    initialise(host, init, rng, c);
    return t.copy_(host);
  }
  dispatch_float(t.dtype(), "init", [&]<typename T>() {
    T* p = t.template data<T>();
    parallel_for(t.numel(), 1 << 14, [&](int64_t b, int64_t e) {
      fill_normal(p + b, static_cast<uint64_t>(b), static_cast<uint64_t>(e), rng, stddev);
    });
  });
}

}  // namespace

GPT2::GPT2(const Config& config, uint64_t seed, DType dtype, Device device,
           const ParameterFactory& factory)
    : config_(config), specs_(tensor_specs(config)) {
  config_.validate();
  Generator gen(seed);
  for (const auto& spec : specs_) {
    Tensor t = factory.make ? factory.make(spec) : Tensor::empty(spec.shape, dtype, device);
    MW_CHECK_T(ShapeError, t.shape() == spec.shape && t.dtype() == dtype && t.is_contiguous(),
               "GPT2: the parameter factory made ", t.desc(), " for '", spec.name, "' (",
               shape_str(spec.shape), ")");
    const RngState rng = gen.reserve(static_cast<uint64_t>(t.numel()));
    if (!factory.fill || !factory.fill(spec, t)) initialise(t, spec.init, rng, config_);
    if (factory.ready) factory.ready(spec);
    by_name_.emplace(spec.name, t);
  }
  auto p = [&](const std::string& name) { return by_name_.at(name); };
  auto transformer = register_module("transformer", std::make_shared<nn::Container>("GPT2Model"));
  wte_ = transformer->register_module("wte",
                                      std::make_shared<nn::Embedding>(p("transformer.wte.weight")));
  wpe_ = transformer->register_module("wpe",
                                      std::make_shared<nn::Embedding>(p("transformer.wpe.weight")));
  drop_ = transformer->register_module("drop", std::make_shared<nn::Dropout>(config_.embd_pdrop));
  auto h = transformer->register_module("h", std::make_shared<nn::Container>("ModuleList"));
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    const std::string b = "transformer.h." + std::to_string(i) + ".";
    auto ln_1 = std::make_shared<nn::LayerNorm>(p(b + "ln_1.weight"), p(b + "ln_1.bias"),
                                                config_.layer_norm_epsilon);
    auto attn = std::make_shared<nn::CausalSelfAttention>(
        std::make_shared<nn::Linear>(p(b + "attn.c_attn.weight"), p(b + "attn.c_attn.bias")),
        std::make_shared<nn::Linear>(p(b + "attn.c_proj.weight"), p(b + "attn.c_proj.bias")),
        config_.n_head, config_.attn_pdrop, config_.resid_pdrop);
    auto ln_2 = std::make_shared<nn::LayerNorm>(p(b + "ln_2.weight"), p(b + "ln_2.bias"),
                                                config_.layer_norm_epsilon);
    auto mlp = std::make_shared<nn::Mlp>(
        std::make_shared<nn::Linear>(p(b + "mlp.c_fc.weight"), p(b + "mlp.c_fc.bias")),
        std::make_shared<nn::Linear>(p(b + "mlp.c_proj.weight"), p(b + "mlp.c_proj.bias")),
        config_.resid_pdrop);
    blocks_.push_back(
        h->register_module(std::to_string(i), std::make_shared<nn::Block>(ln_1, attn, ln_2, mlp)));
  }
  ln_f_ = transformer->register_module(
      "ln_f",
      std::make_shared<nn::LayerNorm>(p("transformer.ln_f.weight"), p("transformer.ln_f.bias"),
                                      config_.layer_norm_epsilon));
  // HF's lm_head: the same tensor as wte, so named_parameters() lists it once (as HF does).
  lm_head_ = register_module("lm_head", std::make_shared<nn::LMHead>(wte_->weight));
}

const Tensor& GPT2::parameter(const std::string& hf_name) const {
  auto it = by_name_.find(hf_name);
  MW_CHECK_T(InvalidArgument, it != by_name_.end(), "GPT-2 has no parameter '", hf_name, "'");
  return it->second;
}

int64_t GPT2::num_parameters() const { return gpt2::num_parameters(config_); }

Tensor GPT2::forward(const Tensor& ids) {
  MW_CHECK_T(ShapeError, ids.dim() == 2, "GPT2: expected token ids [B, T], got ", ids.desc());
  const int64_t T = ids.size(1);
  MW_CHECK_T(ShapeError, T <= config_.n_positions, "GPT2: sequence length ", T,
             " exceeds n_positions ", config_.n_positions, "; lower --seq");
  if (!positions_.defined() || positions_.numel() != T || positions_.device() != ids.device()) {
    std::vector<int32_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(t);
    positions_ = Tensor::from_vector(pos, {T}, ids.device());
  }
  // [B, T, C] + [T, C], broadcast over the batch. Every parameter use is a module call (Note
  // [Every parameter use is a module call], nn/module.h).
  // Sequenced, so hooks see wte before wpe (an argument list's order is unspecified).
  Tensor tok = (*wte_)(ids);
  Tensor x = add(tok, (*wpe_)(positions_));
  x = (*drop_)(x);
  for (size_t i = 0; i < blocks_.size(); ++i)
    x = run_block ? run_block(*blocks_[i], static_cast<int64_t>(i), x) : (*blocks_[i])(x);
  x = (*ln_f_)(x);
  return (*lm_head_)(x);
}

}  // namespace mw::gpt2
