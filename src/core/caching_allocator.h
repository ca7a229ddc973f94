// CachingAllocator: the one caching-allocator core behind every device's memory (cpu, sim, pinned
// host, CUDA). It gets memory in segments, carves blocks out of them (size classes, splitting,
// freed neighbours merged), keeps freed blocks for reuse, returns wholly free segments when its
// cache is over its bound or the system refuses a segment (then retries once), keeps a hard
// capacity when there is one, and keeps the statistics of Note [Allocator statistics]. What differs
// between devices is how a segment is got and returned (a MemorySource: aligned_alloc, mmap,
// cudaHostAlloc, cudaMalloc) and the numbers of its CachePolicy (Note [Size classes and
// splitting]).
//
// Invariants (under the allocator's lock):
//  - Every segment the source gave is a chain of blocks that tile it exactly, in address order;
//    each block is live (handed out) or free; no two free blocks are neighbours (they merge).
//  - stats.current_bytes is the sum of the live blocks' sizes (the granule-rounded request, or a
//    whole free block that was not worth splitting); stats.cached_bytes = segments' bytes -
//    current_bytes, the free bytes kept for reuse.
//  - Wholly free segments that may be returned (not the sim's reserved one) hold at most
//    max_cached_bytes; a segment is returned to the source only when wholly free.
//  - With a hard capacity, current_bytes never exceeds it.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"

namespace mw {

// How an allocator gets and returns memory: the one thing each backend adds to the core. Called
// only under the owning allocator's lock.
class MemorySource {
 public:
  virtual ~MemorySource() = default;
  // A fresh segment of `bytes` (a positive multiple of the granule), or nullptr when the system
  // refuses it for lack of memory (the core then returns its wholly free segments and asks once
  // more). Other failures throw.
  virtual void* acquire(int64_t bytes) = 0;
  // Returns a segment that acquire() gave, with the same bytes.
  virtual void release(void* ptr, int64_t bytes) = 0;
  // The error for a request the source refused even after the cache was returned: what was asked
  // for, what is free, and what to do.
  virtual OutOfMemory refused(int64_t bytes, const AllocatorStats& stats) const = 0;
};

inline constexpr int64_t kNeverSplit = std::numeric_limits<int64_t>::max();

// Note [Size classes and splitting]: requests of at most small_max_bytes (the small class) share
// segments of small_segment_bytes, carved to the granule, so a thousand bias vectors cost a few
// segments rather than a thousand system calls. A larger request gets a segment of its own
// (large_segment_bytes(rounded)); a free block is split for a smaller request when the rest is
// at least min_split_bytes, and the rest stays free for other requests. Small and large blocks
// never share a segment, so small long-lived blocks cannot pin a large segment. A block too large
// to split (the rest below min_split_bytes) is handed out whole, if it is at most
// max_reuse_bytes(rounded). The numbers per device are with their reasons where each allocator is
// made (core/allocator.cpp, core/cuda/).
struct CachePolicy {
  int64_t granule_bytes = kHostAlignment;  // requests are rounded up to this
  int64_t max_cached_bytes = 0;            // the bound on wholly free segments kept
  int64_t small_max_bytes = 0;             // 0: no small class
  int64_t small_segment_bytes = 0;
  // A large request's segment size (nullptr: exactly the rounded request).
  int64_t (*large_segment_bytes)(int64_t rounded) = nullptr;
  int64_t min_split_bytes = kNeverSplit;  // large blocks; small blocks split at the granule
  // The largest block a request may take unsplit (nullptr: any).
  int64_t (*max_reuse_bytes)(int64_t rounded) = nullptr;
  // Note [Sim arena]: the hard capacity is one segment, got when the capacity is set and kept,
  // as a GPU's memory is one fixed pool.
  bool reserve_capacity = false;
};

// Reuse rules shared by the backends.
inline int64_t reuse_exact_size(int64_t rounded) { return rounded; }
inline int64_t reuse_up_to_twice(int64_t rounded) { return 2 * rounded; }

// The size classes of a GPU's memory (the CUDA and pinned allocators), the numbers PyTorch's
// CUDA caching allocator found good (docs/references.md): requests up to 1 MiB share 2 MiB
// segments; a request below 10 MiB gets a 20 MiB segment that later mid-sized requests split;
// larger ones a segment rounded to 2 MiB. A large block is split when more than 1 MiB is left.
inline constexpr int64_t kGpuSmallMaxBytes = int64_t{1} << 20;
inline constexpr int64_t kGpuSmallSegmentBytes = int64_t{2} << 20;
inline int64_t gpu_large_segment_bytes(int64_t rounded) {
  if (rounded < (int64_t{10} << 20)) return int64_t{20} << 20;
  return (rounded + (int64_t{2} << 20) - 1) / (int64_t{2} << 20) * (int64_t{2} << 20);
}
inline CachePolicy gpu_cache_policy(int64_t granule_bytes, int64_t max_cached_bytes) {
  return CachePolicy{.granule_bytes = granule_bytes,
                     .max_cached_bytes = max_cached_bytes,
                     .small_max_bytes = kGpuSmallMaxBytes,
                     .small_segment_bytes = kGpuSmallSegmentBytes,
                     .large_segment_bytes = gpu_large_segment_bytes,
                     .min_split_bytes = kGpuSmallMaxBytes + granule_bytes};
}

class CachingAllocator final : public Allocator {
 public:
  // capacity_bytes: 0 = unlimited. hard_capacity: the allocator itself refuses what passes the
  // capacity (sim); otherwise the capacity is reported only (a GPU's memory size).
  CachingAllocator(Device device, std::unique_ptr<MemorySource> source, CachePolicy policy,
                   int64_t capacity_bytes, bool hard_capacity);
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;
  void* allocate(int64_t nbytes) override;
  void deallocate(void* ptr, int64_t nbytes) override;
  Device device() const override { return device_; }
  AllocatorStats stats() const override;
  void reset_peak() override;
  void reset_window_peak() override;
  void set_pressure_handler(PressureHandler handler) override;
  void empty_cache() override;
  // A new hard capacity (0 = unlimited); returns the wholly free segments first (and, with
  // reserve_capacity, gets the new capacity's segment). Statistics are kept.
  void set_capacity(int64_t capacity_bytes);
  // A cap below a GPU's memory (0 = none): the capacity becomes hard at `bytes` (what passes it is
  // refused, and the cache is held within it), as torch.cuda.set_per_process_memory_fraction; 0
  // restores the device's own size, reported only. For trying a run on a smaller GPU.
  void set_limit(int64_t bytes);
  // Bounds the cache (returning wholly free segments beyond it): a run that budgets host RAM
  // (Gemini's three tiers) keeps little besides what it uses.
  void set_max_cached_bytes(int64_t bytes);
  // The segments got from the source and not yet returned.
  int64_t segment_count() const;

 private:
  void* allocate_once(int64_t nbytes);
  // What a segment is for. Every block of a segment carries its segment's kind.
  enum class Kind : uint8_t {
    Cached,     // kept when wholly free, within max_cached_bytes
    Reserved,   // the sim's capacity (Note [Sim arena]); kept while the capacity stands
    Transient,  // returned as soon as it is wholly free (an old capacity's segment)
    Overflow    // a fragmented arena's overflow: returned when wholly free, its pages kept as
                // the spare for the next overflow of its size, within max_cached_bytes (Note
                // [Sim arena])
  };
  struct Block {
    char* ptr = nullptr;
    int64_t bytes = 0;
    Block* prev = nullptr;  // neighbours in the same segment, in address order
    Block* next = nullptr;
    bool small = false;
    bool free = false;
    Kind kind = Kind::Cached;
    int64_t order = 0;  // among free blocks of one size, the most recently freed first
    bool whole() const { return !prev && !next; }
  };
  struct FreeOrder {
    bool operator()(const Block* a, const Block* b) const {
      return a->bytes != b->bytes ? a->bytes < b->bytes : a->order < b->order;
    }
  };
  using FreeSet = std::set<Block*, FreeOrder>;

  void check_capacity_locked(int64_t rounded) const;
  Block* take_free_locked(bool small, int64_t rounded);
  void split_locked(Block* b, int64_t rounded);
  Block* new_segment_locked(bool small, int64_t rounded);
  void* acquire_locked(int64_t bytes);
  void insert_free_locked(Block* b);
  void erase_free_locked(Block* b);
  void release_segment_locked(Block* b);
  void drop_spare_locked();  // returns the spare overflow segment's pages to the source
  // Returns wholly free Cached segments worth at least needed_bytes to the source (-1: all), by
  // Note [Freeing just enough].
  void free_cached_locked(int64_t needed_bytes);
  FreeSet& free_set(bool small) { return small ? free_small_ : free_large_; }

  Device device_;
  std::unique_ptr<MemorySource> source_;
  CachePolicy policy_;
  bool hard_capacity_;
  int64_t reported_capacity_ = 0;  // the capacity given at construction (a GPU's memory)
  mutable std::mutex mutex_;
  PressureHandler pressure_handler_;  // Note [Memory pressure]
  AllocatorStats stats_;
  FreeSet free_small_, free_large_;
  std::unordered_map<void*, Block*> live_;
  int64_t segment_bytes_ = 0;  // every segment got and not returned
  int64_t segments_ = 0;
  int64_t whole_free_bytes_ = 0;  // wholly free Cached segments (what max_cached_bytes bounds)
  int64_t free_order_ = 0;        // decreasing: the most recently freed block sorts first
  char* spare_ptr_ = nullptr;     // the last Overflow segment's pages, outside segment_bytes_
  int64_t spare_bytes_ = 0;
};

}  // namespace mw
