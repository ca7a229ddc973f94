// Note [Weight decay by ranges]: which elements of an optimizer's parameter the weight decay
// leaves alone.
//
// Trainers decay the matrices only: HF Trainer leaves out every bias and LayerNorm weight
// (get_decay_parameter_names), nanoGPT, minGPT and llm.c every parameter of fewer than two
// dimensions, which for GPT-2 is the same set (a LayerNorm gain pulled towards 0 is a layer
// switched off, a bias towards 0 is no regularisation of the product). torch.optim.AdamW over
// model.parameters() decays everything; that is the optimizers' default here too.
//
// What an optimizer steps is not always a model parameter: Gemini steps chunks holding many
// parameters, ZeRO steps pieces of them. So the choice reaches the optimizers as ranges of
// elements, per stepped tensor, that are not decayed (sorted, disjoint, in element indices of
// that tensor), made by whoever built the layout from the model's parameters (train/ and
// offload/gemini/). Every kernel call over elements [lo, hi) of a stepped tensor goes through
// for_each_decay_segment, which splits it at the ranges' ends and steps the ranges with the
// step's scalars less their decay terms. Adam is elementwise, so the split changes no other bit:
// an element is updated exactly as torch.optim.AdamW updates it in a param group with
// weight_decay 0 (the rule's other group), whatever the layout, device or disk holding it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "optim/adam_math.h"

namespace mw::optim {

// Which parameters a trainer decays: those of two dimensions or more (matrices and embeddings),
// or all of them.
enum class DecayOn { kMatrices, kAll };
inline bool decays(int64_t dims, DecayOn on) { return on == DecayOn::kAll || dims >= 2; }

// Elements [first, second) of one stepped tensor that the weight decay leaves alone.
using NoDecayRanges = std::vector<std::pair<int64_t, int64_t>>;

// Stepped tensor i's ranges in a per-tensor list that may be empty (none: all decayed).
inline const NoDecayRanges& no_decay_of(const std::vector<NoDecayRanges>& all, size_t i) {
  static const NoDecayRanges kNone;
  return all.empty() ? kNone : all.at(i);
}

// The step's scalars without the weight decay (either mode's).
inline AdamStepScalars without_decay(AdamStepScalars s) {
  s.l2_weight_decay = 0.f;
  s.neg_lr_weight_decay = 0.f;
  return s;
}

// Calls f(a, b, scalars) for consecutive segments [a, b) covering [lo, hi), each wholly inside or
// outside the ranges, with `s` outside them and without_decay(s) inside.
template <typename F>
void for_each_decay_segment(const NoDecayRanges& no_decay, int64_t lo, int64_t hi,
                            const AdamStepScalars& s, F f) {
  const bool decays = s.l2_weight_decay != 0.f || s.neg_lr_weight_decay != 0.f;
  if (no_decay.empty() || !decays) {
    if (lo < hi) f(lo, hi, s);
    return;
  }
  const AdamStepScalars bare = without_decay(s);
  auto it = std::partition_point(no_decay.begin(), no_decay.end(),
                                 [&](const auto& r) { return r.second <= lo; });
  int64_t pos = lo;
  for (; it != no_decay.end() && it->first < hi; ++it) {
    const int64_t a = std::max(it->first, lo), b = std::min(it->second, hi);
    if (pos < a) f(pos, a, s);
    if (a < b) f(a, b, bare);
    pos = std::max(pos, b);
  }
  if (pos < hi) f(pos, hi, s);
}

// The ranges of a tensor whose elements [offset, offset + numel) are its parts' elements: part k
// covers [part_offsets[k], + part_numels[k]) of the whole, and is left alone when !decays[k].
// For Gemini's chunks and ZeRO's pieces (parts: the model's parameters in them).
inline NoDecayRanges no_decay_ranges_of(const std::vector<int64_t>& part_offsets,
                                        const std::vector<int64_t>& part_numels,
                                        const std::vector<char>& decays, int64_t offset,
                                        int64_t numel) {
  NoDecayRanges out;
  for (size_t k = 0; k < part_offsets.size(); ++k) {
    if (decays[k]) continue;
    const int64_t a = std::max(part_offsets[k], offset);
    const int64_t b = std::min(part_offsets[k] + part_numels[k], offset + numel);
    if (a < b) out.emplace_back(a - offset, b - offset);
  }
  std::sort(out.begin(), out.end());
  NoDecayRanges merged;
  for (const auto& r : out) {
    if (!merged.empty() && r.first <= merged.back().second)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  }
  return merged;
}

}  // namespace mw::optim
