// The host's memory sources (core/host_memory.h).
#include "core/host_memory.h"

#include <sys/mman.h>

#include <cstdlib>

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

void* SimSource::acquire(int64_t bytes) {
  if (bytes < kMapBytes) return host_heap_acquire(bytes);
  // MAP_NORESERVE: address space only; a page costs memory once it is touched.
  void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void SimSource::release(void* ptr, int64_t bytes) {
  if (bytes < kMapBytes)
    host_heap_release(ptr);
  else
    ::munmap(ptr, static_cast<size_t>(bytes));
}

OutOfMemory SimSource::refused(int64_t bytes, const AllocatorStats& stats) const {
  return OutOfMemory(str(device_.str(), ": the system refused ", bytes,
                         " bytes of host memory or address space for the simulated device; "
                         "choose a smaller --device sim:SIZE, lower the batch or offload more"),
                     bytes, 0, stats.capacity_bytes);
}

}  // namespace mw
