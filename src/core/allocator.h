// Per-device allocators with current / peak / capacity statistics.
//
// Note [Allocator statistics]: current_bytes counts bytes handed out and not yet returned (rounded
// up to the 4096-byte granule); peak_bytes is the maximum of current_bytes since the last
// reset_peak(); cached_bytes are freed blocks kept for reuse. These are the numbers Gemini's memory
// statistics and the training log's device_peak_bytes read.
//
// Note [Host caching]: a training step allocates the same sizes in the same order every step.
// Returning those blocks to the OS and faulting them in again costs PyTorch about half its speed on
// this machine (docs/references.md), so freed blocks are cached and reused. A request takes the
// smallest cached block of at least its size and at most twice it (best fit), so activation-sized
// and gradient-sized blocks serve each other instead of forming two resident pools: without this,
// peak RSS was the live peak plus every block ever freed (measured +500 MiB on GPT-2 small). The
// cache is bounded (max_cached_bytes) and empty_cache() returns everything.
//
// Note [The sim device]: a sim allocator is the same host allocator with its own hard capacity and
// its own statistics. Exceeding the capacity raises OutOfMemory with the requested, free and
// capacity bytes, exactly where a GPU would fail. Its cache lives inside the capacity (in use +
// cached never exceed it), so a sim device never holds more host memory than it was given.
//
// Note [Sim arena]: a sim device with a capacity is one reserved range of that many bytes, carved
// best fit with freed neighbours merged (core/arena.h), as a GPU's memory is one fixed pool. Its
// pages stay backed once touched, so a block reused at another size costs nothing, where the exact-
// size cache had to free blocks of other sizes and fault fresh pages in: Gemini on a tight device
// allocates new sizes every step (measured: 685 MiB of misses per GPT-2 small step on
// sim:768MiB, 1.38M minor faults in 4 steps against the plain run's 0.56M). Accounting stays
// exact (the rounded request), and the arena never makes a run fail: when fragmentation leaves no
// run large enough, the block comes from the host heap instead, still counted against the
// capacity. A new capacity starts a new arena; an old one is unmapped once its last block is
// freed.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/arena.h"
#include "core/device.h"

namespace mw {

inline constexpr int64_t kHostAlignment = 4096;  // O_DIRECT needs 4096-byte aligned buffers

inline int64_t round_up(int64_t n, int64_t granule) {
  return (n + granule - 1) / granule * granule;
}

struct AllocatorStats {
  int64_t current_bytes = 0;    // in use now
  int64_t peak_bytes = 0;       // max in use since reset_peak()
  int64_t cached_bytes = 0;     // freed, kept for reuse
  int64_t capacity_bytes = 0;   // hard cap on in-use bytes; 0 = unlimited
  int64_t alloc_count = 0;      // allocate() calls
  int64_t cache_hits = 0;       // allocate() calls served from the cache
  int64_t arena_fallbacks = 0;  // sim: blocks from the heap because the arena was fragmented
};

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
  virtual void empty_cache() = 0;
};

// Host memory, 4096-byte aligned and rounded, with the cache of Note [Host caching].
// Used for the cpu device and, with a capacity, for each sim device.
class CachingHostAllocator final : public Allocator {
 public:
  CachingHostAllocator(Device device, int64_t capacity_bytes, int64_t max_cached_bytes);
  ~CachingHostAllocator() override;
  void* allocate(int64_t nbytes) override;
  void deallocate(void* ptr, int64_t nbytes) override;
  Device device() const override { return device_; }
  AllocatorStats stats() const override;
  void reset_peak() override;
  void empty_cache() override;
  void set_capacity(int64_t capacity_bytes);
  // Bounds the cache (freeing cached blocks beyond it): a run that budgets host RAM (Gemini's
  // three tiers) keeps little besides what it uses.
  void set_max_cached_bytes(int64_t bytes);

 private:
  // Frees cached blocks worth at least needed_bytes (Note [Freeing just enough]); -1: all.
  void free_cached_locked(int64_t needed_bytes);
  // A fresh block from the host heap (emptying the cache and retrying once); OutOfMemory.
  void* heap_allocate_locked(int64_t rounded);
  // Returns an arena's block, unmapping an old arena once it is empty; false if no arena owns ptr.
  bool arena_free_locked(void* ptr, int64_t block);
  Device device_;
  int64_t max_cached_bytes_;
  mutable std::mutex mutex_;
  AllocatorStats stats_;
  std::map<int64_t, std::vector<void*>> cache_;  // block size -> free blocks
  std::unordered_map<void*, int64_t> live_;      // block in use -> its size
  std::vector<std::unique_ptr<Arena>> arenas_;   // Note [Sim arena]; the current one last
  bool arena_mode_ = false;
};

// The allocator of a device. cpu and sim are always available; cuda only when built with CUDA.
Allocator& allocator_for(Device device);
// Sets the hard capacity of sim device `index` (0 = unlimited). Its statistics are kept.
void set_sim_capacity(int index, int64_t capacity_bytes);

// Process memory, from the kernel: peak resident set size (getrusage ru_maxrss) and current RSS.
int64_t peak_rss_bytes();
int64_t current_rss_bytes();

// An owning, 4096-byte aligned host buffer for I/O (O_DIRECT) and staging. Move-only.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(int64_t nbytes);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  void* data() { return data_; }
  const void* data() const { return data_; }
  int64_t size() const { return nbytes_; }

 private:
  void* data_ = nullptr;
  int64_t nbytes_ = 0;
};

}  // namespace mw
