// gpt2_train's Adam options (apps/gpt2_train.cpp): betas, eps and the weight decay with what it
// takes; declared on the parser and parsed into the TrainOptions. A header of that one app, kept
// apart by concern.
#pragma once

#include <cmath>

#include "cli.h"
#include "optim/decay_ranges.h"
#include "train/trainer.h"

namespace mw {

inline void declare_adam(cli::Parser& p) {
  p.option("beta1", "0.9", "Adam beta1");
  p.option("beta2", "0.999", "Adam beta2");
  p.option("eps", "1e-8", "Adam epsilon, in [1e-30, 1]");
  p.option("weight-decay", "0", "decoupled weight decay");
  p.option("weight-decay-on", "matrices",
           "matrices|all: what --weight-decay decays: the 2-D weights and embeddings, not biases "
           "or LayerNorm (HF Trainer's, nanoGPT's), or every parameter (torch.optim.AdamW's)");
}

// Adam's hyper-parameters and what the weight decay takes (Note [Weight decay by ranges]).
inline void parse_adam(const cli::Parser& p, train::TrainOptions& o) {
  // Below 1 as floats: the largest float under 1 is 1 - 2^-24 (0.999999999 rounds to 1, which
  // the optimizer refuses, and 1 - beta^t would be 0).
  const double below_one = std::nextafter(1.0f, 0.0f);
  o.hyper.beta1 = static_cast<float>(p.real("beta1", 0, below_one));
  o.hyper.beta2 = static_cast<float>(p.real("beta2", 0, below_one));
  // Above 0: with eps 0 an element whose gradient has always been 0 updates by 0/0 (NaN), as in
  // PyTorch (GPT-2's unused position rows are such elements). 1e-30 is a normal float.
  o.hyper.eps = static_cast<float>(p.real("eps", 1e-30, 1));
  o.hyper.weight_decay = static_cast<float>(p.real("weight-decay", 0, 10));
  MW_CHECK_T(cli::UsageError, !p.given("weight-decay-on") || p.given("weight-decay"),
             "--weight-decay-on needs --weight-decay");
  const bool all = p.choice("weight-decay-on", {"matrices", "all"}) == "all";
  o.decay_on = all ? optim::DecayOn::kAll : optim::DecayOn::kMatrices;
}

}  // namespace mw
