// Every block of a GPT-2 checkpointed (recomputed in backward), as gpt2_train's
// --checkpoint-activations sets it up (Trainer::build_recomputation), for the Gemini tests.
#pragma once

#include <memory>
#include <vector>

#include "models/gpt2/model.h"
#include "nn/checkpoint.h"

namespace mw::testing {

inline void checkpoint_every_block(gpt2::GPT2& model) {
  std::vector<nn::Segment> plan;
  for (int64_t i = 0; i < model.config().n_layer; ++i) plan.push_back({i, i + 1, true});
  auto runner = std::make_shared<nn::SegmentedRunner>(
      std::vector<std::shared_ptr<nn::Module>>(model.blocks().begin(), model.blocks().end()), plan);
  model.run_block = [runner](nn::Block&, int64_t i, const Tensor& x) { return (*runner)(i, x); };
}

}  // namespace mw::testing
