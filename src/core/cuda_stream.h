// CUDA streams, events and pinned host memory: what lets a copy overlap kernels.
//
// Note [Copy stream and events]: memwall's kernels run on one *compute* stream (the legacy default
// stream unless a caller passes another). An asynchronous copy runs on a *copy* stream created with
// cudaStreamNonBlocking, so it neither waits for nor holds up the compute stream, except where an
// event orders them:
//   - before a copy reads or writes device bytes, the copy stream waits on an event recorded on the
//     compute stream, so the copy sees every kernel enqueued so far (the producer of a saved
//     tensor; the last user of a recycled cached block);
//   - after the copy, an event is recorded on the copy stream; the compute stream waits on it
//     before it uses the bytes (cudaStreamWaitEvent: the host does not block), and the host polls
//     or synchronises on it before it frees or reuses a buffer the copy touches.
// Copies from or to pageable host memory are not asynchronous, so the host side of such a copy is a
// PinnedHostBuffer (page-locked, from a caching allocator with its own statistics).
//
// Without CUDA (core/nocuda) every constructor here throws DeviceError saying that memwall was
// built without CUDA, and cuda_device_count() is 0: callers need no #ifdef. Every CUDA call is
// checked; a failure throws DeviceError naming the call, the device and what to do.
#pragma once

#include <cstdint>

#include "core/allocator.h"

namespace mw {

// Visible CUDA devices: 0 when memwall was built without CUDA, or no driver or GPU is present.
// Never throws (tests use it to skip).
int cuda_device_count();

class CudaEvent;

// A CUDA stream on one device. Move-only; an owned stream is destroyed with the object (work
// already enqueued still completes).
class CudaStream {
 public:
  // A new stream on cuda:device_index that does not synchronise with the legacy default stream.
  static CudaStream create(int device_index);
  // A non-owning handle to an existing stream: a cudaStream_t passed as void*, nullptr = the
  // legacy default stream (memwall's compute stream).
  static CudaStream borrow(int device_index, void* stream);

  ~CudaStream();
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  // Work enqueued on this stream from now on starts after `event` has completed.
  void wait(const CudaEvent& event) const;
  // cudaMemcpyAsync of nbytes; the direction comes from unified addressing. A host side that is
  // not pinned makes the copy synchronous with the host (correct, but it does not overlap).
  void copy_async(void* dst, const void* src, int64_t nbytes) const;
  // Blocks the calling thread until everything enqueued on this stream is done.
  void synchronize() const;

  int device_index() const { return device_index_; }
  void* handle() const { return stream_; }  // the cudaStream_t

 private:
  CudaStream(int device_index, void* stream, bool owned)
      : device_index_(device_index), stream_(stream), owned_(owned) {}
  int device_index_ = 0;
  void* stream_ = nullptr;
  bool owned_ = false;
};

// A CUDA event (timing disabled) on one device. Move-only.
class CudaEvent {
 public:
  explicit CudaEvent(int device_index);
  ~CudaEvent();
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  // Captures the work enqueued on `stream` so far; the stream must be on this event's device.
  void record(const CudaStream& stream);
  // True when the captured work is done, or the event was never recorded. Does not block.
  bool query() const;
  // Blocks the calling thread until the captured work is done.
  void synchronize() const;

  int device_index() const { return device_index_; }
  void* handle() const { return event_; }  // the cudaEvent_t

 private:
  int device_index_ = 0;
  void* event_ = nullptr;
};

// The pinned (page-locked) host allocator: a CachingAllocator (core/caching_allocator.h) over
// cudaHostAlloc / cudaFreeHost (Note [Pinned host allocator], core/cuda/cuda_stream.cpp). Its
// device() is cpu: the bytes are host memory. Its stats() count pinned bytes only, apart from the
// cpu allocator's. Throws DeviceError when memwall was built without CUDA.
Allocator& pinned_host_allocator();

// An owning block of pinned host memory from pinned_host_allocator(): an AlignedBuffer whose bytes
// are page-locked. Move-only.
class PinnedHostBuffer : public AlignedBuffer {
 public:
  explicit PinnedHostBuffer(int64_t nbytes) : AlignedBuffer(nbytes, pinned_host_allocator()) {}
};

}  // namespace mw
