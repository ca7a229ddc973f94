// The host's memory sources (core/host_memory.h).
#include "core/host_memory.h"

#include <cstdlib>
#include <iterator>

namespace mw {

void* host_heap_acquire(int64_t bytes) {
  return std::aligned_alloc(kHostAlignment, static_cast<size_t>(bytes));
}

void host_heap_release(void* ptr) { std::free(ptr); }

OutOfMemory HeapSource::refused(int64_t bytes, const AllocatorStats& stats) const {
  return OutOfMemory(str(device_.str(), ": the system refused ", bytes,
                         " bytes of host memory; lower the batch or offload more"),
                     bytes, 0, stats.capacity_bytes);
}

// Large blocks (32 MiB and up: logits, the embedding gradient) take at most 1/8 more, so a 98 MiB
// logits buffer never takes the 147 MiB block that the embedding gradient needs next, which would
// make every step fault in a fresh 147 MiB (measured: 19% of step time in page clearing).
int64_t reuse_host_block(int64_t rounded) {
  const int64_t slack = rounded >= (int64_t{32} << 20) ? rounded / 8 : rounded;
  return rounded + slack;
}

void* SimSource::acquire(int64_t bytes) {
  if (arena_mode_) {
    if (void* ptr = arenas_.back()->allocate(bytes)) return ptr;
    ++fallbacks_;
  }
  return host_heap_acquire(bytes);
}

void SimSource::release(void* ptr, int64_t bytes) {
  for (size_t a = 0; a < arenas_.size(); ++a) {
    if (!arenas_[a]->owns(ptr)) continue;
    arenas_[a]->deallocate(ptr, bytes);
    const bool current = arena_mode_ && a + 1 == arenas_.size();
    if (!current && arenas_[a]->in_use_bytes() == 0)
      arenas_.erase(arenas_.begin() + static_cast<std::ptrdiff_t>(a));
    return;
  }
  host_heap_release(ptr);  // a heap block: a fragmented arena's, or one from before the arena
}

bool SimSource::cacheable(const void* ptr) const {
  if (arena_mode_) return false;
  for (const auto& arena : arenas_)
    if (arena->owns(ptr)) return false;
  return true;
}

void SimSource::capacity_changed(int64_t capacity_bytes) {
  const int64_t bytes = round_up(capacity_bytes, kHostAlignment);
  const bool reuse = arena_mode_ && capacity_bytes > 0 && arenas_.back()->size_bytes() == bytes;
  if (!reuse && arena_mode_ && arenas_.back()->in_use_bytes() == 0) arenas_.pop_back();
  if (!reuse && capacity_bytes > 0)
    arenas_.push_back(std::make_unique<Arena>(bytes, kHostAlignment));
  arena_mode_ = capacity_bytes > 0;
}

}  // namespace mw
