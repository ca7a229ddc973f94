// Module hooks see every use of every parameter (Note [Every parameter use is a module call]):
// order in both passes, the tied weight's two uses, recomputation firing forward hooks again, and
// no-grad mode.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "core/random.h"
#include "data/random_tokens.h"
#include "models/gpt2/model.h"
#include "nn/checkpoint.h"

namespace mw::nn {
namespace {

struct Recorder {
  std::vector<std::string> events;  // "fwd_pre NAME", "fwd NAME", "bwd_pre NAME", "bwd NAME"
  void attach(Module& root) {
    for (auto& [name, m] : root.named_modules()) {
      if (m->own_parameters().empty()) continue;
      const std::string n = name;
      m->add_forward_pre_hook(
          [this, n](Module&, const Tensor&) { events.push_back("fwd_pre " + n); });
      m->add_forward_hook(
          [this, n](Module&, const Tensor&, const Tensor&) { events.push_back("fwd " + n); });
      m->add_backward_pre_hook([this, n](Module&) { events.push_back("bwd_pre " + n); });
      m->add_backward_hook([this, n](Module&) { events.push_back("bwd " + n); });
    }
  }
  int64_t count(const std::string& e) const { return std::count(events.begin(), events.end(), e); }
  int64_t index(const std::string& e) const {
    auto it = std::find(events.begin(), events.end(), e);
    return it == events.end() ? -1 : it - events.begin();
  }
};

gpt2::Config config() {
  gpt2::Config c = gpt2::Config::preset("tiny");
  c.set_dropout(0.1);
  return c;
}

Tensor ids_for(const gpt2::Config& c) {
  std::vector<int32_t> tokens(2 * 8);
  data::random_tokens(1, 0, 2, 8, c.vocab_size, tokens.data());
  return Tensor::from_vector(tokens, {2, 8});
}

TEST(ModuleHooks, TiedWeightIsListedOnceButOwnedByBothModules) {
  gpt2::GPT2 model(config(), 1);
  const auto named = model.named_parameters();
  EXPECT_EQ(named.size(), gpt2::tensor_specs(config()).size());
  int owners = 0;
  for (auto& [name, m] : model.named_modules())
    for (auto& [pname, t] : m->own_parameters())
      if (t.is_same(model.parameter("transformer.wte.weight"))) ++owners;
  EXPECT_EQ(owners, 2);  // transformer.wte and lm_head
}

TEST(ModuleHooks, FireForEveryParameterUseInBothPassesInOrder) {
  const gpt2::Config c = config();
  gpt2::GPT2 model(c, 1);
  Recorder rec;
  rec.attach(model);
  Tensor ids = ids_for(c);
  default_generator().manual_seed(3);
  Tensor loss = shifted_cross_entropy(model(ids), ids);
  const size_t forward_events = rec.events.size();
  backward(loss);
  // Forward: every owning module once, pre before post, in model order; the tied weight's two
  // owners at both ends.
  ASSERT_GE(forward_events, 4u);
  EXPECT_EQ(rec.events[0], "fwd_pre transformer.wte");
  EXPECT_EQ(rec.events[1], "fwd transformer.wte");
  EXPECT_EQ(rec.events[2], "fwd_pre transformer.wpe");
  EXPECT_EQ(rec.events[forward_events - 2], "fwd_pre lm_head");
  EXPECT_EQ(rec.events[forward_events - 1], "fwd lm_head");
  for (auto& [name, m] : model.named_modules()) {
    if (m->own_parameters().empty()) continue;
    EXPECT_EQ(rec.count("fwd_pre " + name), 1) << name;
    EXPECT_EQ(rec.count("fwd " + name), 1) << name;
    EXPECT_EQ(rec.count("bwd_pre " + name), 1) << name;
    // The backward hook fires when the input's gradient is computed: never for the embeddings,
    // whose input is ids.
    const bool embedding = name == "transformer.wte" || name == "transformer.wpe";
    EXPECT_EQ(rec.count("bwd " + name), embedding ? 0 : 1) << name;
  }
  // Backward runs in reverse: the LM head first, the last block before the first, the embeddings
  // last; each module's pre-hook before its hook.
  EXPECT_EQ(rec.events[forward_events], "bwd_pre lm_head");
  EXPECT_LT(rec.index("bwd_pre lm_head"), rec.index("bwd lm_head"));
  EXPECT_LT(rec.index("bwd transformer.h.1.mlp.c_proj"),
            rec.index("bwd_pre transformer.h.0.mlp.c_proj"));
  EXPECT_LT(rec.index("bwd transformer.h.0.ln_1"), rec.index("bwd_pre transformer.wte"));
}

TEST(ModuleHooks, RecomputationFiresTheForwardHooksAgain) {
  const gpt2::Config c = config();
  gpt2::GPT2 model(c, 1);
  std::vector<Segment> plan{{0, 1, true}, {1, 2, true}};
  auto runner = std::make_shared<SegmentedRunner>(
      std::vector<std::shared_ptr<Module>>(model.blocks().begin(), model.blocks().end()), plan);
  model.run_block = [runner](Block&, int64_t i, const Tensor& x) { return (*runner)(i, x); };
  Recorder rec;
  rec.attach(model);
  Tensor ids = ids_for(c);
  default_generator().manual_seed(3);
  backward(shifted_cross_entropy(model(ids), ids));
  EXPECT_EQ(rec.count("fwd_pre transformer.h.0.attn.c_attn"), 2);  // forward + recomputation
  EXPECT_EQ(rec.count("fwd transformer.h.1.mlp.c_fc"), 2);
  EXPECT_EQ(rec.count("fwd_pre lm_head"), 1);  // outside the checkpoints
  EXPECT_EQ(rec.count("bwd_pre transformer.h.0.attn.c_attn"), 1);
}

TEST(ModuleHooks, NoGradModeFiresForwardHooksOnly) {
  const gpt2::Config c = config();
  gpt2::GPT2 model(c, 1);
  Recorder rec;
  rec.attach(model);
  Tensor ids = ids_for(c);
  NoGradGuard no_grad;
  Tensor logits = model(ids);
  EXPECT_FALSE(requires_grad(logits));
  EXPECT_EQ(rec.count("fwd_pre lm_head"), 1);
  for (const auto& e : rec.events) EXPECT_EQ(e.rfind("bwd", 0), std::string::npos) << e;
}

}  // namespace
}  // namespace mw::nn
