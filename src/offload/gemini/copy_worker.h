// CopyWorker: one thread that copies bytes into sim device memory beside the compute threads, the
// stand-in for a GPU's copy engine (Note [Copy worker]).
//
// Note [Copy worker]: a GPU moves bytes between host and device with DMA engines while its SMs
// compute, so a chunk needed two ops from now can be on its way while the current op runs. Sim's
// device memory is host memory and its copies are memcpy, which take a core: here one thread of
// our own runs them, in the order they were started. Gemini gives it the gathers of the
// RAM-homed chunks its plan needs in the next two ops (Note [Prefetch], tiers.cpp); the op that
// needs the chunk waits for the copy (prefetch_wait_ms), and no copy is ever abandoned: releasing
// a chunk whose copy is queued waits for it first. The worker pays off only where a core is free
// for it: with every core computing it takes its time from the GEMMs instead (measured in
// docs/gemini.md), so gpt2_train starts it when the machine has more cores than --threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace mw::gemini {

class CopyWorker {
  struct Job;

 public:
  // A started copy. A default handle is a finished copy of nothing.
  class Handle {
   public:
    Handle() = default;
    bool done() const;  // never blocks
    void wait() const;  // blocks until the bytes are all at their destination
   private:
    friend class CopyWorker;
    std::shared_ptr<Job> job_;
  };

  CopyWorker();
  ~CopyWorker();  // finishes every copy started, then joins the thread
  CopyWorker(const CopyWorker&) = delete;
  CopyWorker& operator=(const CopyWorker&) = delete;

  // Queues a copy of n bytes between host-addressable memories; `src` must stay unchanged and
  // both buffers alive until the handle is done.
  Handle copy(void* dst, const void* src, int64_t n);
  // Bytes copied so far, for tests.
  int64_t bytes_copied() const;

 private:
  void run();

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  int64_t copied_ = 0;
  std::thread thread_;
};

}  // namespace mw::gemini
