// The layers GPT-2 is built from. Weights are passed in (models create them from their tensor
// table, models/gpt2/spec.h), so a layer never decides initialisation or placement.
#pragma once

#include "core/random.h"
#include "nn/module.h"

namespace mw::nn {

// A named group of modules with no computation of its own (HF's "transformer", "h").
class Container : public Module {
 public:
  explicit Container(std::string type = "Container") : type_(std::move(type)) {}
  Tensor forward(const Tensor&) override {
    throw InvalidArgument(str(type_, " is a container; call its children"));
  }
  std::string type_name() const override { return type_; }

 private:
  std::string type_;
};

// out = weight[ids]; weight [V, C].
class Embedding : public Module {
 public:
  explicit Embedding(Tensor weight);
  Tensor forward(const Tensor& ids) override { return embedding(weight, ids); }
  std::string type_name() const override { return "Embedding"; }
  Tensor weight;
};

// logits [..., V] = x [..., C] @ weight[V, C]^T: the LM head, tied to the token embedding's weight
// (the same Tensor, owned by both modules: Note [Every parameter use is a module call]).
class LMHead : public Module {
 public:
  explicit LMHead(Tensor weight);
  Tensor forward(const Tensor& x) override { return lm_head(x, weight); }
  std::string type_name() const override { return "LMHead"; }
  Tensor weight;
};

// y = x @ weight + bias, weight [in, out] (HF Conv1D layout).
class Linear : public Module {
 public:
  Linear(Tensor weight, Tensor bias);
  Tensor forward(const Tensor& x) override { return linear(x, weight, bias); }
  std::string type_name() const override { return "Linear"; }
  Tensor weight, bias;
};

class LayerNorm : public Module {
 public:
  LayerNorm(Tensor weight, Tensor bias, double eps);
  Tensor forward(const Tensor& x) override { return layernorm(x, weight, bias, eps); }
  std::string type_name() const override { return "LayerNorm"; }
  Tensor weight, bias;
  double eps;
};

class Gelu : public Module {
 public:
  Tensor forward(const Tensor& x) override { return gelu(x); }
  std::string type_name() const override { return "GELU"; }
};

// Inverted dropout drawing from default_generator(); the identity in eval mode or with p = 0.
class Dropout : public Module {
 public:
  explicit Dropout(double p) : p(p) {}
  Tensor forward(const Tensor& x) override {
    return is_training() && p > 0 ? dropout(x, p, default_generator()) : x;
  }
  std::string type_name() const override { return "Dropout"; }
  double p;
};

// c_attn -> causal attention (with attention-probability dropout) -> c_proj -> residual dropout.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(std::shared_ptr<Linear> c_attn, std::shared_ptr<Linear> c_proj,
                      int64_t n_head, double attn_dropout, double resid_dropout);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "CausalSelfAttention"; }
  std::shared_ptr<Linear> c_attn, c_proj;
  std::shared_ptr<Dropout> resid_drop;
  int64_t n_head;
  double attn_dropout;
};

// c_fc -> GELU -> c_proj -> dropout.
class Mlp : public Module {
 public:
  Mlp(std::shared_ptr<Linear> c_fc, std::shared_ptr<Linear> c_proj, double dropout);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "MLP"; }
  std::shared_ptr<Linear> c_fc, c_proj;
  std::shared_ptr<Gelu> act;
  std::shared_ptr<Dropout> drop;
};

// Pre-LN transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x)).
class Block : public Module {
 public:
  Block(std::shared_ptr<LayerNorm> ln_1, std::shared_ptr<CausalSelfAttention> attn,
        std::shared_ptr<LayerNorm> ln_2, std::shared_ptr<Mlp> mlp);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Block"; }
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<Mlp> mlp;
};

}  // namespace mw::nn
