// Activation offload: saved-tensor hooks that move saved activations from the device (sim, cuda)
// to host memory during forward, and prefetch them back in reverse order during backward.
//
// Note [Activation offload]: pack(t) starts a device->host copy of t's *storage* on a background
// worker thread and returns a handle at once, so forward continues while the copy runs. When the
// copy is done the worker drops the handle's reference to the device storage; the device bytes are
// freed as soon as forward's own references are gone. unpack(handle) in backward returns the
// tensor on its device: from a prefetched copy when one is ready (a hit), else by copying on the
// calling thread. Each unpack then queues host->device prefetches of the tensors packed *before*
// it (backward runs in reverse order), up to prefetch_bytes of device memory held ahead.
//
// Invariants:
//  - Values are bit-exact: copies are memcpy of whole storages, and a handle rebuilds the same
//    view (offset, shape, strides, dtype).
//  - Parameters (leaves requiring grad), tensors already on the host device, and tensors under
//    min_bytes are kept as they are, never copied.
//  - Two saved views of one storage share one host copy.
//  - A handle unpacked before its copy finished gets the device tensor, whose bytes are intact
//    (the copy only reads them). A copy not started yet is cancelled and goes with its queued job,
//    so once the handle is dropped the unpacked tensor alone owns those bytes; a copy under way
//    finishes and is not used.
//  - The device memory the offloader itself holds is bounded: max_pending_bytes in forward (pack
//    waits for the worker beyond it), prefetch_bytes in backward (plus the tensor being
//    unpacked). A prefetch that does not fit on the device is dropped, not an error.
//  - Errors on the worker (e.g. OutOfMemory on the host) are rethrown by the unpack that needs the
//    copy.
//
// Note [Offload with checkpointing]: saved-tensor hooks nest and only the innermost applies, so
// wrapping offload around checkpointed code offloads nothing from inside the checkpoints (their
// pack stores only an index; PyTorch's save_on_cpu has this problem, pytorch#84907). What must be
// offloaded then is each checkpoint's *inputs*: pass pack()/unpack() as the checkpoint's input
// hooks (nn::CheckpointOptions, nn::CheckpointWrapper::set_input_hooks).
//
// Note [CUDA activation offload]: on a cuda device the copies run on a copy stream of the
// offloader's own and are ordered by events (Note [Copy stream and events], core/cuda_stream.h):
//  - pack records an event on the compute stream, makes the copy stream wait on it, enqueues the
//    device->host copy into a pinned host buffer and records to_host_done; it does not block. The
//    worker waits for to_host_done and only then drops the handle's reference to the device
//    storage, so the caching allocator cannot hand the bytes to a kernel while the copy reads them.
//  - a host->device copy (a prefetch on the worker, or a fetch in unpack) allocates the device
//    storage, makes the copy stream wait on an event recorded on the compute stream (the recycled
//    block's last kernel), enqueues the copy and records to_device_done; unpack makes the compute
//    stream wait on it (cudaStreamWaitEvent) and returns at once: the host never blocks on a copy
//    that was issued in time.
//  - a StorageCopy destroyed with a copy in flight waits for it before its pinned buffer and
//    device storage go back to their caches.
// The states, budgets and prefetch order are the sim path's, unchanged. Compiled against CUDA 13;
// see docs/recompute.md for what has and has not run on a GPU.
#pragma once

#include <cstdint>
#include <memory>

#include "autograd/saved_tensor.h"
#include "core/device.h"

namespace mw::offload {

struct ActivationOffloadOptions {
  Device host = Device::cpu();
  // Device bytes that backward may hold in prefetched activations ahead of their use.
  int64_t prefetch_bytes = int64_t{128} << 20;
  // Device bytes that forward may hold in copies not yet finished; pack waits beyond it. This is
  // what bounds device memory when the copies are slower than forward.
  int64_t max_pending_bytes = int64_t{256} << 20;
  // Saved tensors smaller than this stay on the device.
  int64_t min_bytes = 0;
  // false: copies run on the calling thread in pack and unpack (the synchronous reference).
  bool background = true;
  // CUDA: the stream on which the kernels that produce and consume saved tensors run (a
  // cudaStream_t passed as void*); nullptr = the legacy default stream, which memwall's kernels
  // use. The copies order themselves against it with events (Note [CUDA activation offload]).
  void* cuda_compute_stream = nullptr;
};

struct ActivationOffloadStats {
  int64_t packed = 0;          // pack() calls
  int64_t kept = 0;            // parameters, host tensors, small tensors: not copied
  int64_t offloaded = 0;       // device storages copied to the host
  int64_t shared = 0;          // packs that reused another view's host copy
  int64_t cancelled = 0;       // unpacked before their copy was done: served from the device
                               // bytes
  int64_t prefetch_hits = 0;   // unpacks served by a finished prefetch (cuda: an enqueued one,
                               // which the compute stream waits for on the GPU)
  int64_t prefetch_waits = 0;  // unpacks that waited for a prefetch in flight
  int64_t sync_fetches = 0;    // unpacks that copied on the calling thread
  int64_t to_host_bytes = 0;
  int64_t to_device_bytes = 0;
  double unpack_wait_ms = 0;  // time unpack spent waiting for the worker
  double pack_wait_ms = 0;    // time pack spent waiting for max_pending_bytes
};

class ActivationOffloader {
 public:
  explicit ActivationOffloader(ActivationOffloadOptions options = {});
  ~ActivationOffloader();
  ActivationOffloader(const ActivationOffloader&) = delete;
  ActivationOffloader& operator=(const ActivationOffloader&) = delete;

  // The hooks. They keep the offloader's state (and worker) alive as long as a graph holds them.
  PackHook pack_hook() const;
  UnpackHook unpack_hook() const;
  std::shared_ptr<void> pack(const Tensor& t) const;
  Tensor unpack(const std::shared_ptr<void>& packed) const;

  // Blocks until every queued copy has finished (tests, statistics).
  void wait_idle() const;
  ActivationOffloadStats stats() const;
  const ActivationOffloadOptions& options() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// Installs an offloader's hooks for a scope, typically the forward pass.
class OffloadScope {
 public:
  explicit OffloadScope(const ActivationOffloader& offloader)
      : guard_(offloader.pack_hook(), offloader.unpack_hook()) {}

 private:
  SavedTensorHooksGuard guard_;
};

}  // namespace mw::offload
