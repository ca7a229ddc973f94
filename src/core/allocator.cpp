// CachingHostAllocator, the device allocator registry, and process RSS readings.
#include "core/allocator.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "core/error.h"

namespace mw {

CachingHostAllocator::CachingHostAllocator(Device device, int64_t capacity_bytes,
                                           int64_t max_cached_bytes)
    : device_(device), max_cached_bytes_(max_cached_bytes) {
  stats_.capacity_bytes = capacity_bytes;
}

CachingHostAllocator::~CachingHostAllocator() { empty_cache(); }

void* CachingHostAllocator::allocate(int64_t nbytes) {
  MW_CHECK_T(InvalidArgument, nbytes >= 0, "allocate: negative size ", nbytes);
  int64_t rounded = round_up(std::max<int64_t>(nbytes, 1), kHostAlignment);
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.alloc_count;
  if (stats_.capacity_bytes > 0 && stats_.current_bytes + rounded > stats_.capacity_bytes) {
    int64_t free_bytes = stats_.capacity_bytes - stats_.current_bytes;
    throw OutOfMemory(
        str(device_.str(), " out of memory: requested ", rounded, " bytes, ", free_bytes,
            " bytes free of a ", stats_.capacity_bytes,
            "-byte capacity. Raise the capacity (--device sim:SIZE), lower the batch, or enable "
            "checkpointing/offload."),
        rounded, free_bytes, stats_.capacity_bytes);
  }
  void* ptr = nullptr;
  int64_t block = rounded;
  if (arena_mode_) {  // Note [Sim arena]
    ptr = arenas_.back()->allocate(rounded);
    if (!ptr) {
      ++stats_.arena_fallbacks;
      ptr = heap_allocate_locked(rounded);
    }
  } else {
    // Best fit: the smallest cached block that is big enough.
    auto it = cache_.lower_bound(rounded);
    while (it != cache_.end() && it->second.empty()) ++it;
    // A sim device reuses only exact sizes, so its accounting is exactly what was asked for.
    // Large blocks (32 MiB and up: logits, the embedding gradient) take at most 1/8 more, so a
    // 98 MiB logits buffer never takes the 147 MiB block that the embedding gradient needs next,
    // which would make every step fault in a fresh 147 MiB (measured: 19% of step time in page
    // clearing).
    const int64_t slack = rounded >= (int64_t{32} << 20) ? rounded / 8 : rounded;
    const int64_t max_block = device_.is_sim() ? rounded : rounded + slack;
    if (it != cache_.end() && it->first <= max_block) {
      block = it->first;
      ptr = it->second.back();
      it->second.pop_back();
      stats_.cached_bytes -= block;
      ++stats_.cache_hits;
    } else {
      if (stats_.capacity_bytes > 0 &&
          stats_.current_bytes + stats_.cached_bytes + rounded > stats_.capacity_bytes)
        free_cached_locked(stats_.current_bytes + stats_.cached_bytes + rounded -
                           stats_.capacity_bytes);  // the cache lives inside the capacity
      ptr = heap_allocate_locked(rounded);
    }
  }
  live_[ptr] = block;
  stats_.current_bytes += block;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
  return ptr;
}

void* CachingHostAllocator::heap_allocate_locked(int64_t rounded) {
  void* ptr = std::aligned_alloc(kHostAlignment, rounded);
  if (!ptr) {
    free_cached_locked(-1);
    ptr = std::aligned_alloc(kHostAlignment, rounded);
  }
  if (!ptr)
    throw OutOfMemory(str(device_.str(), ": the system refused ", rounded,
                          " bytes of host memory; lower the batch or offload more"),
                      rounded, 0, stats_.capacity_bytes);
  return ptr;
}

void CachingHostAllocator::deallocate(void* ptr, int64_t /*nbytes*/) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = live_.find(ptr);
  MW_CHECK(found != live_.end(), device_.str(),
           ": deallocate of a pointer this allocator did not give");
  const int64_t block = found->second;
  live_.erase(found);
  stats_.current_bytes -= block;
  if (arena_free_locked(ptr, block)) return;
  if (arena_mode_) {  // a heap block of a fragmented arena, or one from before the arena
    std::free(ptr);
    return;
  }
  // A capped (sim) device's cache lives inside its capacity, as a GPU caching allocator's does, so
  // the bytes a sim device holds (in use + cached) never exceed what it was given.
  const bool within_capacity =
      stats_.capacity_bytes == 0 ||
      stats_.current_bytes + stats_.cached_bytes + block <= stats_.capacity_bytes;
  if (within_capacity && stats_.cached_bytes + block <= max_cached_bytes_) {
    cache_[block].push_back(ptr);
    stats_.cached_bytes += block;
  } else {
    std::free(ptr);
  }
}

// Note [Freeing just enough]: a capped device whose next block does not fit beside its cache frees
// cached blocks only until it does: the smallest block that covers what is still missing, else
// the largest, again. Freed blocks come back as fresh pages the kernel must fault in and clear,
// so emptying the whole cache at every miss (as this did) made Gemini on a tight sim device fault
// in 2.5x the pages of the plain run (measured: 1.40M minor faults in 4 GPT-2 small steps on
// sim:768MiB against 0.56M).
void CachingHostAllocator::free_cached_locked(int64_t needed_bytes) {
  int64_t need = needed_bytes < 0 ? stats_.cached_bytes : needed_bytes;
  while (need > 0 && !cache_.empty()) {
    auto it = cache_.lower_bound(need);
    if (it == cache_.end()) it = std::prev(cache_.end());
    if (it->second.empty()) {  // allocate() leaves emptied sizes behind
      cache_.erase(it);
      continue;
    }
    std::free(it->second.back());
    it->second.pop_back();
    stats_.cached_bytes -= it->first;
    need -= it->first;
    if (it->second.empty()) cache_.erase(it);
  }
}

AllocatorStats CachingHostAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingHostAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_bytes = stats_.current_bytes;
}

void CachingHostAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  free_cached_locked(-1);
}

void CachingHostAllocator::set_max_cached_bytes(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  max_cached_bytes_ = bytes;
  if (stats_.cached_bytes > bytes) free_cached_locked(stats_.cached_bytes - bytes);
}

bool CachingHostAllocator::arena_free_locked(void* ptr, int64_t block) {
  for (size_t a = 0; a < arenas_.size(); ++a) {
    if (!arenas_[a]->owns(ptr)) continue;
    arenas_[a]->deallocate(ptr, block);
    const bool current = arena_mode_ && a + 1 == arenas_.size();
    if (!current && arenas_[a]->in_use_bytes() == 0)
      arenas_.erase(arenas_.begin() + static_cast<std::ptrdiff_t>(a));
    return true;
  }
  return false;
}

void CachingHostAllocator::set_capacity(int64_t capacity_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.capacity_bytes = capacity_bytes;
  if (!device_.is_sim()) return;
  free_cached_locked(-1);  // cached heap blocks: the arena replaces the cache, or a new one starts
  const int64_t bytes = round_up(capacity_bytes, kHostAlignment);
  const bool reuse = arena_mode_ && capacity_bytes > 0 && arenas_.back()->size_bytes() == bytes;
  if (!reuse && arena_mode_ && arenas_.back()->in_use_bytes() == 0) arenas_.pop_back();
  if (!reuse && capacity_bytes > 0)
    arenas_.push_back(std::make_unique<Arena>(bytes, kHostAlignment));
  arena_mode_ = capacity_bytes > 0;
}

namespace {
// Cache bound for host memory: enough for one GPT-2-small step's activations at the documents'
// sizes.
constexpr int64_t kMaxCachedHostBytes = int64_t{4} << 30;
constexpr int kMaxSimDevices = 8;

struct Registry {
  CachingHostAllocator cpu{Device::cpu(), 0, kMaxCachedHostBytes};
  std::unique_ptr<CachingHostAllocator> sim[kMaxSimDevices];
  std::mutex mutex;
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

Allocator* cuda_allocator(int index);  // core/cuda or core/cuda_stub.cpp

Allocator& allocator_for(Device device) {
  Registry& r = registry();
  switch (device.kind) {
    case DeviceKind::CPU: return r.cpu;
    case DeviceKind::Sim: {
      MW_CHECK_T(InvalidArgument, device.index >= 0 && device.index < kMaxSimDevices,
                 "sim device index ", device.index, " out of range [0, ", kMaxSimDevices, ")");
      std::lock_guard<std::mutex> lock(r.mutex);
      auto& slot = r.sim[device.index];
      if (!slot) slot = std::make_unique<CachingHostAllocator>(device, 0, kMaxCachedHostBytes);
      return *slot;
    }
    case DeviceKind::CUDA: return *cuda_allocator(device.index);
  }
  throw InvalidArgument("allocator_for: unknown device kind");
}

void set_sim_capacity(int index, int64_t capacity_bytes) {
  static_cast<CachingHostAllocator&>(allocator_for(Device::sim(index)))
      .set_capacity(capacity_bytes);
}

int64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

int64_t current_rss_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long pages_total = 0, pages_resident = 0;
  int n = std::fscanf(f, "%ld %ld", &pages_total, &pages_resident);
  std::fclose(f);
  return n == 2 ? static_cast<int64_t>(pages_resident) * sysconf(_SC_PAGESIZE) : 0;
}

AlignedBuffer::AlignedBuffer(int64_t nbytes) : nbytes_(nbytes) {
  data_ =
      std::aligned_alloc(kHostAlignment, round_up(std::max<int64_t>(nbytes, 1), kHostAlignment));
  if (!data_)
    throw OutOfMemory(str("AlignedBuffer: the system refused ", nbytes, " bytes"), nbytes, 0, 0);
}
AlignedBuffer::~AlignedBuffer() { std::free(data_); }
AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept : data_(o.data_), nbytes_(o.nbytes_) {
  o.data_ = nullptr;
  o.nbytes_ = 0;
}
AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = o.data_;
    nbytes_ = o.nbytes_;
    o.data_ = nullptr;
    o.nbytes_ = 0;
  }
  return *this;
}

}  // namespace mw
