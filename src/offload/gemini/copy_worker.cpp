// Note [Copy worker] (copy_worker.h).
#include "offload/gemini/copy_worker.h"

#include <cstring>
#include <optional>

#include "core/cuda_stream.h"
#include "core/error.h"
#include "core/storage.h"

namespace mw::gemini {

struct CopyWorker::Job {
  // sim: the copy the thread runs, and its completion.
  void* dst = nullptr;
  int64_t n = 0;
  Fill fill;
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  // cuda: the pinned staging buffer the copy reads, and the copy stream's event after it.
  std::optional<PinnedHostBuffer> staging;
  std::unique_ptr<CudaEvent> event;
  int device_index = 0;
  ~Job() {
    if (event) event->synchronize();  // never free a staging buffer the copy still reads
  }
};

bool CopyWorker::Handle::done() const {
  if (!job_) return true;
  if (job_->event) return job_->event->query();
  std::lock_guard<std::mutex> lock(job_->mutex);
  return job_->done;
}

void CopyWorker::Handle::wait() const {
  if (job_ && job_->event)  // the compute stream waits; the host goes on
    return CudaStream::borrow(job_->device_index, nullptr).wait(*job_->event);
  join();
}

void CopyWorker::Handle::join() const {
  if (!job_) return;
  if (job_->event) return job_->event->synchronize();
  std::unique_lock<std::mutex> lock(job_->mutex);
  job_->finished.wait(lock, [&] { return job_->done; });
}

CopyWorker::CopyWorker(Device device) : device_(device) {
  MW_CHECK_T(InvalidArgument, device.is_sim() || device.is_cuda(),
             "the copy worker copies to a sim or cuda device, got ", device.str());
  if (device.is_cuda())
    stream_ = std::make_unique<CudaStream>(CudaStream::create(device.index));
  else
    thread_ = std::thread([this] { run(); });
}

CopyWorker::~CopyWorker() {
  if (stream_) {
    try {
      stream_->synchronize();
    } catch (...) {  // a failed device: nothing left to wait for
    }
    streamed_.clear();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

CopyWorker::Handle CopyWorker::copy(void* dst, const void* src, int64_t n) {
  return copy(dst, n, [src, n](void* to) { std::memcpy(to, src, static_cast<size_t>(n)); });
}

CopyWorker::Handle CopyWorker::copy(void* dst, int64_t n, Fill fill) {
  if (stream_) return copy_on_stream(dst, n, fill);
  Handle h;
  h.job_ = std::make_shared<Job>();
  h.job_->dst = dst;
  h.job_->n = n;
  h.job_->fill = std::move(fill);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(h.job_);
  }
  wake_.notify_one();
  return h;
}

// Note [Copy worker], CUDA: staged through pinned memory, ordered behind the compute stream.
CopyWorker::Handle CopyWorker::copy_on_stream(void* dst, int64_t n, const Fill& fill) {
  Handle h;
  h.job_ = std::make_shared<Job>();
  Job& job = *h.job_;
  job.device_index = device_.index;
  job.staging.emplace(n);
  fill(job.staging->data());
  CudaEvent ready(device_.index);
  ready.record(CudaStream::borrow(device_.index, nullptr));
  stream_->wait(ready);
  stream_->copy_async(dst, job.staging->data(), n);
  job.event = std::make_unique<CudaEvent>(device_.index);
  job.event->record(*stream_);
  std::lock_guard<std::mutex> lock(mutex_);
  copied_ += n;
  // Kept until done, so that dropping a handle after wait() never blocks the host; the stream
  // completes copies in order, so the done ones are at the front.
  while (!streamed_.empty() && streamed_.front()->event->query()) streamed_.pop_front();
  streamed_.push_back(h.job_);
  return h;
}

int64_t CopyWorker::bytes_copied() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return copied_;
}

// sim: jobs run in the order they were started; the queue drains before the thread ends.
void CopyWorker::run() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job->fill(job->dst);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      copied_ += job->n;
    }
    {
      std::lock_guard<std::mutex> lock(job->mutex);
      job->done = true;
    }
    job->finished.notify_all();
  }
}

}  // namespace mw::gemini
