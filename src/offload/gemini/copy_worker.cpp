// Note [Copy worker] (copy_worker.h).
#include "offload/gemini/copy_worker.h"

#include <cstring>

namespace mw::gemini {

struct CopyWorker::Job {
  void* dst = nullptr;
  const void* src = nullptr;
  int64_t n = 0;
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
};

bool CopyWorker::Handle::done() const {
  if (!job_) return true;
  std::lock_guard<std::mutex> lock(job_->mutex);
  return job_->done;
}

void CopyWorker::Handle::wait() const {
  if (!job_) return;
  std::unique_lock<std::mutex> lock(job_->mutex);
  job_->finished.wait(lock, [&] { return job_->done; });
}

CopyWorker::CopyWorker() : thread_([this] { run(); }) {}

CopyWorker::~CopyWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

CopyWorker::Handle CopyWorker::copy(void* dst, const void* src, int64_t n) {
  Handle h;
  h.job_ = std::make_shared<Job>();
  h.job_->dst = dst;
  h.job_->src = src;
  h.job_->n = n;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(h.job_);
  }
  wake_.notify_one();
  return h;
}

int64_t CopyWorker::bytes_copied() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return copied_;
}

// Jobs run in the order they were started; the queue drains before the thread ends.
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
    std::memcpy(job->dst, job->src, static_cast<size_t>(job->n));
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
