// ZeRO stage 3's parameter gathers in 16 bits under autocast (data_parallel.h, zero3.cpp).
//
// Note [16-bit parameter gathers]: under --precision bf16|fp16 every product casts its f32
// weight to the low dtype in forward and again in backward, and nothing else reads that weight
// (the LayerNorms, biases and embeddings are read in f32: Note [Autocast policy]). So a stage-3
// bucket's all_gather can carry those weights already rounded, in 2 bytes, as DeepSpeed's ZeRO-3
// gathers its fp16 parameters and Gemini its sharded chunks (Note [16-bit gathers],
// offload/gemini/low_copies.cpp, the same scheme): the cast of a 16-bit tensor to its own dtype
// is the tensor, the rounding is the one autocast does (to nearest even), and the weight's
// gradient, which autocast rounds to the low dtype and widens for the f32 master, is widened in
// the grad-ready hook instead (on_grad_ready; micro-batches accumulate into it in f32, as the
// plain run's do). The run is bit for bit the one with f32 gathers. The masters (this rank's
// pieces, which the optimizer steps), the gradients' reduce_scatter and the Adam states stay f32.
//  - Layout. Each bucket puts its f32 members first and the 16-bit ones after them
//    (put_f32_members_first: which parameters share a bucket does not change), so that a gathered
//    bucket is its f32 part as it is and then the rest at 2 bytes an element: element e of the
//    bucket is at byte copy_byte(e) = 4e below f32_part, 4 f32_part + 2 (e - f32_part) from there.
//    While a bucket is gathered in 16 bits its low members' tensors take the low dtype (offsets
//    counted in it), and f32 again at release. The layout follows the precision, not the gathers'
//    dtype, so --chunk-copy-dtype fp32 (f32 gathers) has the same pieces and sums.
//  - The collective. Rank r's piece, elements [r P, (r + 1) P), is bytes [copy_byte(r P),
//    copy_byte((r + 1) P)): one run, longer for a rank whose piece meets the f32 part, and
//    all_gather takes one count from every rank. So each rank rounds its piece into a slot of the
//    longest run's bytes (rounded up to 4: the collective moves f32 elements), and after the wait
//    each run moves down from r x slot to copy_byte(r P), in rank order: the runs before it are no
//    longer than their slots, so no run overwrites one not yet moved. The bucket's storage
//    receives the slots itself, on any device; on a GPU, whose copies may not overlap, a run that
//    overlaps its place moves through a temporary of its bytes (move_bytes_down, core/storage.h).
//    (Until session 37 NCCL's device received into a second buffer and the storage was allocated
//    for the copies out of it: the two existed together then, a bucket's bytes more.)
//    Worked: a bucket of 1000 elements whose first 100 are f32, over 4 ranks (P = 250): rank 0's
//    run is 100 x 4 + 150 x 2 = 700 bytes, the others' 500; the slots are 700 bytes, the gather
//    2800 bytes where an f32 one is 4000, and the storage holds 2800 while gathered. The slots
//    are as long as the longest run, so a bucket whose f32 part is over 1/N of it saves less, and
//    nothing once rank 0's piece is all f32 (a small model in one bucket, wte and wpe beside its
//    blocks); with --bucket-mb 25 GPT-2's wte is a bucket of its own, and the LayerNorms and
//    biases are under 1% of a block's bucket.
//  - The dtype follows the op: a forward under the run's autocast gathers 16 bits, any other (a
//    sample, which runs in f32; saving, which streams the masters) f32, and a bucket gathered in
//    the other dtype is released and gathered again. Backward gathers what the bucket's forward
//    did, since the graph saved views of that dtype; a prefetch follows the recorded op's.
// GPT-2's 16-bit weights are the blocks' four matrices (gpt2::read_only_by_products): 68% of
// GPT-2 small's parameters, 95% of xl's; the two parameter gathers of a step carry about 0.66x
// (small) to 0.53x (xl) of f32's bytes.
#include <algorithm>
#include <cstring>

#include "train/data_parallel.h"

namespace mw::train {

void DataParallel::put_f32_members_first(Bucket& b) {
  std::stable_partition(b.members.begin(), b.members.end(),
                        [&](const Member& m) { return !low_.tensors[m.param]; });
  int64_t at = 0;
  b.f32_part = 0;
  for (Member& m : b.members) {
    member_of_[m.param] = static_cast<size_t>(&m - b.members.data());
    m.offset = at;
    at += m.numel;
    if (!low_.tensors[m.param]) b.f32_part = at;
  }
  b.slot = low_gather_slot(b.f32_part, b.piece, size());
}

int64_t low_gather_slot(int64_t f32_part, int64_t piece, int64_t ranks) {
  int64_t most = 0;
  for (int64_t r = 0; r < ranks; ++r)
    most = std::max(most,
                    low_copy_byte(f32_part, (r + 1) * piece) - low_copy_byte(f32_part, r * piece));
  return (most + 3) / 4 * 4;
}

DType DataParallel::gather_dtype(const Bucket& b, bool backward, DType autocast) const {
  if (low_.dtype == DType::F32 || b.f32_part >= b.numel) return DType::F32;
  if (backward) return b.forward_dtype;
  return autocast == low_.dtype ? low_.dtype : DType::F32;
}

dist::Work DataParallel::start_low_gather(Bucket& b) {
  const int64_t n = size(), lo = rank() * b.piece;
  const int64_t f32 = std::clamp<int64_t>(b.f32_part - lo, 0, b.piece);
  Tensor in = buffer(b.slot / 4, true);
  if (f32 > 0) in.narrow(0, 0, f32).copy_(b.param_shard.narrow(0, 0, f32));
  if (f32 < b.piece)  // rounded to nearest even, as autocast's cast
    Tensor::from_storage(in.storage(), 2 * f32, {b.piece - f32}, {1}, b.gathered_dtype)
        .copy_(b.param_shard.narrow(0, f32, b.piece - f32).to(b.gathered_dtype));
  return comm_->all_gather(
      in, Tensor::from_storage(b.params_full, 0, {n * b.slot / 4}, {1}, DType::F32));
}

void DataParallel::place_low_runs(Bucket& b) {
  const Device where = b.params_full->device();  // on CUDA, ordered on the compute stream
  auto* to = static_cast<char*>(b.params_full->data());
  for (int64_t r = 0; r < size(); ++r) {  // bytes, not a tensor op: saved views see no new version
    const int64_t at = copy_byte(b, r * b.piece);
    move_bytes_down(to + at, to + r * b.slot, copy_byte(b, (r + 1) * b.piece) - at, where);
  }
  retype(b, b.gathered_dtype);
}

void DataParallel::retype(Bucket& b, DType dtype) {
  if (dtype == DType::F32) b.gathered_dtype = DType::F32;
  if (params_.empty()) return;  // not adopted yet: nothing to retype
  for (const Member& m : b.members) {
    if (m.offset < b.f32_part) continue;
    TensorImpl* v = params_[m.param].impl();
    v->dtype = dtype;
    v->offset = dtype == DType::F32 ? m.offset : m.offset + b.f32_part;
  }
}

int64_t DataParallel::gather_bytes() const {
  int64_t bytes = 0;
  for (const Bucket& b : buckets_)
    bytes += gather_dtype(b, false, low_.dtype) != DType::F32 ? size() * b.slot : b.padded * 4;
  return bytes;
}

}  // namespace mw::train
