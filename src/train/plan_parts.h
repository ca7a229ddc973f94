// The memory plan's parts shared by its files (internal to train/): memory_plan.cpp lays out the
// rows of a step, gemini_plan.cpp those of Gemini's chunks (docs/gemini.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/activation_plan.h"
#include "train/memory_plan.h"

namespace mw::train {

// Past this many layers the table is not listed tensor by tensor (a config.json may say 16
// million layers: 200 million entries, gigabytes of names): every block has the same tensors, so
// the tables of one and of two layers give the rest, still from spec.h alone.
constexpr int64_t kListedLayers = 4096;
// Past kListedLayers the chunks are equal slices of the parameters, at most this many (a model
// that large is refused by the plan anyway; the bound keeps planning it under 2 s).
constexpr int64_t kMaxPlannedChunks = 65536;

// Elements of each parameter, in the tensor table's order (spec.h).
std::vector<int64_t> parameter_numels(const Config& config);
Config with_layers(Config c, int64_t n_layer);
// In double, clamped by the caller: an absurd model must not overflow.
double parameter_bytes(const PlanInputs& in);
// A row of the plan, counted in its tier's total; a row of no bytes is left out.
void add(MemoryPlan& p, const std::string& what, const std::string& tier, int64_t bytes,
         const std::string& note);

// --offload-activations under Gemini, as the host sees it: `offloaded`, every offloaded byte, there
// at the end of forward and gone before step(); `freed_first`, those the host frees before any
// gradient buffer exists (the loss's logits, fetched back for its backward, the first).
struct HostActivations {
  int64_t offloaded = 0, freed_first = 0;
};

// Gemini's rows: chunks, Adam states, gradient buffers and the three tiers; `act_peak` is the
// device's non-model memory at its peak.
void plan_gemini(MemoryPlan& p, const PlanInputs& in, const Activations& a, int64_t act_peak,
                 const HostActivations& host_act);

}  // namespace mw::train
