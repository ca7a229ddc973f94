// The host's memory sources (core/caching_allocator.h): how the cpu and sim allocators get and
// return blocks. HeapSource is aligned_alloc / free; SimSource adds the sim arena (Note [Sim arena]
// in core/allocator.h) for a sim device with a capacity.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/arena.h"
#include "core/caching_allocator.h"

namespace mw {

// 4096-byte aligned blocks from the C heap. nullptr when the system refuses.
void* host_heap_acquire(int64_t bytes);
void host_heap_release(void* ptr);

class HeapSource : public MemorySource {
 public:
  explicit HeapSource(Device device) : device_(device) {}
  void* acquire(int64_t bytes) override { return host_heap_acquire(bytes); }
  void release(void* ptr, int64_t /*bytes*/) override { host_heap_release(ptr); }
  OutOfMemory refused(int64_t bytes, const AllocatorStats& stats) const override;

 protected:
  Device device_;
};

// A sim device: the heap while it has no capacity; with one, an Arena of that many bytes, and the
// heap only for what a fragmented arena cannot hold (counted as arena_fallbacks). Blocks of an
// arena are never cached: the arena reuses its own pages at any size. A new capacity starts a new
// arena; an old one is unmapped once its last block is returned.
class SimSource final : public HeapSource {
 public:
  explicit SimSource(Device device) : HeapSource(device) {}
  void* acquire(int64_t bytes) override;
  void release(void* ptr, int64_t bytes) override;
  bool cacheable(const void* ptr) const override;
  void capacity_changed(int64_t capacity_bytes) override;
  void add_stats(AllocatorStats& stats) const override { stats.arena_fallbacks += fallbacks_; }

 private:
  std::vector<std::unique_ptr<Arena>> arenas_;  // the current one last
  bool arena_mode_ = false;
  int64_t fallbacks_ = 0;
};

// Note [Host caching]'s reuse rule for the cpu device; a sim device reuses only exact sizes.
int64_t reuse_host_block(int64_t rounded);

}  // namespace mw
