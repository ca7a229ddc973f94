// Saving parameters that are sharded across ranks, one gathered unit (a chunk, a bucket) at a time:
// Gemini's sharded chunks (Note [Sharded parameters], shard.cpp) and ZeRO 3's buckets
// (train/zero3.cpp).
//
// Note [Streaming from rank 0]: rank 0 alone writes, in its writer's order; the other ranks must
// gather the same units in the same order (a gather is collective) without knowing that order. So
// rank 0 announces each unit its writer reaches (from_rank0: rank 0's value on every rank; -1 ends
// the stream) and every rank, rank 0 included, then gathers it, releasing the unit before; at most
// one unit is held. A writer that throws still announces the end, so the others are not left
// waiting, and the unit held is released on every exit path.
#pragma once

#include <cstdint>
#include <functional>

namespace mw::gemini {

struct Rank0Stream {
  bool root = false;                           // this rank is rank 0 (it runs `write`)
  std::function<int64_t(int64_t)> from_rank0;  // rank 0's value to every rank (collective)
  std::function<void(int64_t unit)> gather;    // makes the unit readable (collective)
  std::function<void(int64_t unit)> release;   // gives it back
};

// Rank 0 runs write(need); `need(unit)` before reading a unit's tensors. Other ranks follow.
void stream_from_rank0(
    const Rank0Stream& s,
    const std::function<void(const std::function<void(int64_t unit)>& need)>& write);

}  // namespace mw::gemini
