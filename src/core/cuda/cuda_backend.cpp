// The CUDA device's memory: a caching allocator and copies between host and device.
//
// Note [CUDA caching allocator]: cudaMalloc and cudaFree synchronise the device and cost tens of
// microseconds, so freed blocks are kept in a best-fit free list (sizes rounded to 512 bytes) and
// reused when a request fits in a block at most twice its size. When cudaMalloc fails, every cached
// block is returned to the driver and the allocation is retried once; if it still fails the error
// says how much was asked for, how much is free and how much the device has. (Splitting large
// cached blocks, as PyTorch's allocator does, is not done yet.)
//
// Compiled only when the CUDA toolkit is found; plain C++ against the runtime API.
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>

#include "core/allocator.h"
#include "core/cuda/cuda_check.h"
#include "core/error.h"
#include "core/storage.h"

namespace mw {

namespace {

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int index) : index_(index) {
    size_t free_bytes = 0, total_bytes = 0;
    check_cuda(cudaSetDevice(index), "cudaSetDevice");
    check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    stats_.capacity_bytes = static_cast<int64_t>(total_bytes);
  }
  ~CudaCachingAllocator() override { release_cache_locked(); }

  void* allocate(int64_t nbytes) override {
    const int64_t rounded = round_up(std::max<int64_t>(nbytes, 1), 512);
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.alloc_count;
    auto it = free_.lower_bound(rounded);
    if (it != free_.end() && it->first <= 2 * rounded) {
      void* p = it->second;
      const int64_t size = it->first;
      free_.erase(it);
      stats_.cached_bytes -= size;
      sizes_[p] = size;
      account(size);
      ++stats_.cache_hits;
      return p;
    }
    check_cuda(cudaSetDevice(index_), "cudaSetDevice");
    void* p = nullptr;
    if (cudaMalloc(&p, static_cast<size_t>(rounded)) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky error of the failed call
      release_cache_locked();
      if (cudaMalloc(&p, static_cast<size_t>(rounded)) != cudaSuccess) {
        cudaGetLastError();
        size_t free_bytes = 0, total_bytes = 0;
        cudaMemGetInfo(&free_bytes, &total_bytes);
        throw OutOfMemory(str("cuda:", index_, " out of memory: requested ", rounded, " bytes, ",
                              free_bytes, " bytes free of ", total_bytes,
                              "; lower the batch, or enable checkpointing/offload"),
                          rounded, static_cast<int64_t>(free_bytes),
                          static_cast<int64_t>(total_bytes));
      }
    }
    sizes_[p] = rounded;
    account(rounded);
    return p;
  }

  void deallocate(void* ptr, int64_t) override {
    if (!ptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = sizes_.find(ptr);
    MW_CHECK(it != sizes_.end(), "cuda deallocate: pointer not from this allocator");
    stats_.current_bytes -= it->second;
    stats_.cached_bytes += it->second;
    free_.emplace(it->second, ptr);
    sizes_.erase(it);
  }

  Device device() const override { return Device::cuda(index_); }
  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_bytes = stats_.current_bytes;
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cache_locked();
  }

 private:
  void account(int64_t size) {
    stats_.current_bytes += size;
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
  }
  void release_cache_locked() {
    for (auto& [size, p] : free_) cudaFree(p);
    free_.clear();
    stats_.cached_bytes = 0;
  }

  int index_;
  mutable std::mutex mutex_;
  AllocatorStats stats_;
  std::multimap<int64_t, void*> free_;  // size -> block
  std::map<void*, int64_t> sizes_;      // live block -> size
};

}  // namespace

Allocator* cuda_allocator(int index) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<CudaCachingAllocator>> allocators;
  std::lock_guard<std::mutex> lock(mutex);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || index < 0 || index >= count) {
    cudaGetLastError();
    throw DeviceError(str("cuda:", index, " requested but ", count,
                          " CUDA device(s) are visible; use --device cpu or sim"));
  }
  auto& slot = allocators[index];
  if (!slot) slot = std::make_unique<CudaCachingAllocator>(index);
  return slot.get();
}

void cuda_copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                     int64_t nbytes) {
  cudaMemcpyKind kind = cudaMemcpyDefault;  // unified addressing tells the direction
  (void)dst_device;
  (void)src_device;
  check_cuda(cudaMemcpy(dst, src, static_cast<size_t>(nbytes), kind), "cudaMemcpy");
}

}  // namespace mw
