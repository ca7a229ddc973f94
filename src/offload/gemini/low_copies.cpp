// Note [16-bit copies] (gemini.h): chunks copied to the device in bf16 or fp16.
#include <algorithm>
#include <cstring>

#include "autograd/autocast.h"
#include "core/convert.h"
#include "offload/gemini/gemini.h"

namespace mw::gemini {

// Note [16-bit copies]: under autocast (--precision bf16|fp16) every product casts its f32 weight
// to the low dtype in forward, and again in backward, and nothing else reads that weight: the
// LayerNorms, biases and embeddings are read in f32 (Note [Autocast policy]). So a device copy
// of such weights that is already rounded to the low dtype, as ColossalAI's fp16 chunks are,
// changes no bit: the cast of a 16-bit tensor to its own dtype is the tensor, its rounding is
// the one autocast does (round to nearest even, convert_floats), and the weight's gradient,
// which autocast rounds to the low dtype and widens to f32 for the master, is widened here into
// the chunk's f32 gradient buffer instead. The copy is half the bytes of an f32 one, on the
// device and on the way there; the masters stay f32 at the chunk's home, where the optimizer
// steps them.
//  - The weights that qualify are the caller's to say (GeminiOptions::low_copy_tensors; for
//    GPT-2 the four matrices of each block, 95% of GPT-2 xl's parameters). Each chunk puts them
//    after its f32 members (Chunk::f32_part), so that a copy is the f32 part as it is and then the
//    16-bit part; which tensors share a chunk does not change (chunks of one kind each made
//    static's minimal residency release a block's matrices at every LayerNorm: docs/gemini.md).
//  - Chunks homed in RAM, and sharded chunks wherever their pieces live (Note [16-bit
//    gathers]); not a replicated chunk homed on disk, which is read straight into its device copy
//    in f32 (rounding it would take a pass through RAM, and its update takes its f32 bytes from
//    the copy while it is still gathered, saving a read).
//  - The dtype follows the forward that needs the chunk: a forward under the run's autocast
//    gathers 16 bits, any other (a sample, which runs in f32 at every precision) f32, and a
//    chunk gathered in the other dtype is released and gathered again. Backward gathers what
//    the chunk's forward did, since the graph saved views of that dtype.
//  - Rounded as the copy is written (Chunk::fill_copy): by the thread pool for a gather when the
//    op starts (on a GPU into pinned slices, Note [Staged copies], chunk.cpp), by the copy
//    worker's thread for a prefetch on sim, and by the pool into the copy worker's pinned
//    staging buffer for a prefetch on a GPU.
std::vector<char> Gemini::low_copy_flags() const {
  if (options_.low_copies == DType::F32) return std::vector<char>(names_.size(), 0);
  MW_CHECK_T(
      InvalidArgument,
      is_low_precision(options_.low_copies) && options_.low_copy_tensors.size() == names_.size(),
      "Gemini: 16-bit copies need a bf16 or f16 dtype and a flag per tensor (",
      dtype_name(options_.low_copies), ", ", options_.low_copy_tensors.size(), " flags for ",
      names_.size(), " tensors)");
  std::vector<char> out;
  for (char f : options_.low_copy_tensors) out.push_back(f ? 1 : 0);
  return out;
}

void Gemini::choose_low_chunks() {
  low_chunk_.assign(chunks_.size(), false);
  forward_copy_.assign(chunks_.size(), DType::F32);
  if (options_.low_copies == DType::F32) return;
  for (size_t c = 0; c < chunks_.size(); ++c)
    low_chunk_[c] = (shard_params_[c] || (params_off_[c] && !to_disk_[c])) &&
                    chunks_[c]->f32_part() < chunks_[c]->numel();
}

void Gemini::set_chunk_views() {
  for (auto& c : chunks_) {
    std::vector<Tensor> views;
    for (const ChunkMember& m : c->members()) views.push_back(params_[m.tensor]);
    c->set_views(std::move(views));
  }
}

DType Gemini::copy_dtype_for(Chunk& c, bool backward) {
  const auto k = static_cast<size_t>(c.index());
  if (!low_chunk_[k]) return DType::F32;
  if (backward) return forward_copy_[k];
  forward_copy_[k] = autocast_dtype() == options_.low_copies ? options_.low_copies : DType::F32;
  return forward_copy_[k];
}

// The dtype op u's use of chunk c will gather in, asked by a prefetch at op t; sets nothing (only
// the use sets forward_copy_). A backward op, and a forward op that recomputation runs again
// during backward (under the forward's autocast, which the checkpoint restores), use the
// forward's copy; a forward op during forward the autocast now in force. Taking the autocast in
// force in backward (none) prefetched the recomputed ops' chunks in f32, which each op released
// and gathered again in 16 bits: 34% more host->device bytes per step (6 blocks, bf16, auto).
DType Gemini::prefetch_dtype(const Chunk& c, int64_t t, int64_t u) const {
  const auto k = static_cast<size_t>(c.index());
  if (!low_chunk_[k]) return DType::F32;
  if (!evaluating_ &&
      (trace_keys_[static_cast<size_t>(t)].second || trace_keys_[static_cast<size_t>(u)].second))
    return forward_copy_[k];
  return autocast_dtype() == options_.low_copies ? options_.low_copies : DType::F32;
}

int64_t Gemini::planned_copy_bytes(const Chunk& c) const {
  if (!low_chunk_[static_cast<size_t>(c.index())]) return c.nbytes();
  return c.sharded() ? options_.shard_ranks * low_gather_slot(c, options_.low_copies)
                     : c.copy_nbytes(options_.low_copies);
}

int64_t Gemini::sharded_gather_bytes() const {
  int64_t bytes = 0;
  for (const auto& c : chunks_)
    if (c->sharded()) bytes += planned_copy_bytes(*c);
  return bytes;
}

// Note [16-bit gathers]: a sharded chunk's 16-bit copy is all_gathered in 16 bits, halving the
// bytes of ZeRO-3's two parameter gathers per step where DeepSpeed and ColossalAI gather their
// fp16 parameters. Rank r's piece, elements [a, b) of the chunk, is bytes [copy_byte(a),
// copy_byte(b)) of the copy (its f32 members in 4 bytes, the others in 2), one contiguous run,
// but of a length that differs between ranks whose pieces meet the f32 part, where all_gather
// takes the same count from each. So each rank sends its run in a slot of the longest run's bytes
// (rounded up to 4: the communicator moves f32 elements, and bytes are bytes), rounding its f32
// piece where the plain run's autocast would, and after the collective each rank's run moves
// down from its slot at r x slot to copy_byte(a). The runs before it are no longer than their
// slots, so copy_byte(a) <= r x slot: moved in rank order, no run overwrites one not yet moved.
// On a GPU a copy may not overlap, so a run that overlaps its place moves through a temporary of
// its bytes (move_bytes_down); until session 37 the collective there received into a second
// buffer of the whole copy's size, beside the chunk's storage, which no plan or budget counted.
// The masters, the gradients' reduce_scatter and the Adam states stay f32; the chunk's storage
// holds ranks x slot bytes while gathered, its f32 all_gather's size otherwise.
int64_t Gemini::low_gather_slot(const Chunk& c, DType dtype) const {
  int64_t most = 0;
  for (int r = 0; r < options_.shard_ranks; ++r) {
    const ChunkPiece p = chunk_piece(c.numel(), r, options_.shard_ranks);
    most = std::max(most, c.copy_byte(p.offset + p.numel, dtype) - c.copy_byte(p.offset, dtype));
  }
  return (most + 3) / 4 * 4;
}

std::function<void()> Gemini::start_low_shard_gather(Chunk& c, DType dtype) {
  const int ranks = options_.shard_ranks;
  const int64_t slot = low_gather_slot(c, dtype);
  const ChunkPiece p = piece(c);
  const Device home = c.shard().device(), where = c.where();
  const int64_t f32 = std::clamp<int64_t>(c.f32_part() - p.offset, 0, p.numel);
  Tensor in = Tensor::zeros({slot / 4}, DType::F32, home);
  copy_bytes(in.raw_data(), home, c.shard().raw_data(), home, f32 * 4);
  if (f32 < p.numel) {  // rounded to nearest even, as autocast's cast
    const Tensor low = c.shard().narrow(0, f32, p.numel - f32).to(dtype);
    copy_bytes(static_cast<char*>(in.raw_data()) + f32 * 4, home, low.raw_data(), home,
               low.nbytes());
  }
  const Tensor out = Tensor::from_storage(c.storage(), 0, {ranks * slot / 4}, {1}, DType::F32);
  std::function<void()> wait = reduction_.all_gather(in, out).wait;
  return [&c, in, out, wait, ranks, slot, dtype, where] {
    wait();
    auto* bytes = static_cast<char*>(c.storage()->data());
    for (int r = 0; r < ranks; ++r) {  // in rank order: each run lands at or below its slot
      const ChunkPiece q = chunk_piece(c.numel(), r, ranks);
      const int64_t at = c.copy_byte(q.offset, dtype);
      move_bytes_down(bytes + at, bytes + r * slot, c.copy_byte(q.offset + q.numel, dtype) - at,
                      where);
    }
  };
}

// A 16-bit gradient crosses to the buffer's device in 16 bits and is widened there (exact).
Tensor Gemini::widened_gradient(const Tensor& g, Device grad_device) {
  if (g.dtype() == DType::F32) return g;
  Tensor here = g;
  if (g.device() != grad_device) {
    here = g.contiguous().to(grad_device);
    iter_.d2h_bytes += here.nbytes();
    run_.d2h_bytes += here.nbytes();
  }
  return here.to(DType::F32);
}

}  // namespace mw::gemini
