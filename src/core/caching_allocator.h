// CachingAllocator: the one caching-allocator core behind every device's memory (cpu, sim, pinned
// host, CUDA). It rounds requests to a granule, serves them best fit from a bounded cache of freed
// blocks, keeps a hard capacity when there is one, empties its cache and retries once when the
// system refuses a block, and keeps the statistics of Note [Allocator statistics]. What differs
// between devices is only how a block is got and returned: a MemorySource (aligned_alloc, the sim
// arena, cudaHostAlloc, cudaMalloc).
//
// Invariants (under the allocator's lock):
//  - stats.current_bytes is the sum of the live blocks' sizes (each the granule-rounded request,
//    or the larger cached block that served it); stats.cached_bytes is the cache's sum.
//  - With a hard capacity, current_bytes never exceeds it, and neither do current + cached
//    (the cache lives inside the capacity, as a GPU caching allocator's does).
//  - Every block the source gave is either live, cached, or returned to the source.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/allocator.h"
#include "core/block_cache.h"
#include "core/error.h"

namespace mw {

// How an allocator gets and returns memory: the one thing each backend adds to the core. Called
// only under the owning allocator's lock.
class MemorySource {
 public:
  virtual ~MemorySource() = default;
  // A fresh block of `bytes` (a positive multiple of the granule), or nullptr when the system
  // refuses it for lack of memory (the core then empties its cache and asks once more). Other
  // failures throw.
  virtual void* acquire(int64_t bytes) = 0;
  // Returns a block that acquire() gave, with the same bytes.
  virtual void release(void* ptr, int64_t bytes) = 0;
  // The error for a request the source refused even after the cache was emptied: what was asked
  // for, what is free, and what to do.
  virtual OutOfMemory refused(int64_t bytes, const AllocatorStats& stats) const = 0;
  // Whether a freed block may be cached rather than released (the sim arena reuses its own pages).
  virtual bool cacheable(const void* /*ptr*/) const { return true; }
  // A new capacity (0: unlimited); the cache is empty when this is called.
  virtual void capacity_changed(int64_t /*capacity_bytes*/) {}
  // Adds what only the source counts (arena_fallbacks).
  virtual void add_stats(AllocatorStats& /*stats*/) const {}
};

// Which cached blocks a request may take, and how much the cache keeps.
struct CachePolicy {
  int64_t granule_bytes = kHostAlignment;  // requests are rounded up to this
  int64_t max_cached_bytes = 0;            // the cache's bound
  // The largest cached block a request of `rounded` bytes may take (best fit in [rounded, this]).
  int64_t (*max_reuse_bytes)(int64_t rounded) = nullptr;
};

// Reuse rules shared by the backends.
inline int64_t reuse_exact_size(int64_t rounded) { return rounded; }
inline int64_t reuse_up_to_twice(int64_t rounded) { return 2 * rounded; }

class CachingAllocator final : public Allocator {
 public:
  // capacity_bytes: 0 = unlimited. hard_capacity: the allocator itself refuses what passes the
  // capacity (sim); otherwise the capacity is reported only (a GPU's memory size).
  CachingAllocator(Device device, std::unique_ptr<MemorySource> source, CachePolicy policy,
                   int64_t capacity_bytes, bool hard_capacity);
  ~CachingAllocator() override;
  void* allocate(int64_t nbytes) override;
  void deallocate(void* ptr, int64_t nbytes) override;
  Device device() const override { return device_; }
  AllocatorStats stats() const override;
  void reset_peak() override;
  void empty_cache() override;
  // A new hard capacity (0 = unlimited); empties the cache first. Statistics are kept.
  void set_capacity(int64_t capacity_bytes);
  // Bounds the cache (freeing cached blocks beyond it): a run that budgets host RAM (Gemini's
  // three tiers) keeps little besides what it uses.
  void set_max_cached_bytes(int64_t bytes);

 private:
  void check_capacity_locked(int64_t rounded) const;
  void* acquire_locked(int64_t rounded);
  // Returns cached blocks worth at least needed_bytes to the source (-1: all).
  void free_cached_locked(int64_t needed_bytes);
  void release_all_locked(const std::vector<BlockCache::Block>& blocks);

  Device device_;
  std::unique_ptr<MemorySource> source_;
  CachePolicy policy_;
  bool hard_capacity_;
  mutable std::mutex mutex_;
  AllocatorStats stats_;
  BlockCache cache_;
  std::unordered_map<void*, int64_t> live_;  // block in use -> its size
};

}  // namespace mw
