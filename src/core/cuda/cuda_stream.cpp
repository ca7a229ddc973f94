// CUDA streams, events and the pinned host allocator (core/cuda_stream.h, Note [Copy stream and
// events]). Compiled only when the CUDA toolkit is found; plain C++ against the runtime API.
//
// Note [Pinned host allocator]: an asynchronous copy needs page-locked host memory; from pageable
// memory cudaMemcpyAsync stages through a driver buffer and returns only when the host side is
// done, so nothing overlaps. Pinning is expensive (cudaHostAlloc locks and maps every page, and
// cudaFreeHost can synchronise with the device; PyTorch's CachingHostAllocator caches for the same
// reason), so freed blocks are cached by the CachingAllocator core: sizes rounded to 4096 bytes,
// carved from segments by the GPU size classes (core/caching_allocator.h), at most
// kMaxCachedPinnedBytes of wholly free segments kept. When cudaHostAlloc runs out of memory the
// wholly free segments are returned to the driver and the allocation retried once; then
// OutOfMemory. Segments are allocated with cudaHostAllocPortable, so any device's copy stream can
// use them.
//
// Statistics (Note [Allocator statistics]): current_bytes and peak_bytes count pinned blocks in
// use, rounded; cached_bytes the free pinned bytes of its segments, kept for reuse. Pinned memory
// cannot be swapped out, so these bytes are also part of the process RSS.
#include "core/cuda_stream.h"

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <utility>

#include "core/caching_allocator.h"
#include "core/cuda/cuda_check.h"

namespace mw {

namespace {

cudaStream_t native(void* stream) { return static_cast<cudaStream_t>(stream); }
cudaEvent_t native_event(void* event) { return static_cast<cudaEvent_t>(event); }

// Checks that cuda:index exists before a stream or event is created on it, so the error names the
// device and says how many are visible rather than "invalid device ordinal".
void require_device(int index, const char* purpose) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaSuccess && index >= 0 && index < count) return;
  cudaGetLastError();
  const std::string why = err == cudaSuccess
                              ? std::string()
                              : str(" (cudaGetDeviceCount: ", cudaGetErrorString(err), ", ",
                                    static_cast<int>(err), ")");
  throw DeviceError(str(purpose, " on cuda:", index, ": expected a visible CUDA device, found ",
                        err == cudaSuccess ? count : 0, why,
                        "; check nvidia-smi and CUDA_VISIBLE_DEVICES, or use --device cpu or "
                        "sim"));
}

// Makes cuda:index current on the calling thread: the legacy default stream (a null cudaStream_t)
// means the current device's, and events are created on the current device.
void set_device(int index) { check_cuda(cudaSetDevice(index), "cudaSetDevice(", index, ")"); }

constexpr int64_t kPinnedGranule = 4096;  // also the O_DIRECT alignment (kHostAlignment)
constexpr int64_t kMaxCachedPinnedBytes = int64_t{4} << 30;

// How the pinned allocator gets and returns memory: cudaHostAlloc (portable) and cudaFreeHost.
class PinnedSource final : public MemorySource {
 public:
  void* acquire(int64_t bytes) override {
    void* ptr = nullptr;
    const cudaError_t err = cudaHostAlloc(&ptr, static_cast<size_t>(bytes), cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the error: the core empties its cache and asks again
      return nullptr;
    }
    check_cuda(err, "cudaHostAlloc of ", bytes, " bytes of pinned host memory");
    return ptr;
  }
  void release(void* ptr, int64_t /*bytes*/) override {
    cudaFreeHost(ptr);  // a failure leaks nothing we could recover
  }
  OutOfMemory refused(int64_t bytes, const AllocatorStats& stats) const override {
    return OutOfMemory(str("pinned host memory: cudaHostAlloc of ", bytes,
                           " bytes failed (out of memory) with ", stats.current_bytes,
                           " bytes pinned by memwall; free host memory (pinned pages cannot be "
                           "swapped out), lower the batch, or offload fewer activations"),
                       bytes, 0, 0);
  }
};

}  // namespace

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

// ---- CudaStream ----

CudaStream CudaStream::create(int device_index) {
  require_device(device_index, "creating a copy stream");
  set_device(device_index);
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
             "cudaStreamCreateWithFlags(cudaStreamNonBlocking) on cuda:", device_index);
  return CudaStream(device_index, stream, true);
}

CudaStream CudaStream::borrow(int device_index, void* stream) {
  return CudaStream(device_index, stream, false);
}

CudaStream::~CudaStream() {
  if (owned_ && stream_) cudaStreamDestroy(native(stream_));  // enqueued work still completes
}

CudaStream::CudaStream(CudaStream&& other) noexcept
    : device_index_(other.device_index_),
      stream_(std::exchange(other.stream_, nullptr)),
      owned_(std::exchange(other.owned_, false)) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    if (owned_ && stream_) cudaStreamDestroy(native(stream_));
    device_index_ = other.device_index_;
    stream_ = std::exchange(other.stream_, nullptr);
    owned_ = std::exchange(other.owned_, false);
  }
  return *this;
}

void CudaStream::wait(const CudaEvent& event) const {
  set_device(device_index_);
  check_cuda(cudaStreamWaitEvent(native(stream_), native_event(event.handle()), 0),
             "cudaStreamWaitEvent on cuda:", device_index_);
}

void CudaStream::copy_async(void* dst, const void* src, int64_t nbytes) const {
  MW_CHECK_T(InvalidArgument, nbytes >= 0, "copy_async: negative size ", nbytes);
  if (nbytes == 0) return;
  set_device(device_index_);
  check_cuda(
      cudaMemcpyAsync(dst, src, static_cast<size_t>(nbytes), cudaMemcpyDefault, native(stream_)),
      "cudaMemcpyAsync of ", nbytes, " bytes on a stream of cuda:", device_index_);
}

void CudaStream::synchronize() const {
  set_device(device_index_);
  check_cuda(cudaStreamSynchronize(native(stream_)),
             "cudaStreamSynchronize on cuda:", device_index_);
}

// ---- CudaEvent ----

CudaEvent::CudaEvent(int device_index) : device_index_(device_index) {
  require_device(device_index, "creating an event");
  set_device(device_index);
  cudaEvent_t event = nullptr;
  check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
             "cudaEventCreateWithFlags on cuda:", device_index);
  event_ = event;
}

CudaEvent::~CudaEvent() {
  if (event_) cudaEventDestroy(native_event(event_));
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept
    : device_index_(other.device_index_), event_(std::exchange(other.event_, nullptr)) {}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    if (event_) cudaEventDestroy(native_event(event_));
    device_index_ = other.device_index_;
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void CudaEvent::record(const CudaStream& stream) {
  MW_CHECK_T(InvalidArgument, stream.device_index() == device_index_,
             "CudaEvent::record: the event is on cuda:", device_index_,
             " but the stream is on cuda:", stream.device_index(),
             "; create the event on the stream's device");
  set_device(device_index_);
  check_cuda(cudaEventRecord(native_event(event_), native(stream.handle())),
             "cudaEventRecord on cuda:", device_index_);
}

bool CudaEvent::query() const {
  const cudaError_t err = cudaEventQuery(native_event(event_));
  if (err == cudaErrorNotReady) {
    cudaGetLastError();  // "not ready" is an answer, not an error to report later
    return false;
  }
  check_cuda(err, "cudaEventQuery on cuda:", device_index_);
  return true;
}

void CudaEvent::synchronize() const {
  check_cuda(cudaEventSynchronize(native_event(event_)),
             "cudaEventSynchronize on cuda:", device_index_);
}

// ---- pinned memory ----

Allocator& pinned_host_allocator() {
  // Never destroyed: cudaFreeHost during static destruction could run after the CUDA runtime has
  // shut down. The process exit returns the pages.
  static CachingAllocator* allocator =
      new CachingAllocator(Device::cpu(), std::make_unique<PinnedSource>(),
                           gpu_cache_policy(kPinnedGranule, kMaxCachedPinnedBytes), 0, false);
  return *allocator;
}

}  // namespace mw
