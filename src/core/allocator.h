// Per-device allocators with current / peak / capacity statistics. Every device's allocator is one
// CachingAllocator (core/caching_allocator.h) over a MemorySource; the host's sources are in
// core/host_memory.h.
//
// Note [Allocator statistics]: current_bytes counts bytes handed out and not yet returned (rounded
// up to the 4096-byte granule); peak_bytes is the maximum of current_bytes since the last
// reset_peak(); cached_bytes are the free bytes of the allocator's segments, kept for reuse. These
// are the numbers Gemini's memory statistics and the training log's device_peak_bytes read.
//
// Note [Host caching]: a training step allocates the same sizes in the same order every step.
// Returning those blocks to the OS and faulting them in again costs PyTorch about half its speed on
// this machine (docs/references.md), so freed blocks are cached and reused, best fit: a request
// takes the smallest free block that holds it, split when at least 1 MiB is left (Note [Size
// classes and splitting]), so activation-sized and gradient-sized blocks serve each other instead
// of forming two resident pools (without reuse across sizes, peak RSS was the live peak plus every
// block ever freed: +500 MiB on GPT-2 small). Splitting replaced a rule that handed out whole
// cached blocks of up to twice the request: GPT-2 small B4 T128 (AdamW) went from 2489 to 2374 MiB
// peak RSS, 623K to 594K minor faults (the same count at 2 and 5 steps: no page is faulted in
// again after the first step), step time ratio 0.92 (median of three alternated runs), and the
// allocator's bytes in use became the bytes asked for (within 1 MiB a block), as the memory plan
// counts them. With HybridAdam updating in backward (gpt2_bench) peak RSS went the other way,
// 2294 to 2335 MiB; bounding which free block a large request may split (at most 2x or 1.25x its
// size) brought that to 2260 / 2239 but the AdamW run to 2490 / 2546, so splitting is unbounded.
// The cache of wholly free segments is bounded (max_cached_bytes) and empty_cache() returns it.
//
// Note [The sim device]: a sim allocator is the same caching core over host memory, with its own
// hard capacity and its own statistics. Exceeding the capacity raises OutOfMemory with the
// requested, free and capacity bytes, exactly where a GPU would fail. It splits every block to the
// granule, so its accounting is exactly what was asked for.
//
// Note [Sim arena]: a sim device with a capacity is one segment of that many bytes, got when the
// capacity is set and carved best fit with freed neighbours merged (core/caching_allocator.h), as
// a GPU's memory is one fixed pool; so it never holds more host memory than it was given. Its pages
// stay backed once touched, so a block reused at another size costs nothing, where an exact-size
// cache had to free blocks of other sizes and fault fresh pages in: Gemini on a tight device
// allocates new sizes every step (measured: 685 MiB of misses per GPT-2 small step on
// sim:768MiB, 1.38M minor faults in 4 steps against the plain run's 0.56M). The segment never
// makes a run fail: when fragmentation leaves no free block large enough, the block comes from a
// transient segment instead (counted as arena_fallbacks), still counted against the capacity; the
// pages of the last one are kept for the next fallback of its size, since on a tight device the
// same block falls out every step (GPT-2 small on sim:768MiB under Gemini auto: one 147 MiB block
// a step, 42k minor faults a step before). A new capacity gets a new segment; the old one goes
// back once its last block is freed.
#pragma once

#include <cstdint>
#include <functional>

#include "core/device.h"

namespace mw {

inline constexpr int64_t kHostAlignment = 4096;  // O_DIRECT needs 4096-byte aligned buffers

inline int64_t round_up(int64_t n, int64_t granule) {
  return (n + granule - 1) / granule * granule;
}

struct AllocatorStats {
  int64_t current_bytes = 0;    // in use now
  int64_t peak_bytes = 0;       // max in use since reset_peak()
  int64_t cached_bytes = 0;     // free bytes of the segments, kept for reuse
  int64_t capacity_bytes = 0;   // hard cap on in-use bytes; 0 = unlimited
  int64_t alloc_count = 0;      // allocate() calls
  int64_t cache_hits = 0;       // allocate() calls served from the cache
  int64_t miss_bytes = 0;       // segment bytes got from the system (requests the cache missed)
  int64_t retries = 0;          // times the system refused a segment and the cache was emptied
  int64_t arena_fallbacks = 0;  // sim: blocks outside its segment because it was fragmented
  // Max in use since reset_window_peak(): a second watermark for callers that sample the peak of
  // short windows (Gemini's warmup, Note [Non-model memory]) without losing the run's peak_bytes.
  int64_t window_peak_bytes = 0;
};

// Note [Memory pressure]: called by allocate() (without the allocator's lock) when a request does
// not fit, with the bytes asked for; returns true if it freed device memory, and allocate() then
// tries again. Gemini's auto placement frees chunk copies the current op does not need, because
// the non-model memory of a step can come out above what its warmup measured (activation
// offload's copies finish at other moments from step to step).
using PressureHandler = std::function<bool(int64_t nbytes)>;

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns at least nbytes (nbytes may be 0); throws OutOfMemory.
  virtual void* allocate(int64_t nbytes) = 0;
  // nbytes must be the value passed to allocate().
  virtual void deallocate(void* ptr, int64_t nbytes) = 0;
  virtual Device device() const = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual void reset_window_peak() = 0;
  // Note [Memory pressure]: one handler per allocator; an empty one removes it.
  virtual void set_pressure_handler(PressureHandler handler) = 0;
  virtual void empty_cache() = 0;
};

// The allocator of a device. cpu and sim are always available; cuda only when built with CUDA.
Allocator& allocator_for(Device device);
// Sets the hard capacity of sim device `index` (0 = unlimited). Its statistics are kept.
void set_sim_capacity(int index, int64_t capacity_bytes);
// Caps what memwall uses of GPU `index` at `bytes` (0 = the whole GPU):
// CachingAllocator::set_limit.
void limit_cuda_memory(int index, int64_t bytes);
// Bounds the cpu allocator's cache (freeing cached blocks beyond it): a run that budgets host RAM
// (Gemini's three tiers) keeps little besides what it uses.
void set_host_max_cached_bytes(int64_t bytes);
// The same for sim device `index`, whose pages are host RAM too: within its arena it caches only
// the spare overflow segment (Note [Sim arena]).
void set_sim_max_cached_bytes(int index, int64_t bytes);

// Process memory, from the kernel: peak resident set size (getrusage ru_maxrss) and current RSS.
int64_t peak_rss_bytes();
int64_t current_rss_bytes();

// An owning, 4096-byte aligned host buffer for I/O (O_DIRECT) and staging. Move-only. Its bytes
// come straight from the host heap (counted by no allocator: the staging buffers of the NVMe
// paths are sized once and kept), or from `from` (a pinned buffer: PinnedHostBuffer in
// core/cuda_stream.h).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(int64_t nbytes);
  AlignedBuffer(int64_t nbytes, Allocator& from);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  void* data() { return data_; }
  const void* data() const { return data_; }
  int64_t size() const { return nbytes_; }

 private:
  void release();
  Allocator* from_ = nullptr;  // nullptr: the host heap
  void* data_ = nullptr;
  int64_t nbytes_ = 0;
};

}  // namespace mw
