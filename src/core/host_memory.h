// The host's memory sources (core/caching_allocator.h): how the cpu and sim allocators get and
// return segments. HeapSource is aligned_alloc / free; SimSource maps its large segments.
#pragma once

#include <cstdint>

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

// A sim device's segments: the heap, and for large ones (its reserved capacity, Note [Sim arena])
// address space mapped without reserving swap, so a sim:80GiB on a smaller machine costs only the
// pages it touches.
class SimSource final : public HeapSource {
 public:
  explicit SimSource(Device device) : HeapSource(device) {}
  void* acquire(int64_t bytes) override;
  void release(void* ptr, int64_t bytes) override;
  OutOfMemory refused(int64_t bytes, const AllocatorStats& stats) const override;
  static constexpr int64_t kMapBytes = int64_t{64} << 20;  // and up: mmap
};

}  // namespace mw
