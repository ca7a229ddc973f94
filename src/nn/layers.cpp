// Layer constructors and forwards (layers.h).
#include "nn/layers.h"

namespace mw::nn {

Embedding::Embedding(Tensor w) {
  MW_CHECK_T(ShapeError, w.dim() == 2, "Embedding: weight must be [V, C], got ", w.desc());
  weight = register_parameter("weight", std::move(w));
}

LMHead::LMHead(Tensor w) {
  MW_CHECK_T(ShapeError, w.dim() == 2, "LMHead: weight must be [V, C], got ", w.desc());
  weight = register_parameter("weight", std::move(w));
}

Linear::Linear(Tensor w, Tensor b) {
  MW_CHECK_T(ShapeError, w.dim() == 2, "Linear: weight must be [in, out], got ", w.desc());
  weight = register_parameter("weight", std::move(w));
  if (b.defined()) {
    MW_CHECK_T(ShapeError, b.dim() == 1 && b.size(0) == weight.size(1), "Linear: bias ", b.desc(),
               " does not fit weight ", weight.desc());
    bias = register_parameter("bias", std::move(b));
  }
}

LayerNorm::LayerNorm(Tensor w, Tensor b, double eps) : eps(eps) {
  weight = register_parameter("weight", std::move(w));
  bias = register_parameter("bias", std::move(b));
}

CausalSelfAttention::CausalSelfAttention(std::shared_ptr<Linear> c_attn_in,
                                         std::shared_ptr<Linear> c_proj_in, int64_t n_head,
                                         double attn_dropout, double resid_dropout)
    : n_head(n_head), attn_dropout(attn_dropout) {
  c_attn = register_module("c_attn", std::move(c_attn_in));
  c_proj = register_module("c_proj", std::move(c_proj_in));
  resid_drop = register_module("resid_dropout", std::make_shared<Dropout>(resid_dropout));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  Tensor qkv = (*c_attn)(x);
  Tensor y =
      causal_self_attention(qkv, n_head, is_training() ? attn_dropout : 0.0, default_generator());
  return (*resid_drop)((*c_proj)(y));
}

Mlp::Mlp(std::shared_ptr<Linear> c_fc_in, std::shared_ptr<Linear> c_proj_in, double dropout) {
  c_fc = register_module("c_fc", std::move(c_fc_in));
  act = register_module("act", std::make_shared<Gelu>());
  c_proj = register_module("c_proj", std::move(c_proj_in));
  drop = register_module("dropout", std::make_shared<Dropout>(dropout));
}

Tensor Mlp::forward(const Tensor& x) { return (*drop)((*c_proj)((*act)((*c_fc)(x)))); }

Block::Block(std::shared_ptr<LayerNorm> l1, std::shared_ptr<CausalSelfAttention> a,
             std::shared_ptr<LayerNorm> l2, std::shared_ptr<Mlp> m) {
  ln_1 = register_module("ln_1", std::move(l1));
  attn = register_module("attn", std::move(a));
  ln_2 = register_module("ln_2", std::move(l2));
  mlp = register_module("mlp", std::move(m));
}

Tensor Block::forward(const Tensor& x) {
  Tensor h = add(x, (*attn)((*ln_1)(x)));
  return add(h, (*mlp)((*ln_2)(h)));
}

}  // namespace mw::nn
