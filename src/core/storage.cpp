// Storage allocation, release, re-materialisation and moves between devices.
#include "core/storage.h"

#include <cstring>

#include "core/allocator.h"
#include "core/error.h"
#include "core/parallel.h"

namespace mw {

void cuda_copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                     int64_t nbytes);

Storage::Storage(int64_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  MW_CHECK_T(InvalidArgument, nbytes >= 0, "Storage: negative size ", nbytes);
  if (nbytes > 0) data_ = allocator_for(device).allocate(nbytes);
}

Storage::~Storage() {
  if (data_) allocator_for(device_).deallocate(data_, nbytes_);
}

void* Storage::data() {
  MW_CHECK(data_ || nbytes_ == 0, "storage of ", nbytes_, " bytes on ", device_.str(),
           " was released and not re-materialised before use (Note [Storage lifecycle])");
  return data_;
}
const void* Storage::data() const { return const_cast<Storage*>(this)->data(); }

void Storage::release() {
  if (data_) allocator_for(device_).deallocate(data_, nbytes_);
  data_ = nullptr;
}

void Storage::materialize() {
  if (!data_ && nbytes_ > 0) data_ = allocator_for(device_).allocate(nbytes_);
}

void Storage::move_to(Device device) {
  if (device == device_) return;
  if (!data_) {  // released: only the home changes
    device_ = device;
    return;
  }
  void* fresh = allocator_for(device).allocate(nbytes_);
  try {
    copy_bytes(fresh, device, data_, device_, nbytes_);
  } catch (...) {
    allocator_for(device).deallocate(fresh, nbytes_);
    throw;
  }
  allocator_for(device_).deallocate(data_, nbytes_);
  data_ = fresh;
  device_ = device;
}

void* Storage::take_bytes() {
  void* bytes = data_;
  data_ = nullptr;
  return bytes;
}

void Storage::adopt_bytes(void* data, Device device) {
  MW_CHECK(data_ == nullptr, "adopt_bytes on a storage that holds bytes (Note [Parked bytes])");
  data_ = data;
  device_ = device;
}

void Storage::resize_uninitialized(int64_t nbytes) {
  MW_CHECK(data_ == nullptr || nbytes_ == 0, "resize_uninitialized on a live storage");
  nbytes_ = nbytes;
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, int64_t nbytes) {
  if (nbytes == 0) return;
  if (dst_device.is_host_addressable() && src_device.is_host_addressable()) {
    // Large copies (Gemini's chunk gathers, gradients into chunks) are split over the threads: one
    // core's memcpy reaches about half of this machine's memory bandwidth.
    constexpr int64_t kGrainBytes = int64_t{4} << 20;
    parallel_for(nbytes, kGrainBytes, [&](int64_t b, int64_t e) {
      std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b,
                  static_cast<size_t>(e - b));
    });
    return;
  }
  cuda_copy_bytes(dst, dst_device, src, src_device, nbytes);
}

void move_bytes_down(void* dst, const void* src, int64_t nbytes, Device device, bool host_memmove) {
  MW_CHECK(dst <= src, "move_bytes_down: the destination is above the source");
  if (nbytes == 0 || dst == src) return;
  if (host_memmove && device.is_host_addressable()) {
    std::memmove(dst, src, static_cast<size_t>(nbytes));
    return;
  }
  if (static_cast<const char*>(src) - static_cast<const char*>(dst) >= nbytes) {
    copy_bytes(dst, device, src, device, nbytes);
    return;
  }
  Storage spare(nbytes, device);
  copy_bytes(spare.data(), device, src, device, nbytes);
  copy_bytes(dst, device, spare.data(), device, nbytes);
}

}  // namespace mw
