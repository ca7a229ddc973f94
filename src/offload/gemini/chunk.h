// Chunk: one contiguous f32 Storage holding several parameters back to back; each parameter is a
// view at an offset into it (Note [Parameters in chunks]).
//
// Note [Parameters in chunks]: a parameter's TensorImpl is re-pointed at its chunk's Storage (with
// its offset), so the layer that owns the parameter, the saved tensors of the graph and the
// optimizer all see the chunk's bytes wherever they are: released, moved, or re-materialised,
// every view follows (Note [Storage lifecycle], core/storage.h).
//
// Note [Chunk homes]: a chunk's *home* is where its authoritative bytes live between uses and
// where the optimizer updates it: the device (a chunk kept on the device for good) or the host (an
// offloaded chunk). An offloaded chunk in use is *gathered*: its storage holds a device copy and
// its host bytes are parked beside it (Note [Parked bytes], core/storage.h). Parameters do not
// change during forward and backward, so the copy is dropped without a write-back when the chunk is
// evicted: host -> device traffic is one copy per gather, device -> host only gradients.
//
// Note [NVMe-homed chunks]: with a host budget (three tiers), an offloaded chunk may live on disk
// between uses: its storage is released and its bytes are a blob in Gemini's swap space. A gather
// reads the blob straight into the device copy (sim memory is host memory, 4096-aligned, so
// O_DIRECT reads into it; on CUDA through a pinned bounce buffer, tiers.cpp). For its update
// the chunk comes home to RAM (from the device copy when it is still gathered, else from disk),
// is stepped, written back, and its RAM freed again.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace mw::gemini {

struct ChunkMember {
  size_t tensor = 0;   // index into Gemini's tensor list
  int64_t offset = 0;  // in elements
  int64_t numel = 0;
};

class Chunk {
 public:
  Chunk(int index, std::vector<ChunkMember> members, int64_t numel);
  ~Chunk();
  Chunk(const Chunk&) = delete;
  Chunk& operator=(const Chunk&) = delete;
  int index() const { return index_; }
  int64_t numel() const { return numel_; }
  int64_t nbytes() const { return numel_ * 4; }
  // Note [16-bit copies] (low_copies.cpp): the members at elements [0, f32_part) stay f32 in every
  // copy, those after it may be copied in 16 bits: the dtype of that part while gathered (F32
  // otherwise), and the bytes of a copy with `dtype` there.
  void set_f32_part(int64_t numel) { f32_part_ = numel; }
  int64_t f32_part() const { return f32_part_; }
  DType copy_dtype() const { return copy_dtype_; }
  // The byte at which `element` starts in a copy with `dtype` after f32_part().
  int64_t copy_byte(int64_t element, DType dtype) const {
    return element <= f32_part_ ? element * 4
                                : f32_part_ * 4 + (element - f32_part_) * dtype_size(dtype);
  }
  int64_t copy_nbytes(DType dtype) const { return copy_byte(numel_, dtype); }
  int64_t copy_nbytes() const { return copy_nbytes(copy_dtype_); }
  // The members' tensors, whose dtype follows the copy's (attach() sets them).
  void set_views(std::vector<Tensor> views) { views_ = std::move(views); }
  const std::vector<ChunkMember>& members() const { return members_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  // [numel] f32 over the whole chunk: the parameter the optimizer steps.
  const Tensor& flat() const { return flat_; }

  bool host_home() const { return host_home_; }
  bool on_nvme() const { return on_nvme_; }
  bool gathered() const { return gathered_; }
  // Where the parameters' bytes are now (the device when gathered or device-homed).
  Device where() const { return storage_->device(); }
  bool on_device() const { return !where().is_cpu(); }

  // Moves the home bytes to `home` (before training; device homes stay there for good).
  void set_home(Device home);
  // Offloaded chunk: copies the host bytes to a new device copy and parks the host bytes.
  // Throws OutOfMemory (the chunk is unchanged) when the device has no room. A BF16 or F16
  // `dtype` rounds the members after f32_part() to it in the copy, and makes their views that
  // dtype until release_copy (Note [16-bit copies]).
  void gather(Device device, DType dtype = DType::F32);
  // The same without the copy: allocates the device copy and parks the host bytes; the caller
  // fills the copy (fill_copy: `host` itself for an f32 copy) before anything reads the
  // parameters (Note [Copy worker]).
  struct GatherBytes {
    void* device = nullptr;
    const void* host = nullptr;
  };
  GatherBytes gather_deferred(Device device, DType dtype = DType::F32);
  // The copy_nbytes() bytes of the copy, from the parked home, into host memory at `to` (the
  // device copy on sim, a staging buffer for a GPU). Only reads the home: any thread. `parallel`:
  // split over the thread pool (the compute thread's gathers; a worker thread's copy runs beside
  // the compute and stays on its own thread).
  void fill_copy(void* to, bool parallel = false) const;
  // Bytes [begin, end) of the copy to `to` (multiples of 4, or end = copy_nbytes()).
  void fill_copy(void* to, int64_t begin, int64_t end, bool parallel) const;
  // Note [Staged copies] (chunk.cpp): the copy to `dst` on a CUDA device, through pinned slices.
  void copy_staged(void* dst, Device device) const;
  // Offloaded chunk: drops the device copy and takes the parked host bytes back.
  void release_copy();
  // Note [NVMe-homed chunks]. set_on_nvme: the bytes were written to disk; frees them in RAM.
  void set_on_nvme();
  // Allocates the device copy (uninitialised) for a read from disk, or for a sharded chunk's
  // all_gather, and returns its bytes. A sharded chunk may take a BF16 or F16 `dtype`, with
  // `nbytes` for the all_gather (Note [16-bit gathers], low_copies.cpp).
  void* gather_uninitialized(Device device, DType dtype = DType::F32, int64_t nbytes = 0);
  // Gives the chunk RAM bytes for its update: copied from the device copy (then dropped) if
  // gathered, returning true; else uninitialised (the caller reads them from disk), false.
  bool bring_home_to_ram();
  // Note [Sharded parameters] (shard.cpp): the chunk's parameters are spread over the ranks.
  // set_sharded frees the whole chunk and keeps `shard`, this rank's piece (zero past the chunk's
  // end), at the chunk's home; the storage, sized for the all_gather (`gathered_numel`, ranks x
  // stride elements), holds the whole chunk only while gathered (gather_uninitialized, then
  // release_copy), as an NVMe-homed chunk's does.
  void set_sharded(Tensor shard, int64_t gathered_numel);
  bool sharded() const { return shard_.defined(); }
  const Tensor& shard() const { return shard_; }
  // Note [Pieces on disk] (shard.cpp): a sharded chunk's piece homed on disk between uses, a blob
  // in Gemini's swap space, in RAM only while an all_gather reads it or HybridAdam steps it.
  // set_shard_on_nvme: the piece was written; frees its RAM. bring_shard_to_ram gives it RAM
  // (uninitialised: the caller reads the blob), drop_shard_ram frees it again, keep_shard_in_ram
  // makes it RAM-homed for good (its write-back failed: Note [Abandoning a step]).
  void set_shard_on_nvme();
  bool shard_on_nvme() const { return shard_on_nvme_; }
  bool shard_in_ram() const { return sharded() && !shard_.storage()->is_released(); }
  void bring_shard_to_ram() { shard_.storage()->materialize(); }
  void drop_shard_ram() { shard_.storage()->release(); }
  void keep_shard_in_ram();
  // Frees the RAM bytes of an NVMe-homed chunk after its write-back.
  void drop_ram() { storage_->release(); }
  // An NVMe-homed chunk whose RAM bytes are newer than its blob (the write-back failed) becomes
  // RAM-homed, so that nothing reads the stale blob over them (Note [Abandoning a step]).
  void keep_in_ram();

  Tensor grad;          // [numel] gradient buffer during backward (undefined otherwise)
  int grads_ready = 0;  // members whose gradient arrived in `grad` in this backward
  // Note [Deferred updates] (deferred.cpp): whether the norm's partials were taken, and whether
  // the buffer waits on disk.
  bool norm_taken = false;
  bool grad_on_disk = false;
  bool piece_kept = false;  // Note [Pieces on disk]: read for backward, kept for the update

 private:
  int index_;
  std::vector<ChunkMember> members_;
  int64_t numel_;
  std::shared_ptr<Storage> storage_;
  Tensor flat_;
  bool host_home_ = true;
  bool on_nvme_ = false;
  bool gathered_ = false;
  DType copy_dtype_ = DType::F32;
  int64_t f32_part_ = 0;
  std::vector<Tensor> views_;
  void retype(DType dtype);
  void* parked_ = nullptr;           // host bytes while gathered (RAM-homed chunks)
  Tensor shard_;                     // Note [Sharded parameters]
  int64_t shard_gather_nbytes_ = 0;  // an f32 all_gather's: ranks x stride x 4
  bool shard_on_nvme_ = false;
};

}  // namespace mw::gemini
