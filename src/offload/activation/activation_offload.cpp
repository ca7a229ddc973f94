// The activation offloader: background device<->host copies of saved tensors
// (Note [Activation offload], Note [CUDA activation offload]).
//
// Each offloaded device storage has one StorageCopy, whose state moves
//   ToHost -> OnHost -> (ToDevice -> OnDevice -> OnHost)*     (prefetch cycles)
//   ToHost -> Resident                                          (unpacked before its copy started)
//   any    -> Failed                                            (a copy threw)
// All state changes happen under Impl::mutex; the bytes are copied with the mutex released.
//
// The device kind changes only *how* a copy is done, never the states: on sim the worker copies
// with memcpy (copy_bytes); on CUDA pack enqueues the device->host copy on a copy stream, the
// worker waits for its event, and a host->device copy is enqueued (on the worker for a prefetch)
// with an event that the compute stream waits on before using the bytes.
#include "offload/activation/activation_offload.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "autograd/autograd.h"
#include "core/cuda_stream.h"
#include "core/tensor.h"

namespace mw::offload {

namespace {

enum class CopyState { ToHost, OnHost, ToDevice, OnDevice, Resident, Failed };

struct StorageCopy {
  CopyState state = CopyState::ToHost;
  bool job_started = false;  // the queued copy (ToHost or ToDevice) is being done by someone
  Device device;
  int64_t nbytes = 0;
  int64_t sequence = 0;                     // pack order
  std::shared_ptr<Storage> device_storage;  // ToHost: the source; OnDevice/Resident: the data
  std::shared_ptr<Storage> host;            // set from OnHost on
  std::weak_ptr<Storage> origin;            // the storage packed (sharing between views)
  std::exception_ptr error;
  // The offloader's count of prefetched device bytes; a copy dropped while prefetched (a graph
  // freed without backward) gives its bytes back here.
  std::shared_ptr<std::atomic<int64_t>> prefetched_bytes;
  // CUDA only: the host copy is pinned (and `host` stays empty); the events mark the end of the
  // device->host copy and of the latest host->device copy, on the copy stream.
  std::unique_ptr<PinnedHostBuffer> pinned;
  std::unique_ptr<CudaEvent> to_host_done, to_device_done;

  ~StorageCopy() {
    if (state == CopyState::OnDevice || state == CopyState::ToDevice) *prefetched_bytes -= nbytes;
    // CUDA: a copy may still read or write the pinned buffer or device_storage (a graph freed
    // while a copy is in flight); they go back to their caches only after it has finished.
    wait_quietly(to_host_done.get());
    wait_quietly(to_device_done.get());
  }
  // A destructor must not throw; a device that failed here fails the next CUDA call loudly.
  static void wait_quietly(const CudaEvent* event) noexcept {
    if (!event) return;
    try {
      event->synchronize();
    } catch (...) {
    }
  }
};

// The streams of one CUDA device (Note [Copy stream and events], core/cuda_stream.h).
struct CudaLane {
  CudaStream copy;     // created by the offloader: every D2H and H2D copy runs here
  CudaStream compute;  // borrowed: ActivationOffloadOptions::cuda_compute_stream
};

// What pack returns: a kept tensor, or a view description onto a StorageCopy.
struct Packed {
  Tensor kept;
  std::shared_ptr<StorageCopy> copy;
  int64_t offset = 0;
  Shape shape, strides;
  DType dtype = DType::F32;
};

enum class JobKind { ToHost, ToDevice };
struct Job {
  JobKind kind;
  std::shared_ptr<StorageCopy> copy;
};

}  // namespace

struct ActivationOffloader::Impl {
  explicit Impl(ActivationOffloadOptions o) : options(o) {
    if (options.background) worker = std::thread([this] { run_worker(); });
  }
  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    work_cv.notify_all();
    if (worker.joinable()) worker.join();
  }

  std::shared_ptr<void> pack(const Tensor& t);
  Tensor unpack(const Packed& p);
  void run_worker();
  void drop_queued(const StorageCopy& c);  // mutex held
  bool start_to_host_cuda(StorageCopy& c, std::unique_lock<std::mutex>& lock);
  void copy_to_host(StorageCopy& c, std::unique_lock<std::mutex>& lock);
  std::shared_ptr<Storage> copy_to_device(StorageCopy& c, std::unique_lock<std::mutex>& lock);
  void schedule_prefetch_before(int64_t sequence);  // mutex held
  CudaLane& lane_for(int device_index);             // mutex held

  ActivationOffloadOptions options;
  mutable std::mutex mutex;
  std::condition_variable work_cv;   // the worker waits for jobs
  std::condition_variable state_cv;  // unpack waits for copies
  std::deque<Job> jobs;
  int64_t jobs_running = 0;
  bool stop = false;
  std::thread worker;
  // Pack order, for prefetching backwards. Expired entries are pruned as they are met.
  std::map<int64_t, std::weak_ptr<StorageCopy>> order;
  int64_t next_sequence = 0;
  std::unordered_map<const Storage*, std::weak_ptr<StorageCopy>> by_storage;
  // Device bytes in ToDevice/OnDevice copies (changed under the mutex, read by ~StorageCopy).
  std::shared_ptr<std::atomic<int64_t>> prefetched_bytes =
      std::make_shared<std::atomic<int64_t>>(0);
  int64_t pending_to_host_bytes = 0;  // bytes in ToHost copies
  ActivationOffloadStats stats;
  // One per CUDA device used, made at its first pack and kept (the pointers stay valid) until the
  // offloader goes.
  std::map<int, std::unique_ptr<CudaLane>> cuda_lanes;
};

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

CudaLane& ActivationOffloader::Impl::lane_for(int device_index) {
  std::unique_ptr<CudaLane>& lane = cuda_lanes[device_index];
  if (!lane) {
    lane = std::make_unique<CudaLane>(
        CudaLane{CudaStream::create(device_index),
                 CudaStream::borrow(device_index, options.cuda_compute_stream)});
  }
  return *lane;
}

// CUDA pack: enqueues c's device->host copy into a pinned buffer on the copy stream, behind the
// compute stream's work so far (the kernels that produced the tensor), and records to_host_done
// after it. Nothing waits here. Called with the lock held; the CUDA calls run without it. Returns
// false, with c Failed and its error kept, when the copy could not be enqueued (no pinned memory).
bool ActivationOffloader::Impl::start_to_host_cuda(StorageCopy& c,
                                                   std::unique_lock<std::mutex>& lock) {
  std::exception_ptr error;
  try {
    CudaLane& lane = lane_for(c.device.index);
    const void* src = c.device_storage->data();
    lock.unlock();
    try {
      auto pinned = std::make_unique<PinnedHostBuffer>(c.nbytes);
      CudaEvent produced(c.device.index);
      auto done = std::make_unique<CudaEvent>(c.device.index);
      produced.record(lane.compute);
      lane.copy.wait(produced);
      lane.copy.copy_async(pinned->data(), src, c.nbytes);
      try {
        done->record(lane.copy);
      } catch (...) {
        lane.copy.synchronize();  // the copy may be in flight: pinned must outlive it
        throw;
      }
      lock.lock();
      c.pinned = std::move(pinned);
      c.to_host_done = std::move(done);
    } catch (...) {
      if (!lock.owns_lock()) lock.lock();
      throw;
    }
  } catch (...) {
    error = std::current_exception();
  }
  if (!error) return true;
  c.state = CopyState::Failed;
  c.error = error;
  return false;
}

// Makes c's host copy: sim copies c.device_storage to a fresh host storage; CUDA waits for the
// copy that pack enqueued (to_host_done). Runs with the mutex released; drops the device reference
// when done. Called with the lock held and job_started set.
void ActivationOffloader::Impl::copy_to_host(StorageCopy& c, std::unique_lock<std::mutex>& lock) {
  std::shared_ptr<Storage> src = c.device_storage;
  lock.unlock();
  std::shared_ptr<Storage> host;
  std::exception_ptr error;
  try {
    if (c.device.is_cuda()) {
      c.to_host_done->synchronize();  // set by pack before the job was queued; never reassigned
    } else {
      host = Storage::create(c.nbytes, options.host);
      copy_bytes(host->data(), options.host, src->data(), src->device(), c.nbytes);
    }
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  c.job_started = false;
  pending_to_host_bytes -= c.nbytes;
  if (error) {
    c.state = CopyState::Failed;
    c.error = error;
  } else {
    c.host = std::move(host);
    c.device_storage.reset();
    c.state = CopyState::OnHost;
    stats.to_host_bytes += c.nbytes;
  }
  lock.unlock();
  src.reset();  // may free the device bytes: outside the lock
  lock.lock();
}

// Copies c's host copy to a fresh device storage with the mutex released. Returns it (or throws).
// On CUDA the copy is only enqueued, on the copy stream behind the compute stream's work so far
// (a recycled cached block may still be read by a kernel), with to_device_done recorded after it;
// whoever hands the storage to the compute stream makes it wait on that event first.
std::shared_ptr<Storage> ActivationOffloader::Impl::copy_to_device(
    StorageCopy& c, std::unique_lock<std::mutex>& lock) {
  std::shared_ptr<Storage> host = c.host;
  CudaLane* lane = nullptr;
  std::exception_ptr error;
  if (c.device.is_cuda()) {
    try {
      lane = &lane_for(c.device.index);
      if (!c.to_device_done) c.to_device_done = std::make_unique<CudaEvent>(c.device.index);
    } catch (...) {
      error = std::current_exception();
    }
  }
  lock.unlock();
  std::shared_ptr<Storage> dev;
  if (!error) {
    try {
      dev = Storage::create(c.nbytes, c.device);
      if (lane) {
        CudaEvent compute_mark(c.device.index);
        compute_mark.record(lane->compute);
        lane->copy.wait(compute_mark);
        lane->copy.copy_async(dev->data(), c.pinned->data(), c.nbytes);
        try {
          c.to_device_done->record(lane->copy);
        } catch (...) {
          lane->copy.synchronize();  // the copy may be in flight: dev must outlive it
          throw;
        }
      } else {
        copy_bytes(dev->data(), c.device, host->data(), options.host, c.nbytes);
      }
    } catch (...) {
      error = std::current_exception();
    }
  }
  lock.lock();
  if (error) std::rethrow_exception(error);
  stats.to_device_bytes += c.nbytes;
  return dev;
}

// A cancelled copy's queued job goes, so that the saved tensor's handle is the copy's last owner:
// once the caller drops it, the device bytes are the unpacked tensor's alone (the cross-entropy's
// backward then writes its gradient into the logits' buffer; with the job still queued a loaded
// machine's sim peak held a second logits-sized buffer, 241 MiB against 167 without load).
void ActivationOffloader::Impl::drop_queued(const StorageCopy& c) {
  std::erase_if(jobs, [&](const Job& j) { return j.copy.get() == &c; });
}

void ActivationOffloader::Impl::run_worker() {
  std::unique_lock<std::mutex> lock(mutex);
  for (;;) {
    work_cv.wait(lock, [this] { return stop || !jobs.empty(); });
    if (jobs.empty()) return;  // stop requested and nothing left
    Job job = std::move(jobs.front());
    jobs.pop_front();
    StorageCopy& c = *job.copy;
    ++jobs_running;
    if (job.kind == JobKind::ToHost && c.state == CopyState::ToHost && !c.job_started) {
      c.job_started = true;
      copy_to_host(c, lock);
    } else if (job.kind == JobKind::ToDevice && c.state == CopyState::ToDevice && !c.job_started) {
      c.job_started = true;
      try {
        c.device_storage = copy_to_device(c, lock);
        c.state = CopyState::OnDevice;
      } catch (...) {
        // A prefetch that does not fit is not an error: the unpack fetches it when it is needed
        // (and reports the out-of-memory then, if it still does not fit).
        c.state = CopyState::OnHost;
        *prefetched_bytes -= c.nbytes;
      }
      c.job_started = false;
    }
    --jobs_running;
    lock.unlock();
    job.copy.reset();  // may destroy the copy (and free bytes) outside the lock
    lock.lock();
    state_cv.notify_all();
  }
}

std::shared_ptr<void> ActivationOffloader::Impl::pack(const Tensor& t) {
  auto p = std::make_shared<Packed>();
  std::unique_lock<std::mutex> lock(mutex);
  ++stats.packed;
  const bool parameter = is_leaf(t) && requires_grad(t);
  if (parameter || t.device() == options.host || t.device().is_cpu() ||
      t.nbytes() < options.min_bytes || t.storage()->nbytes() == 0) {
    ++stats.kept;
    p->kept = t.detach();
    return p;
  }
  p->offset = t.offset();
  p->shape = t.shape();
  p->strides = t.strides();
  p->dtype = t.dtype();
  const std::shared_ptr<Storage>& storage = t.storage();
  auto it = by_storage.find(storage.get());
  if (it != by_storage.end()) {
    auto existing = it->second.lock();
    if (existing && existing->origin.lock() == storage) {
      ++stats.shared;
      p->copy = std::move(existing);
      return p;
    }
  }
  // Prune the oldest expired entries (a finished step's) so the maps stay small.
  while (!order.empty() && order.begin()->second.expired()) order.erase(order.begin());
  if (by_storage.size() > 2 * order.size() + 64) {
    for (auto i = by_storage.begin(); i != by_storage.end();)
      i = i->second.expired() ? by_storage.erase(i) : std::next(i);
  }
  auto c = std::make_shared<StorageCopy>();
  c->device = t.device();
  c->nbytes = storage->nbytes();
  c->sequence = next_sequence++;
  c->device_storage = storage;
  c->origin = storage;
  c->prefetched_bytes = prefetched_bytes;
  order[c->sequence] = c;
  by_storage[storage.get()] = c;
  ++stats.offloaded;
  p->copy = c;
  pending_to_host_bytes += c->nbytes;
  if (c->device.is_cuda() && !start_to_host_cuda(*c, lock)) {
    pending_to_host_bytes -= c->nbytes;
    if (!options.background) std::rethrow_exception(c->error);
    return p;  // the unpack rethrows, as for a copy that fails on the worker
  }
  if (options.background) {
    jobs.push_back({JobKind::ToHost, c});
    work_cv.notify_one();
    if (pending_to_host_bytes > options.max_pending_bytes) {
      const auto t0 = std::chrono::steady_clock::now();
      state_cv.wait(lock, [&] {
        // Go on once under the budget, or when this tensor alone is over it (it is then the only
        // one in flight: the budget bounds what forward holds *besides* the tensor it just saved).
        return pending_to_host_bytes <= options.max_pending_bytes ||
               c->state != CopyState::ToHost || pending_to_host_bytes == c->nbytes;
      });
      stats.pack_wait_ms += ms_since(t0);
    }
  } else {
    c->job_started = true;
    copy_to_host(*c, lock);
    if (c->state == CopyState::Failed) std::rethrow_exception(c->error);
  }
  return p;
}

void ActivationOffloader::Impl::schedule_prefetch_before(int64_t sequence) {
  if (!options.background || options.prefetch_bytes <= 0) return;
  bool queued = false;
  auto it = order.lower_bound(sequence);
  int64_t visited = 0;
  while (it != order.begin() && visited < 256) {
    --it;
    ++visited;
    auto c = it->second.lock();
    if (!c) {
      it = order.erase(it);
      continue;
    }
    if (c->state != CopyState::OnHost) continue;  // on the device already, or in flight
    const int64_t held = *prefetched_bytes;
    if (held > 0 && held + c->nbytes > options.prefetch_bytes) break;
    c->state = CopyState::ToDevice;
    c->job_started = false;
    *prefetched_bytes += c->nbytes;
    jobs.push_back({JobKind::ToDevice, std::move(c)});
    queued = true;
  }
  if (queued) work_cv.notify_one();
}

Tensor ActivationOffloader::Impl::unpack(const Packed& p) {
  if (!p.copy) return p.kept;
  StorageCopy& c = *p.copy;
  std::shared_ptr<Storage> storage;
  std::unique_lock<std::mutex> lock(mutex);
  bool waited = false;
  bool from_host = false;  // storage was filled by a host->device copy
  const auto t0 = std::chrono::steady_clock::now();
  while (!storage) {
    switch (c.state) {
      case CopyState::ToHost:
        // The copy in flight only reads the device bytes, which c still holds: use them now
        // rather than wait for the copy and copy back (on sim that was the logits' size each way,
        // every step, on backward's path). A worker already copying finishes it (OnHost);
        // otherwise the copy is abandoned and c stays Resident.
        storage = c.device_storage;
        if (!c.job_started) {
          c.state = CopyState::Resident;
          pending_to_host_bytes -= c.nbytes;
          drop_queued(c);
        }
        ++stats.cancelled;
        break;
      case CopyState::ToDevice:
        if (!c.job_started) {  // queued but not started: do it here rather than wait
          c.job_started = true;
          try {
            storage = copy_to_device(c, lock);
          } catch (...) {
            c.job_started = false;
            c.state = CopyState::OnHost;
            *prefetched_bytes -= c.nbytes;
            throw;
          }
          c.job_started = false;
          c.state = CopyState::OnHost;
          *prefetched_bytes -= c.nbytes;
          ++stats.sync_fetches;
          from_host = true;
        } else {
          if (!waited) ++stats.prefetch_waits;
          waited = true;
          state_cv.wait(lock);
        }
        break;
      case CopyState::OnDevice:
        storage = std::move(c.device_storage);  // the caller owns it; the host copy stays
        c.state = CopyState::OnHost;
        *prefetched_bytes -= c.nbytes;
        if (!waited) ++stats.prefetch_hits;
        from_host = true;
        break;
      case CopyState::OnHost:
        storage = copy_to_device(c, lock);
        ++stats.sync_fetches;
        from_host = true;
        break;
      case CopyState::Resident: storage = c.device_storage; break;
      case CopyState::Failed: std::rethrow_exception(c.error);
    }
  }
  if (waited) stats.unpack_wait_ms += ms_since(t0);
  // CUDA: kernels that read the tensor are enqueued after this wait, so they run after its
  // host->device copy; the host does not block. (Under the lock: no prefetch of c re-records the
  // event meanwhile.)
  if (from_host && c.device.is_cuda()) lane_for(c.device.index).compute.wait(*c.to_device_done);
  schedule_prefetch_before(c.sequence);
  lock.unlock();
  return Tensor::from_storage(std::move(storage), p.offset, p.shape, p.strides, p.dtype);
}

ActivationOffloader::ActivationOffloader(ActivationOffloadOptions options)
    : impl_(std::make_shared<Impl>(options)) {
  MW_CHECK_T(InvalidArgument, options.host.is_cpu(),
             "ActivationOffloader: the host device must be "
             "cpu, got ",
             options.host.str());
}

ActivationOffloader::~ActivationOffloader() = default;

PackHook ActivationOffloader::pack_hook() const {
  std::shared_ptr<Impl> impl = impl_;
  return [impl](const Tensor& t) { return impl->pack(t); };
}

UnpackHook ActivationOffloader::unpack_hook() const {
  std::shared_ptr<Impl> impl = impl_;
  return [impl](const std::shared_ptr<void>& packed) {
    return impl->unpack(*static_cast<const Packed*>(packed.get()));
  };
}

std::shared_ptr<void> ActivationOffloader::pack(const Tensor& t) const { return impl_->pack(t); }

Tensor ActivationOffloader::unpack(const std::shared_ptr<void>& packed) const {
  return impl_->unpack(*static_cast<const Packed*>(packed.get()));
}

void ActivationOffloader::wait_idle() const {
  std::vector<CudaLane*> lanes;
  {
    std::unique_lock<std::mutex> lock(impl_->mutex);
    impl_->state_cv.wait(lock, [this] { return impl_->jobs.empty() && impl_->jobs_running == 0; });
    for (auto& [index, lane] : impl_->cuda_lanes)
      if (lane) lanes.push_back(lane.get());
  }
  for (CudaLane* lane : lanes) lane->copy.synchronize();  // prefetches enqueued, now finished
}

ActivationOffloadStats ActivationOffloader::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->stats;
}

const ActivationOffloadOptions& ActivationOffloader::options() const { return impl_->options; }

}  // namespace mw::offload
