// Seeded random token batches: the get_data() of the ColossalAI examples
// (torch.randint(0, vocab_size, (B, T))), made platform independent.
//
// Invariants: out[i] is uniform in [0, vocab_size) and a pure function of (seed, step, i): the same
// on every platform, compiler and thread count, and independent of B and T except through i.
// Generation is counter-based (splitmix64 of seed, step, index and attempt) with Lemire's unbiased
// bounded sampling, so no modulo bias.
#pragma once

#include <cstdint>

#include "core/random.h"

namespace mw::data {

using mw::splitmix64;  // core/random.h: the one splitmix64 of the codebase

// Fills out[0 .. B*T) for `step`. InvalidArgument for step < 0, B < 1, T < 1 or
// vocab_size outside [1, 2^31).
void random_tokens(uint64_t seed, int64_t step, int64_t B, int64_t T, int64_t vocab_size,
                   int32_t* out);

}  // namespace mw::data
