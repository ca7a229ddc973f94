// Note [Chunk homes] (chunk.h).
#include "offload/gemini/chunk.h"

#include "core/allocator.h"

namespace mw::gemini {

Chunk::Chunk(int index, std::vector<ChunkMember> members, int64_t numel)
    : index_(index), members_(std::move(members)), numel_(numel) {
  storage_ = Storage::create(numel_ * 4, Device::cpu());
  flat_ = Tensor::from_storage(storage_, 0, {numel_}, {1}, DType::F32);
}

Chunk::~Chunk() {
  if (parked_) allocator_for(Device::cpu()).deallocate(parked_, nbytes());
}

void Chunk::set_home(Device home) {
  MW_CHECK(!gathered(), "chunk ", index_, ": set_home while gathered");
  storage_->move_to(home);
  host_home_ = home.is_cpu();
}

void Chunk::gather(Device device) {
  MW_CHECK(host_home_ && !gathered(), "chunk ", index_, ": gather of a chunk that is ",
           host_home_ ? "already gathered" : "homed on the device");
  void* copy = allocator_for(device).allocate(nbytes());  // throws OutOfMemory: nothing changed
  void* host = storage_->take_bytes();
  try {
    copy_bytes(copy, device, host, Device::cpu(), nbytes());
  } catch (...) {
    storage_->adopt_bytes(host, Device::cpu());
    allocator_for(device).deallocate(copy, nbytes());
    throw;
  }
  storage_->adopt_bytes(copy, device);
  parked_ = host;
}

void Chunk::release_copy() {
  MW_CHECK(gathered(), "chunk ", index_, ": release_copy of a chunk that is not gathered");
  storage_->release();
  storage_->adopt_bytes(parked_, Device::cpu());
  parked_ = nullptr;
}

}  // namespace mw::gemini
