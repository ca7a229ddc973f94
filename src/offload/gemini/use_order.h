// The order Gemini packs parameters into chunks (Note [First-use order]).
//
// Note [First-use order]: chunks pay off when the tensors an op needs sit in the chunks it gathers,
// so Gemini packs parameters in the order the model first uses them, as ColossalAI does after its
// warmup. That order is recorded on a probe forward (record_use_order: forward pre-hooks on every
// module that owns parameters, under no_grad, before the chunks exist) and given to Gemini as
// GeminiOptions::use_order; parameters the probe did not use follow in parameter order. Without
// it (and always under streaming construction, where the model does not exist before its chunks)
// the chunks follow parameter order, the initialisation order. For GPT-2 the two are the same (the
// embeddings, then each block's ln_1, attn, ln_2, mlp, then ln_f; the tied head reuses wte),
// which GeminiUseOrder.Gpt2FirstUseIsParameterOrder checks; a model that registers its modules in
// another order than it calls them gets its chunks in call order. The order changes which tensors
// share a chunk and nothing else: a chunk's Adam step is elementwise and the gradient norm is
// summed per parameter in parameter order (Note [Norm order]), so a run is bitwise the same in any
// packing order (GeminiUseOrder.AnyPackingOrderIsBitwiseThePlainRun).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "nn/module.h"

namespace mw::gemini {

// Names of `model`'s parameters (named_parameters() names) in the order a forward uses them, then
// those it did not use, in parameter order. `forward` runs the model once (any small input); it
// runs under no_grad, and the hooks installed for it do nothing afterwards.
std::vector<std::string> record_use_order(nn::Module& model, const std::function<void()>& forward);

// The tensors' indices in packing order: those named in `use_order` first, in its order, then the
// rest in index order. InvalidArgument for an unknown or repeated name.
std::vector<size_t> packing_order(const std::vector<std::string>& names,
                                  const std::vector<std::string>& use_order);

}  // namespace mw::gemini
