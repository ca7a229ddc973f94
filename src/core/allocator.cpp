// The device allocator registry, process RSS readings and AlignedBuffer. The allocators themselves
// are CachingAllocators (core/caching_allocator.h) over the host's sources (core/host_memory.h).
#include "core/allocator.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <utility>

#include "core/caching_allocator.h"
#include "core/error.h"
#include "core/host_memory.h"

namespace mw {

namespace {
// Cache bound for host memory: enough for one GPT-2-small step's activations at the documents'
// sizes.
constexpr int64_t kMaxCachedHostBytes = int64_t{4} << 30;
constexpr int kMaxSimDevices = 8;

// Note [Host caching]'s numbers: blocks up to 1 MiB share 2 MiB segments (a 4 KiB bias costs
// 4 KiB, not the 8 KiB aligned_alloc pads it to); a larger block gets a segment of its own size,
// and a free block is split when at least 1 MiB is left, else handed out whole.
std::unique_ptr<CachingAllocator> make_cpu_allocator() {
  return std::make_unique<CachingAllocator>(Device::cpu(),
                                            std::make_unique<HeapSource>(Device::cpu()),
                                            CachePolicy{.granule_bytes = kHostAlignment,
                                                        .max_cached_bytes = kMaxCachedHostBytes,
                                                        .small_max_bytes = int64_t{1} << 20,
                                                        .small_segment_bytes = int64_t{2} << 20,
                                                        .min_split_bytes = int64_t{1} << 20},
                                            0, false);
}

// A sim device splits every block to the granule, so its accounting is exactly what was asked for
// (Note [The sim device]); with a capacity its memory is one reserved segment (Note [Sim arena]).
std::unique_ptr<CachingAllocator> make_sim_allocator(int index) {
  return std::make_unique<CachingAllocator>(Device::sim(index),
                                            std::make_unique<SimSource>(Device::sim(index)),
                                            CachePolicy{.granule_bytes = kHostAlignment,
                                                        .max_cached_bytes = kMaxCachedHostBytes,
                                                        .min_split_bytes = kHostAlignment,
                                                        .reserve_capacity = true},
                                            0, true);
}

struct Registry {
  std::unique_ptr<CachingAllocator> cpu = make_cpu_allocator();
  std::unique_ptr<CachingAllocator> sim[kMaxSimDevices];
  std::mutex mutex;
};
Registry& registry() {
  static Registry r;
  return r;
}

CachingAllocator& sim_allocator(int index) {
  MW_CHECK_T(InvalidArgument, index >= 0 && index < kMaxSimDevices, "sim device index ", index,
             " out of range [0, ", kMaxSimDevices, ")");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto& slot = r.sim[index];
  if (!slot) slot = make_sim_allocator(index);
  return *slot;
}
}  // namespace

Allocator* cuda_allocator(int index);  // core/cuda or core/nocuda

Allocator& allocator_for(Device device) {
  switch (device.kind) {
    case DeviceKind::CPU: return *registry().cpu;
    case DeviceKind::Sim: return sim_allocator(device.index);
    case DeviceKind::CUDA: return *cuda_allocator(device.index);
  }
  throw InvalidArgument("allocator_for: unknown device kind");
}

void set_sim_capacity(int index, int64_t capacity_bytes) {
  sim_allocator(index).set_capacity(capacity_bytes);
}

void limit_cuda_memory(int index, int64_t bytes) {
  auto* caching = dynamic_cast<CachingAllocator*>(&allocator_for(Device::cuda(index)));
  MW_CHECK_T(InvalidArgument, caching != nullptr, "cuda:", index, " has no caching allocator");
  caching->set_limit(bytes);
}

void set_host_max_cached_bytes(int64_t bytes) { registry().cpu->set_max_cached_bytes(bytes); }

void set_sim_max_cached_bytes(int index, int64_t bytes) {
  auto* caching = dynamic_cast<CachingAllocator*>(&allocator_for(Device::sim(index)));
  MW_CHECK_T(InvalidArgument, caching != nullptr, "sim:", index, " has no caching allocator");
  caching->set_max_cached_bytes(bytes);
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
  MW_CHECK_T(InvalidArgument, nbytes >= 0, "AlignedBuffer: negative size ", nbytes);
  data_ = host_heap_acquire(round_up(std::max<int64_t>(nbytes, 1), kHostAlignment));
  if (!data_)
    throw OutOfMemory(str("AlignedBuffer: the system refused ", nbytes, " bytes"), nbytes, 0, 0);
}

AlignedBuffer::AlignedBuffer(int64_t nbytes, Allocator& from)
    : from_(&from), data_(from.allocate(nbytes)), nbytes_(nbytes) {}

AlignedBuffer::~AlignedBuffer() { release(); }

void AlignedBuffer::release() {
  if (!data_) return;
  if (from_)
    from_->deallocate(data_, nbytes_);
  else
    host_heap_release(data_);
  data_ = nullptr;
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : from_(std::exchange(o.from_, nullptr)),
      data_(std::exchange(o.data_, nullptr)),
      nbytes_(std::exchange(o.nbytes_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    release();
    from_ = std::exchange(o.from_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    nbytes_ = std::exchange(o.nbytes_, 0);
  }
  return *this;
}

}  // namespace mw
