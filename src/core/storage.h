// Storage: a block of bytes on one device, shared by every tensor view onto it.
//
// Note [Storage lifecycle]: the *object* outlives its *bytes*. release() frees the bytes while
// every view survives (reading a released storage throws); materialize() re-allocates them;
// move_to() re-homes them on another device, and every view sees the new place. Gemini's chunks,
// NVMe offload and recomputation are built on these three operations.
//
// Note [Version counter]: every in-place write to a storage bumps version(). Autograd records the
// version of each saved tensor and checks it in backward, so an in-place change is reported instead
// of silently producing wrong gradients. The counter is an object of its own that a saved tensor
// keeps (PyTorch's VariableVersion): under recomputation or activation offload the saved storage
// is gone by backward, and a write made to it before it went must still be reported (a weak
// reference to the storage skipped the check there, and the gradients came out wrong).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "core/device.h"

namespace mw {

class Allocator;

class Storage {
 public:
  // Allocates nbytes on device (contents uninitialised).
  Storage(int64_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  static std::shared_ptr<Storage> create(int64_t nbytes, Device device) {
    return std::make_shared<Storage>(nbytes, device);
  }

  void* data();  // throws if released
  const void* data() const;
  void* data_or_null() { return data_; }
  int64_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool is_released() const { return data_ == nullptr && nbytes_ > 0; }

  void release();               // free the bytes; views survive
  void materialize();           // re-allocate released bytes (uninitialised) on device()
  void move_to(Device device);  // copy bytes to device, free the old ones
  void resize_uninitialized(int64_t nbytes);  // only for released or empty storages

  // Note [Parked bytes]: a chunk kept at home on the host while a copy of it is in use on the
  // device (offload/gemini) swaps its bytes instead of copying them twice. take_bytes() hands the
  // bytes to the caller, who then owns them (allocated by allocator_for(device())), and leaves the
  // storage released; adopt_bytes() gives a released storage nbytes() bytes that
  // allocator_for(device) allocated, and re-homes it there. Views never notice: they hold the
  // Storage, not its bytes.
  void* take_bytes();
  void adopt_bytes(void* data, Device device);

  uint64_t version() const { return version_->load(std::memory_order_relaxed); }
  void bump_version() { version_->fetch_add(1, std::memory_order_relaxed); }
  // The counter itself, which outlives the storage for whoever keeps it (Note [Version counter]).
  std::shared_ptr<const std::atomic<uint64_t>> version_counter() const { return version_; }

 private:
  void* data_ = nullptr;
  int64_t nbytes_ = 0;
  Device device_;
  std::shared_ptr<std::atomic<uint64_t>> version_ = std::make_shared<std::atomic<uint64_t>>(0);
};

// Copies nbytes between any two devices (host memcpy for cpu/sim, CUDA copies otherwise).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, int64_t nbytes);

// nbytes from src down to dst <= src in one device's memory, as memmove: the host's memmove where
// it can (cpu, sim; unless `host_memmove` is false, which tests the other way on the host);
// elsewhere a copy may not overlap (cudaMemcpy), so a run that overlaps its destination goes
// through a temporary of nbytes on the device, and one that does not is copied directly.
void move_bytes_down(void* dst, const void* src, int64_t nbytes, Device device,
                     bool host_memmove = true);

}  // namespace mw
