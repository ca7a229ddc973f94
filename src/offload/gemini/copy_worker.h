// CopyWorker: copies chunks' bytes from the host to the device beside the compute, the way a GPU's
// copy engine does (Note [Copy worker]).
//
// Note [Copy worker]: a GPU moves bytes between host and device with DMA engines while its SMs
// compute, so a chunk needed two ops from now can be on its way while the current op runs. Gemini
// gives the worker the gathers of the RAM-homed chunks its plan needs in the next two ops (Note
// [Prefetch], tiers.cpp); the op that needs a chunk waits for its copy, and no copy is ever
// abandoned: releasing a chunk whose copy is in flight waits for it first.
//  - On sim, device memory is host memory and a copy is a memcpy, which takes a core: one thread
//    of ours runs them in the order they were started. It pays off only where a core is free for
//    it; with every core computing it takes its time from the GEMMs instead (docs/gemini.md), so
//    gpt2_train starts it by default only when the machine has more cores than --threads.
//  - On CUDA (Note [Copy stream and events], core/cuda_stream.h), a copy stream: the bytes go
//    from the host home into a pinned staging buffer (filled on the calling thread, by the pool:
//    a copy from pageable memory would make the host wait for the stream), then cudaMemcpyAsync
//    on the copy stream, after an event that orders it behind the compute stream's work so far
//    (the device block may be a recycled one that queued kernels still read). The op that needs
//    the chunk makes the compute stream wait on the copy's event (the host does not block); a
//    release synchronises the host on it before the device block or the staging buffer is reused.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "core/device.h"

namespace mw {
class CudaStream;
class CudaEvent;
}  // namespace mw

namespace mw::gemini {

class CopyWorker {
  struct Job;

 public:
  // A started copy. A default handle is a finished copy of nothing.
  class Handle {
   public:
    Handle() = default;
    bool done() const;  // never blocks
    // The device's next work sees the bytes: on sim the caller blocks until they are there; on
    // CUDA the compute stream waits for the copy and the host goes on.
    void wait() const;
    // The host blocks until the copy is done (its buffers may then be freed or changed).
    void join() const;

   private:
    friend class CopyWorker;
    std::shared_ptr<Job> job_;
  };

  // `device`: a sim device (a thread) or a CUDA one (a copy stream on it).
  explicit CopyWorker(Device device);
  ~CopyWorker();  // finishes every copy started
  CopyWorker(const CopyWorker&) = delete;
  CopyWorker& operator=(const CopyWorker&) = delete;

  // Starts a copy of n bytes from host memory to `dst` on the device; `src` must stay unchanged
  // and `dst` alive until the handle is joined.
  Handle copy(void* dst, const void* src, int64_t n);
  // The same with the n bytes made by `fill` (Note [16-bit copies]: a chunk's copy rounded as it
  // is written): on sim it writes `dst` on the worker's thread, on CUDA the staging buffer on the
  // calling thread. What it reads must stay unchanged until the handle is joined.
  using Fill = std::function<void(void* to)>;
  Handle copy(void* dst, int64_t n, Fill fill);
  // Bytes copied so far, for tests.
  int64_t bytes_copied() const;

 private:
  void run();
  Handle copy_on_stream(void* dst, int64_t n, const Fill& fill);

  Device device_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  int64_t copied_ = 0;
  std::thread thread_;                         // sim
  std::unique_ptr<CudaStream> stream_;         // cuda
  std::deque<std::shared_ptr<Job>> streamed_;  // cuda: copies on the stream not known done
};

}  // namespace mw::gemini
