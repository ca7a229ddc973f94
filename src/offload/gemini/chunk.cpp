// Note [Chunk homes] (chunk.h).
#include "offload/gemini/chunk.h"

#include <cstring>

#include "core/allocator.h"
#include "core/convert.h"
#include "core/cuda_stream.h"
#include "core/parallel.h"

namespace mw::gemini {

Chunk::Chunk(int index, std::vector<ChunkMember> members, int64_t numel)
    : index_(index), members_(std::move(members)), numel_(numel) {
  storage_ = Storage::create(0, Device::cpu());  // no bytes until it is filled
  storage_->resize_uninitialized(numel_ * 4);    // released: make_parameter materialises it
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

// Note [16-bit copies]: a member after f32_part() at element o of the home is at byte
// 4 f32_part + 2 (o - f32_part) of a 16-bit copy, i.e. at 16-bit element o + f32_part.
void Chunk::retype(DType dtype) {
  copy_dtype_ = dtype;
  for (size_t k = 0; k < views_.size(); ++k) {
    const ChunkMember& m = members_[k];
    if (m.offset < f32_part_) continue;
    views_[k].impl()->dtype = dtype;
    views_[k].impl()->offset = dtype == DType::F32 ? m.offset : m.offset + f32_part_;
  }
}

void Chunk::gather(Device device, DType dtype) {
  const GatherBytes b = gather_deferred(device, dtype);
  try {
    if (device.is_host_addressable())
      fill_copy(b.device, true);
    else
      copy_staged(b.device, device);
  } catch (...) {
    release_copy();
    throw;
  }
}

Chunk::GatherBytes Chunk::gather_deferred(Device device, DType dtype) {
  MW_CHECK(host_home_ && !gathered() && !on_nvme_ && !sharded(), "chunk ", index_,
           ": gather of a chunk that is ",
           host_home_ ? "gathered, on disk or sharded" : "homed on the device");
  MW_CHECK(dtype == DType::F32 || (is_low_precision(dtype) && views_.size() == members_.size()),
           "chunk ", index_, ": a ", dtype_name(dtype), " copy needs the members' views");
  const int64_t n = copy_nbytes(dtype);
  void* copy = allocator_for(device).allocate(n);  // throws OutOfMemory: nothing changed
  void* host = storage_->take_bytes();
  if (n != nbytes()) storage_->resize_uninitialized(n);
  storage_->adopt_bytes(copy, device);
  parked_ = host;
  gathered_ = true;
  if (dtype != DType::F32) retype(dtype);
  return {copy, host};
}

void Chunk::fill_copy(void* to, bool parallel) const { fill_copy(to, 0, copy_nbytes(), parallel); }

// The copy is the home's first `head` bytes as they are, then (a 16-bit copy) the rest rounded:
// byte o >= head of the copy is element (o - head) / 2 of that rest.
void Chunk::fill_copy(void* to, int64_t begin, int64_t end, bool parallel) const {
  MW_CHECK(gathered_ && parked_, "chunk ", index_, ": fill_copy needs a gathered RAM-homed chunk");
  const auto* from = static_cast<const char*>(parked_);
  auto* out = static_cast<char*>(to);
  const int64_t head = copy_dtype_ == DType::F32 ? nbytes() : f32_part_ * 4;
  const int64_t size = dtype_size(copy_dtype_);
  // The pool's pieces read about 1 MiB each (well past a task's overhead); else one piece, here.
  auto loop = [parallel](int64_t n, int64_t piece, const auto& f) {
    parallel_for(n, parallel ? piece : n + 1, f);
  };
  const int64_t copied = std::max<int64_t>(0, std::min(end, head) - begin);
  loop(copied, 1 << 20, [&](int64_t b, int64_t e) {
    std::memcpy(out + b, from + begin + b, static_cast<size_t>(e - b));
  });
  if (end <= head) return;
  const int64_t first = (std::max(begin, head) - head) / size;  // of the rounded elements
  char* rounded = out + copied;
  loop((end - head) / size - first, 1 << 18, [&](int64_t b, int64_t e) {
    convert_floats(DType::F32, from + head + 4 * (first + b), copy_dtype_, rounded + size * b,
                   e - b);
  });
}

// Note [Staged copies]: a copy from pageable memory goes through the driver's own staging, filled
// by one thread; on the H200 of session 34 a GPT-2 medium step under a 768 MiB cap spent most of
// its forward there (227 ms of 674). So the copy is filled into pinned slices by the thread pool
// and each slice is copied asynchronously on the compute stream while the next one is filled: two
// slices of 16 MiB, cached by the pinned allocator, instead of a pinned buffer per chunk (which the
// host budget of three tiers would have to hold). Ordered behind the compute stream's kernels as
// a blocking copy is, since the device block may be one they just freed.
void Chunk::copy_staged(void* dst, Device device) const {
  constexpr int64_t kSlice = 16 << 20;
  const int64_t n = copy_nbytes();
  const CudaStream compute = CudaStream::borrow(device.index, nullptr);
  PinnedHostBuffer slices[2] = {PinnedHostBuffer(std::min(n, kSlice)),
                                PinnedHostBuffer(std::min(n, kSlice))};
  CudaEvent copied[2] = {CudaEvent(device.index), CudaEvent(device.index)};
  try {
    for (int64_t begin = 0, k = 0; begin < n; begin += kSlice, k ^= 1) {
      const int64_t end = std::min(n, begin + kSlice);
      copied[k].synchronize();  // the copy two slices back has read this slice
      fill_copy(slices[k].data(), begin, end, true);
      compute.copy_async(static_cast<char*>(dst) + begin, slices[k].data(), end - begin);
      copied[k].record(compute);
    }
  } catch (...) {
    for (const CudaEvent& e : copied) e.synchronize();
    throw;
  }
  for (const CudaEvent& e : copied) e.synchronize();
}

void Chunk::release_copy() {
  MW_CHECK(gathered(), "chunk ", index_, ": release_copy of a chunk that is not gathered");
  storage_->release();
  if (copy_dtype_ != DType::F32) {  // Note [16-bit copies]: the home's f32 bytes again
    storage_->resize_uninitialized(sharded() ? shard_gather_nbytes_ : nbytes());
    retype(DType::F32);
  }
  if (on_nvme_ || sharded())
    storage_->move_to(Device::cpu());  // released: only the home changes
  else
    storage_->adopt_bytes(parked_, Device::cpu());
  parked_ = nullptr;
  gathered_ = false;
}

void Chunk::set_on_nvme() {
  MW_CHECK(host_home_ && !gathered_, "chunk ", index_,
           ": set_on_nvme of a gathered or device chunk");
  storage_->release();
  on_nvme_ = true;
}

void Chunk::set_sharded(Tensor shard, int64_t gathered_numel) {
  MW_CHECK(!gathered_ && !on_nvme_ && !sharded() && host_home_ && gathered_numel >= numel_,
           "chunk ", index_, ": set_sharded of a gathered, disk-homed or sharded chunk");
  storage_->release();
  shard_gather_nbytes_ = gathered_numel * 4;
  storage_->resize_uninitialized(shard_gather_nbytes_);
  shard_ = std::move(shard);
  host_home_ = shard_.device().is_cpu();
}

void Chunk::keep_in_ram() {
  MW_CHECK(on_nvme_ && !gathered_ && !storage_->is_released() && storage_->device().is_cpu(),
           "chunk ", index_, ": keep_in_ram needs an NVMe-homed chunk with its bytes in RAM");
  on_nvme_ = false;
}

void Chunk::set_shard_on_nvme() {
  MW_CHECK(sharded() && host_home_ && !shard_on_nvme_, "chunk ", index_,
           ": set_shard_on_nvme needs a sharded chunk whose piece is in RAM");
  shard_.storage()->release();
  shard_on_nvme_ = true;
}

void Chunk::keep_shard_in_ram() {
  MW_CHECK(shard_on_nvme_ && shard_in_ram(), "chunk ", index_,
           ": keep_shard_in_ram needs a piece homed on disk with its bytes in RAM");
  shard_on_nvme_ = false;
}

void* Chunk::gather_uninitialized(Device device, DType dtype, int64_t nbytes) {
  MW_CHECK((on_nvme_ || sharded()) && !gathered_ && storage_->is_released(), "chunk ", index_,
           ": gather_uninitialized needs a chunk on disk or sharded");
  const bool low = dtype != DType::F32;
  MW_CHECK(!low || (sharded() && views_.size() == members_.size() && nbytes >= copy_nbytes(dtype) &&
                    nbytes <= shard_gather_nbytes_),
           "chunk ", index_, ": a ", dtype_name(dtype), " gather of ", nbytes,
           " bytes needs a sharded chunk with its members' views and room for ", copy_nbytes(dtype),
           " bytes");
  if (low) storage_->resize_uninitialized(nbytes);
  storage_->move_to(device);
  try {
    storage_->materialize();
  } catch (...) {  // OutOfMemory: back home, still released
    storage_->move_to(Device::cpu());
    if (low) storage_->resize_uninitialized(shard_gather_nbytes_);
    throw;
  }
  gathered_ = true;
  if (low) retype(dtype);
  return storage_->data();
}

bool Chunk::bring_home_to_ram() {
  MW_CHECK(on_nvme_, "chunk ", index_, ": bring_home_to_ram of a chunk not on disk");
  if (!gathered_) {
    storage_->move_to(Device::cpu());
    storage_->materialize();
    return false;
  }
  void* host = allocator_for(Device::cpu()).allocate(nbytes());
  copy_bytes(host, Device::cpu(), storage_->data(), storage_->device(), nbytes());
  storage_->release();
  storage_->adopt_bytes(host, Device::cpu());
  gathered_ = false;
  return true;
}

}  // namespace mw::gemini
