// The CUDA device's memory: a caching allocator and copies between host and device.
//
// Note [CUDA caching allocator]: cudaMalloc and cudaFree synchronise the device and cost tens of
// microseconds, so freed blocks are kept by the caching-allocator core (core/caching_allocator.h:
// sizes rounded to 512 bytes, carved from segments by the GPU size classes, split and merged as
// PyTorch's allocator does). When cudaMalloc fails, every wholly free segment is returned to the
// driver and the allocation is retried once; if it still fails the error says how much was asked
// for, how much is free and how much the device has.
//
// Compiled only when the CUDA toolkit is found; plain C++ against the runtime API.
#include <cuda_runtime.h>

#include <limits>
#include <map>
#include <memory>
#include <mutex>

#include "core/caching_allocator.h"
#include "core/cuda/cuda_check.h"
#include "core/error.h"
#include "core/storage.h"

namespace mw {

namespace {

// How cuda:index's allocator gets and returns memory: cudaMalloc and cudaFree.
class CudaSource final : public MemorySource {
 public:
  explicit CudaSource(int index) : index_(index) {}
  void* acquire(int64_t bytes) override {
    check_cuda(cudaSetDevice(index_), "cudaSetDevice");
    void* p = nullptr;
    if (cudaMalloc(&p, static_cast<size_t>(bytes)) == cudaSuccess) return p;
    cudaGetLastError();  // clear the sticky error of the failed call
    return nullptr;
  }
  void release(void* ptr, int64_t /*bytes*/) override { cudaFree(ptr); }
  OutOfMemory refused(int64_t bytes, const AllocatorStats& /*stats*/) const override {
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    return OutOfMemory(
        str("cuda:", index_, " out of memory: requested ", bytes, " bytes, ", free_bytes,
            " bytes free of ", total_bytes, "; lower the batch, or enable checkpointing/offload"),
        bytes, static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes));
  }

 private:
  int index_;
};

// The CUDA cache keeps every freed segment (the device's memory is the bound), granule 512 bytes,
// the GPU size classes (core/caching_allocator.h); the capacity is the device's memory, reported,
// not enforced (cudaMalloc fails first).
std::unique_ptr<CachingAllocator> make_cuda_allocator(int index) {
  size_t free_bytes = 0, total_bytes = 0;
  check_cuda(cudaSetDevice(index), "cudaSetDevice");
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return std::make_unique<CachingAllocator>(
      Device::cuda(index), std::make_unique<CudaSource>(index),
      gpu_cache_policy(512, std::numeric_limits<int64_t>::max()), static_cast<int64_t>(total_bytes),
      false);
}

}  // namespace

Allocator* cuda_allocator(int index) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<CachingAllocator>> allocators;
  std::lock_guard<std::mutex> lock(mutex);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || index < 0 || index >= count) {
    cudaGetLastError();
    throw DeviceError(str("cuda:", index, " requested but ", count,
                          " CUDA device(s) are visible; use --device cpu or sim"));
  }
  auto& slot = allocators[index];
  if (!slot) slot = make_cuda_allocator(index);
  return slot.get();
}

void cuda_copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                     int64_t nbytes) {
  cudaMemcpyKind kind = cudaMemcpyDefault;  // unified addressing tells the direction
  // On the legacy stream of the device the copy touches (the source's when both are GPUs), so
  // that it follows that device's kernels: the thread's current device may be another GPU's.
  const int index = src_device.is_cuda() ? src_device.index : dst_device.index;
  check_cuda(cudaSetDevice(index), "cudaSetDevice(", index, ") for a copy");
  check_cuda(cudaMemcpy(dst, src, static_cast<size_t>(nbytes), kind), "cudaMemcpy");
}

}  // namespace mw
