// PinnedHostBuffer: an owning block from pinned_host_allocator() (core/cuda_stream.h). Built in
// every configuration; without CUDA the allocator itself throws DeviceError.
#include <utility>

#include "core/cuda_stream.h"

namespace mw {

PinnedHostBuffer::PinnedHostBuffer(int64_t nbytes) : nbytes_(nbytes) {
  data_ = pinned_host_allocator().allocate(nbytes);
}

PinnedHostBuffer::~PinnedHostBuffer() {
  if (data_) pinned_host_allocator().deallocate(data_, nbytes_);
}

PinnedHostBuffer::PinnedHostBuffer(PinnedHostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), nbytes_(std::exchange(other.nbytes_, 0)) {}

PinnedHostBuffer& PinnedHostBuffer::operator=(PinnedHostBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) pinned_host_allocator().deallocate(data_, nbytes_);
    data_ = std::exchange(other.data_, nullptr);
    nbytes_ = std::exchange(other.nbytes_, 0);
  }
  return *this;
}

}  // namespace mw
