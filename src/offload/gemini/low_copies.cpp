// Note [16-bit copies] (gemini.h): chunks copied to the device in bf16 or fp16.
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
//  - Only chunks homed in RAM and not sharded: a disk-homed chunk is read straight into its
//    device copy, and a sharded one is all_gathered into it, in f32.
//  - The dtype follows the forward that needs the chunk: a forward under the run's autocast
//    gathers 16 bits, any other (a sample, which runs in f32 at every precision) f32, and a
//    chunk gathered in the other dtype is released and gathered again. Backward gathers what
//    the chunk's forward did, since the graph saved views of that dtype.
//  - Rounded as the copy is written (Chunk::fill_copy): by the compute thread for a gather when
//    the op starts, by the copy worker's thread for a prefetch on sim; on a GPU into a host
//    buffer (the copy worker's pinned staging buffer), which is then copied.
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
    low_chunk_[c] = params_off_[c] && !to_disk_[c] && !shard_params_[c] &&
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

int64_t Gemini::planned_copy_bytes(const Chunk& c) const {
  return low_chunk_[static_cast<size_t>(c.index())] ? c.copy_nbytes(options_.low_copies)
                                                    : c.nbytes();
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
