// Note [Sharded optimizer states]: ZeRO stage 2 on Gemini's chunks (gpt2_train --gemini POLICY
// --zero 2 under mpirun). Every rank still holds every chunk's parameters (they are gathered,
// released and placed as in one process), but rank r's HybridAdam steps only its piece of each
// chunk, elements [r * stride, (r + 1) * stride) clipped to the chunk (stride = ceil(numel /
// ranks), chunk_piece), so m and v take 1/N of one process's memory.
//  - In the step's last backward, a chunk whose gradients are complete starts a reduce_scatter of
//    its gradient buffer (ranks x stride elements, the tail past the chunk zero) into this rank's
//    piece, as the replicated path starts its all_reduce (Note [Gemini under data parallel]).
//    The reduce_scatter is in place (the piece lands at the front of the buffer), so no second
//    buffer is alive while the backward goes on.
//  - As each reduction completes (polled in backward, waited for in chunk order after it), its
//    piece is copied out scaled to the mean, its sum of squares taken and the chunk's full buffer
//    freed, so after the reductions only pieces remain (the gradients are sharded too). The norm
//    for clipping is the sum of every rank's squares: one all_reduce of a double (the order of the
//    additions differs from one process's, so a clipped run matches it within rounding, not
//    bitwise).
//  - step() updates each piece with the CPU kernel (where the chunk's states live) and then
//    all_gathers every rank's updated piece into the chunk, at most two chunks' gathers in flight
//    so their buffers stay two chunks' worth.
// Per step and rank that is (N-1)/N x Psi elements each way, 2 Psi (N-1)/N in all: the ring
// all_reduce's volume, ZeRO-2's figure. Every rank completes, reduces and gathers the same chunks
// in the same order, so the collectives match. Parameters stay replicated, so evaluation,
// sampling and saving the model are those of one process; the optimizer's file is one process's
// too (train/zero_state_file.h), so a checkpoint resumes at any rank count.
//
// Note [Sharded parameters]: ZeRO stage 3 on Gemini's chunks (gpt2_train --gemini POLICY --zero 3,
// or --zero 2 --shard-param-frac F: ColossalAI's shard_param_frac, the first chunks holding that
// share of the bytes). A sharded chunk keeps only this rank's piece of its parameters (the same
// elements as its piece of the Adam states, so HybridAdam steps the piece in place and nothing is
// gathered after the update), at the chunk's home (the host when offloaded, else the device). The
// whole chunk exists only while ops use it:
//  - Construction: as each chunk is filled (Note [Streaming construction]), rank 0's values are
//    broadcast into it, the piece is copied out and the whole chunk freed: one chunk at a time.
//  - An op that needs a sharded chunk all_gathers every rank's piece straight into the chunk's
//    device storage (sized ranks x stride for it), blocking the op; the chunk is released when an
//    op starts that does not use it, under every policy: a run of consecutive ops (a block's layers
//    in one chunk) gathers once. With a plan (auto, const) it may go earlier, after its last use
//    in the iteration; the plan never evicts it otherwise. Both rules follow the order of the ops
//    alone, which every rank shares, so every rank gathers the same chunks in the same order and
//    the collectives match (device memory, which may differ between ranks, decides only the
//    replicated chunks' evictions, which involve no collective).
//  - Backward gathers a chunk again where an op needs its data (an embedding's backward does
//    not), the gradients are reduce_scattered into pieces as under stage 2, each piece stepped.
// Per step and rank that is, for a chunk used in one run of forward ops and one of backward ops,
// two all_gathers and one reduce_scatter of (N-1)/N of it: 3 Psi (N-1)/N for every chunk sharded,
// ZeRO-3's figure (recomputation gathers again). Evaluation and sampling are forwards like any
// other: every rank runs them. Saving is collective too: rank 0's writer touches parameters in
// its order, each chunk it reaches is announced to every rank (from_rank0) and gathered into RAM,
// one at a time (stream_sharded), while rank 0 writes it.
//
// Note [Pieces on disk]: with a host budget (Note [Three tiers under data parallel], tiers.cpp)
// that this rank's pieces do not fit, sharded chunks' pieces are homed on disk too, after every
// replicated chunk, last chunk first (plan_tiers): ZeRO-Infinity's parameter offload, on chunks.
// A piece on disk is a blob ("shard.C", ranks' files apart), written once as the chunk is filled,
// in RAM only while it is used:
//  - a gather (an op, a prefetch, saving) reads the piece, all_gathers it and frees it unwritten
//    (the blob is unchanged);
//  - a piece read for a gather of the step's last backward stays in RAM until its update
//    (Chunk::piece_kept), when chunks are updated as their reductions complete (Note [Updates as
//    reductions complete]): the update follows the chunk's last op by the reductions in flight,
//    and the chunk is usually released by then, so it would read the piece a third time. With
//    deferred updates it would keep every piece until step(), so it does not;
//  - an update takes the kept piece, else the chunk's gathered copy, else reads it; HybridAdam
//    steps it and it goes back to disk behind the update (pending_, at most one waiting: the
//    replicated disk-homed chunks' rule);
//  - with the shard prefetch (Note [Shard prefetch]), op t starts the reads of op t + 2's pieces
//    (piece_reads_), so that op t + 1's all_gather of them finds them read: the compute thread
//    waits for the disk only where a read was slower than an op.
// So RAM holds, beyond the homes, the pieces between their backward gather and their update, the
// next op's pieces read ahead, and at most one on its way back. Each step reads a disk-homed piece
// once in forward (per run of ops that gathers its chunk) and once in backward, and writes it
// once: 1/N of a chunk each way where a replicated disk-homed chunk moves the whole chunk.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/allocator.h"
#include "core/ops.h"
#include "offload/gemini/gemini.h"
#include "offload/gemini/rank0_stream.h"
#include "optim/grad_norm.h"

namespace mw::gemini {

ChunkPiece chunk_piece(int64_t chunk_numel, int rank, int ranks) {
  MW_CHECK_T(InvalidArgument, ranks >= 1 && rank >= 0 && rank < ranks && chunk_numel >= 0,
             "chunk_piece: rank ", rank, " of ", ranks, " ranks, chunk of ", chunk_numel);
  ChunkPiece p;
  p.stride = (chunk_numel + ranks - 1) / ranks;
  p.offset = std::min<int64_t>(rank * p.stride, chunk_numel);
  p.numel = std::min<int64_t>(p.stride, chunk_numel - p.offset);
  return p;
}

// This rank's piece of the chunk's bytes in RAM, stride elements (the tail past the chunk zero):
// an all_gather's input.
Tensor Gemini::copy_piece_out(const Chunk& c) const {
  const ChunkPiece p = piece(c);
  Tensor out = Tensor::zeros({p.stride}, DType::F32, Device::cpu());
  copy_bytes(out.raw_data(), Device::cpu(),
             static_cast<const float*>(c.flat().raw_data()) + p.offset, c.flat().device(),
             p.numel * 4);
  return out;
}

// Sharded states: ranks x stride elements, the reduce_scatter's input; else the chunk's.
int64_t Gemini::grad_buffer_numel(const Chunk& c) const {
  return sharded() ? piece(c).stride * options_.shard_ranks : c.numel();
}

ChunkPiece Gemini::piece(const Chunk& c) const {
  if (!sharded()) return {0, c.numel(), c.numel()};
  return chunk_piece(c.numel(), options_.shard_rank, options_.shard_ranks);
}

// The elements of chunk c's piece p that the weight decay leaves alone: its members' whose
// tensors are not decayed (Note [Weight decay by ranges]).
optim::NoDecayRanges Gemini::piece_no_decay(const Chunk& c, const ChunkPiece& p) const {
  std::vector<int64_t> offsets, numels;
  std::vector<char> decays;
  for (const ChunkMember& m : c.members()) {
    offsets.push_back(m.offset);
    numels.push_back(m.numel);
    decays.push_back(options_.tensor_decays.at(m.tensor));
  }
  return optim::no_decay_ranges_of(offsets, numels, decays, p.offset, p.numel);
}

void Gemini::start_reduction(Chunk& c) {
  const size_t ci = static_cast<size_t>(c.index());
  if (!sharded()) {
    reducing_[ci] = reduction_.start(c.grad);
    return;
  }
  // In place: the piece lands at the front of the chunk's buffer (no second buffer while the
  // backward goes on); settle_piece copies it out and frees the buffer.
  Gemini::GradientReduction::Started started =
      reduction_.reduce_scatter(c.grad, c.grad.narrow(0, 0, piece(c).stride));
  reducing_[ci] = std::move(started.wait);
  reduced_[ci] = std::move(started.done);
  settle_done_pieces();
}

// During backward: the chunks whose reduce_scatter completed give back their full buffers at
// once, so the full gradients alive are those still being reduced, not every chunk's.
void Gemini::settle_done_pieces() {
  for (auto& c : chunks_) {
    const size_t ci = static_cast<size_t>(c->index());
    if (!reducing_[ci] || !reduced_[ci] || !reduced_[ci]()) continue;
    std::function<void()> wait = std::move(reducing_[ci]);
    reducing_[ci] = nullptr;
    wait();
    settle_piece(*c);  // clears reduced_[ci]
  }
}

// After its reduce_scatter: the mean, the norm's share, and the full buffer freed.
void Gemini::settle_piece(Chunk& c) {
  const size_t ci = static_cast<size_t>(c.index());
  const ChunkPiece p = piece(c);
  reduced_[ci] = nullptr;
  piece_grads_[ci] = Tensor::empty({std::max<int64_t>(1, p.numel)}, DType::F32, c.grad.device());
  if (c.grad.device().is_cuda()) {  // on the device, by its kernels: the host cannot read it
    Tensor x = piece_grads_[ci].narrow(0, 0, p.numel);
    x.copy_(c.grad.narrow(0, 0, p.numel));
    ops::scale_(x, reduction_.scale);
    std::vector<double> parts;
    optim::append_block_squares(x, parts);
    piece_norm_sq_[ci] = optim::add_in_order(0.0, parts);
  } else {
    float* x = static_cast<float*>(piece_grads_[ci].raw_data());
    const float* sum = static_cast<const float*>(c.grad.raw_data());
    double sum_sq = 0;
    for (int64_t i = 0; i < p.numel; ++i) {
      x[i] = sum[i] * reduction_.scale;
      sum_sq += static_cast<double>(x[i]) * x[i];
    }
    piece_norm_sq_[ci] = sum_sq;
  }
  if (c.grad.device().is_cpu()) track_host(-c.grad.nbytes());
  c.grad = Tensor();
  c.norm_taken = true;
  forget_grads_in_ram(c);
}

double Gemini::sharded_norm() {
  double local = 0;
  for (auto& c : chunks_)  // settled this step (a piece updated in backward is gone already)
    if (c->norm_taken) local += piece_norm_sq_[static_cast<size_t>(c->index())];
  return std::sqrt(reduction_.sum_over_ranks(local));
}

// step(): this rank's piece stepped, then every rank's piece gathered into the chunk.
void Gemini::update_piece(Chunk& c, bool gather) {
  const size_t ci = static_cast<size_t>(c.index());
  if (c.shard_on_nvme()) piece_into_ram(c);  // Note [Pieces on disk]
  if (c.on_nvme())  // Note [Three tiers under data parallel]: its RAM copy is stepped
    bring_home(c);
  else if (c.gathered())
    release(c, false);  // the home is stepped: a device copy would be stale
  const double t0 = now_us();
  uint64_t ticket = 0;
  if (adam_index_[ci] >= 0) {
    const size_t k = static_cast<size_t>(adam_index_[ci]);
    set_grad(adam_->params()[k], piece_grads_[ci].narrow(0, 0, piece(c).numel));
    ticket = adam_->step_param(k);  // states on disk: done later, on the updater thread
  }
  piece_grads_[ci] = Tensor();
  ++stepped_chunks_;
  if (trace_out_) trace_out_->slice(str("adam piece ", c.index()), "optim", t0, now_us() - t0);
  if (c.sharded()) {  // stepped in place; the next op that needs it gathers it
    if (!c.shard_on_nvme()) return throttle_updates(ticket);  // Note [Three tiers]
    pending_.push_back({c.index(), ticket, io::IoHandle(), false, /*piece=*/true});
    c.piece_kept = false;  // the write-back owns it now
    poll_pending(false);
    while (pending_.size() > 1) settle_pending(0, /*block=*/true);
    return;
  }
  stepping_.push_back({c.index(), ticket, Tensor(), io::IoHandle(), false});
  if (gather)
    start_piece_gathers(false);  // else step() does (Note [Updates as reductions complete])
}

// The updated pieces are all_gathered into their chunks in the order they were stepped (the
// same on every rank), each once its update ran. While the updater steps one piece (its states
// streaming from disk) the next chunk comes home; the oldest is waited for once two are queued
// (all: every one), so the chunks' RAM copies stay two.
void Gemini::start_piece_gathers(bool all) {
  while (!stepping_.empty()) {
    const Stepping s = stepping_.front();
    if (!adam_->update_done(s.ticket)) {
      if (!all && stepping_.size() < 2) return;
      adam_->wait_update(s.ticket);
    }
    stepping_.erase(stepping_.begin());
    Chunk& c = *chunks_[static_cast<size_t>(s.chunk)];
    const ChunkPiece p = piece(c);
    Gathering g;
    g.chunk = c.index();
    g.out = Tensor::empty({p.stride * options_.shard_ranks}, DType::F32, Device::cpu());
    track_host(g.out.nbytes());
    if (s.piece.defined()) {  // parked, still in RAM: counted already
      s.write.wait();
      g.in = s.piece;
    } else if (s.on_disk) {  // parked on disk
      g.in = Tensor::zeros({p.stride}, DType::F32, Device::cpu());
      swap_->read(str("piece.", c.index()), g.in.raw_data()).wait();
      iter_.nvme_read_bytes += g.in.nbytes();
      run_.nvme_read_bytes += g.in.nbytes();
      track_host(g.in.nbytes());
    } else {
      g.in = copy_piece_out(c);
      track_host(g.in.nbytes());
    }
    g.wait = reduction_.all_gather(g.in, g.out).wait;
    gathering_.push_back(std::move(g));
    finish_gather(false);
  }
}

// Note [Updates as reductions complete] (deferred.cpp): a disk-homed chunk stepped in backward
// keeps only this rank's updated piece until step() gathers it. Once its update ran (the oldest
// waited for while two wait: all, every one), the piece is copied out, the chunk's RAM copy freed
// unwritten, and the piece itself written to disk and its RAM freed (at most two in flight), so
// backward holds two chunks' RAM copies and two pieces at most, within the host budget's reserve;
// step() reads each piece back for its all_gather and writes the gathered chunk home.
void Gemini::park_stepped(bool all) {
  size_t waiting = 0;
  for (const Stepping& s : stepping_)
    waiting += !s.piece.defined() && !s.on_disk && chunks_[static_cast<size_t>(s.chunk)]->on_nvme();
  for (Stepping& s : stepping_) {
    Chunk& c = *chunks_[static_cast<size_t>(s.chunk)];
    if (s.piece.defined() || s.on_disk || !c.on_nvme()) continue;
    if (!adam_->update_done(s.ticket)) {
      if (!all && waiting < 2) continue;
      adam_->wait_update(s.ticket);
    }
    s.piece = copy_piece_out(c);
    track_host(s.piece.nbytes() - c.nbytes());
    c.drop_ram();
    s.write = swap_->write(str("piece.", c.index()), s.piece.raw_data(), s.piece.nbytes());
    iter_.nvme_write_bytes += s.piece.nbytes();
    run_.nvme_write_bytes += s.piece.nbytes();
    --waiting;
  }
  size_t writing = 0;
  for (const Stepping& s : stepping_) writing += s.piece.defined();
  for (Stepping& s : stepping_) {  // oldest first; throws the IoError naming the file
    if (!s.piece.defined() || (writing <= 2 && !s.write.done())) continue;
    s.write.wait();
    track_host(-s.piece.nbytes());
    s.piece = Tensor();
    s.on_disk = true;
    --writing;
  }
}

// Completes the oldest gathers (all, or all but the newest), copying each into its chunk.
void Gemini::finish_gather(bool all) {
  while (gathering_.size() > (all ? 0u : 1u)) {
    Gathering g = std::move(gathering_.front());
    gathering_.erase(gathering_.begin());
    g.wait();  // throws the communicator's error (a timeout names the collective)
    Chunk& c = *chunks_[static_cast<size_t>(g.chunk)];
    if (c.on_nvme() && c.storage()->is_released()) {  // parked: RAM to write it home from
      c.bring_home_to_ram();
      track_host(c.nbytes());
    }
    copy_bytes(c.flat().raw_data(), c.flat().device(), g.out.raw_data(), Device::cpu(), c.nbytes());
    track_host(-(g.in.nbytes() + g.out.nbytes()));
    // A disk-homed chunk goes back to disk and frees its RAM copy (settle_pending; updated: 0).
    if (!c.on_nvme()) continue;
    pending_.push_back({c.index(), 0, io::IoHandle(), false});
    while (pending_.size() > 1) settle_pending(0, /*block=*/true);
  }
}

// Note [Sharded parameters]: a filled chunk keeps this rank's piece of rank 0's values.
void Gemini::shard_chunk(Chunk& c) {
  if (options_.broadcast_from_rank0) options_.broadcast_from_rank0(c.flat());
  const ChunkPiece p = piece(c);
  const Device home = params_off_[static_cast<size_t>(c.index())] ? Device::cpu() : options_.device;
  Tensor shard = Tensor::zeros({p.stride}, DType::F32, home);
  copy_bytes(shard.raw_data(), home, static_cast<const float*>(c.flat().raw_data()) + p.offset,
             c.flat().device(), p.numel * 4);
  c.set_sharded(shard, p.stride * options_.shard_ranks);
  sharded_param_bytes_ += shard.nbytes();
  sharded_numel_ += c.numel();
  if (to_disk_[static_cast<size_t>(c.index())]) {  // Note [Pieces on disk]
    swap_->write(str("shard.", c.index()), shard.raw_data(), shard.nbytes()).wait();
    iter_.nvme_write_bytes += shard.nbytes();
    run_.nvme_write_bytes += shard.nbytes();
    c.set_shard_on_nvme();
  } else if (home.is_cpu())
    track_host(shard.nbytes());
  else
    device_home_bytes_ += shard.nbytes();
}

// Every rank's piece into the chunk's storage on `where` (the device for an op, the host for
// with_parameters_readable and saving). Collective: every rank gathers the same chunk. Returns
// the wait, which throws the communicator's error.
std::function<void()> Gemini::start_shard_gather(Chunk& c, Device where, int64_t op, DType dtype) {
  MW_CHECK(static_cast<bool>(reduction_.all_gather), "Gemini: chunk ", c.index(),
           " is sharded across ranks, but no all_gather was given (set_gradient_reduction)");
  const ChunkPiece p = piece(c);
  if (c.shard_on_nvme()) {  // Note [Pieces on disk]
    if (!c.shard_in_ram() || piece_reads_.count(c.index()) > 0) read_piece(c);
    if (where == options_.device && keeps_piece_for_update(op)) c.piece_kept = true;
  }
  const bool low = dtype != DType::F32;  // Note [16-bit gathers] (low_copies.cpp)
  try {
    c.gather_uninitialized(where, dtype,
                           low ? options_.shard_ranks * low_gather_slot(c, dtype) : 0);
  } catch (...) {
    drop_piece_if_idle(c);
    throw;
  }
  try {
    std::function<void()> wait =
        low ? start_low_shard_gather(c, dtype)
            : reduction_
                  .all_gather(c.shard(), Tensor::from_storage(c.storage(), 0,
                                                              {p.stride * options_.shard_ranks},
                                                              {1}, DType::F32))
                  .wait;
    if (!c.shard_on_nvme()) return wait;
    // Freed once gathered, unwritten; after a failure the collective may still read it: kept.
    return [this, &c, wait] {
      wait();
      drop_piece_if_idle(c);
    };
  } catch (...) {
    c.release_copy();
    drop_piece_if_idle(c);
    throw;
  }
}

// Note [Pieces on disk]: RAM for a disk-homed piece, read from its blob (or the read ahead of
// it finished).
void Gemini::read_piece(Chunk& c) {
  const int64_t n = c.shard().nbytes();
  auto ahead = piece_reads_.find(c.index());
  io::IoHandle read;
  if (ahead != piece_reads_.end()) {
    read = ahead->second;
    piece_reads_.erase(ahead);
  } else {
    c.bring_shard_to_ram();
    track_host(n);
  }
  try {
    if (read.request_count() == 0)
      read = swap_->read(str("shard.", c.index()), c.shard().raw_data());
    read.wait();
  } catch (...) {  // throws the IoError naming the file, offset and errno
    read.join();
    c.drop_shard_ram();
    track_host(-n);
    throw;
  }
  iter_.nvme_read_bytes += n;
  run_.nvme_read_bytes += n;
}

// A read ahead of a disk-homed piece's gather, into RAM of its own (Note [Pieces on disk]).
void Gemini::start_piece_read(Chunk& c) {
  if (!c.shard_on_nvme() || c.shard_in_ram() || c.gathered()) return;
  const int64_t n = c.shard().nbytes();
  c.bring_shard_to_ram();
  track_host(n);
  try {
    piece_reads_[c.index()] = swap_->read(str("shard.", c.index()), c.shard().raw_data());
  } catch (...) {
    c.drop_shard_ram();
    track_host(-n);
    throw;
  }
}

// Reads ahead that no gather took (the op sequence left the plan, or a step was abandoned):
// finished, counted, then their RAM freed; a failure is forgotten (the blob is still the truth,
// and the next read reports it).
void Gemini::settle_piece_reads() {
  for (auto& [ci, read] : piece_reads_) {
    read.join();
    Chunk& c = *chunks_[static_cast<size_t>(ci)];
    const int64_t n = c.shard().nbytes();
    if (!read.failed()) {
      iter_.nvme_read_bytes += n;
      run_.nvme_read_bytes += n;
    }
    c.drop_shard_ram();
    track_host(-n);
  }
  piece_reads_.clear();
}

// A disk-homed piece in RAM for a gather goes again, unless it is kept for its update or an
// update waits to write it back.
void Gemini::drop_piece_if_idle(Chunk& c) {
  if (!c.shard_on_nvme() || !c.shard_in_ram() || c.piece_kept || piece_reads_.count(c.index()) > 0)
    return;
  for (const PendingWrite& w : pending_)
    if (w.piece && w.chunk == c.index()) return;
  c.drop_shard_ram();
  track_host(-c.shard().nbytes());
}

// Note [Pieces on disk]: whether a piece read for op t's gather is kept for its chunk's update.
bool Gemini::keeps_piece_for_update(int64_t t) const {
  return updates_as_reduced_ && final_backward_ && !evaluating_ && t >= 0 &&
         t < static_cast<int64_t>(trace_keys_.size()) && trace_keys_[static_cast<size_t>(t)].second;
}

// After step(): a kept piece whose chunk was not updated (no gradient) leaves RAM, and so does a
// piece read ahead for a gather that did not come.
void Gemini::drop_kept_pieces() {
  settle_piece_reads();
  for (auto& c : chunks_)
    if (c->piece_kept) {
      c->piece_kept = false;
      drop_piece_if_idle(*c);
    }
}

// Before a disk-homed piece's update: its bytes from a read ahead, the piece kept from its
// backward gather, the chunk's gathered copy (the tail past the chunk zero, as on disk), or disk.
void Gemini::piece_into_ram(Chunk& c) {
  if (piece_reads_.count(c.index()) > 0) return read_piece(c);
  if (c.shard_in_ram()) return;
  if (!c.gathered() || c.copy_dtype() != DType::F32) return read_piece(c);
  const ChunkPiece p = piece(c);
  c.bring_shard_to_ram();
  track_host(c.shard().nbytes());
  auto* out = static_cast<float*>(c.shard().raw_data());
  copy_bytes(out, Device::cpu(), static_cast<const float*>(c.flat().raw_data()) + p.offset,
             c.flat().device(), p.numel * 4);
  std::fill(out + p.numel, out + p.stride, 0.f);
  if (!c.flat().device().is_cpu()) {
    iter_.d2h_bytes += p.numel * 4;
    run_.d2h_bytes += p.numel * 4;
  }
}

void Gemini::gather_shard(Chunk& c, Device where, DType dtype) {
  const auto t0 = std::chrono::steady_clock::now();
  std::function<void()> wait = start_shard_gather(c, where, op_ - 1, dtype);
  try {
    wait();
  } catch (...) {
    c.release_copy();
    throw;
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  iter_.shard_gather_ms += ms;
  run_.shard_gather_ms += ms;
}

// Note [Shard prefetch]: after the warmup, while op t runs, the sharded chunks of op t + 1 are
// being all_gathered (on the communicator's progress thread), so an op waits only for what the
// gather did not finish in the time of the op before it. Whether to prefetch must be the same on
// every rank, since the all_gather is collective: after the warmup each rank checks that every op's
// non-model memory (sampled in the warmup under every policy when chunks are sharded), its chunks
// and the next op's sharded chunks fit the policy's room (capacity x (1 - margin) under static and
// auto, the budget on gathered chunks under const), and one all_reduce makes the answer every
// rank's. Only when every offloaded chunk is sharded: auto's plan keeps replicated chunks up to the
// room, leaving none for a prefetched one. Evaluations prefetch under a plan only (static's run
// with minimal residency).
void Gemini::plan_shard_prefetch() {
  prefetch_shards_ = false;
  if (!shards_parameters()) return;
  bool fits = true;
  for (const auto& c : chunks_)
    if (c->host_home() && !c->sharded()) fits = false;
  const int64_t capacity = allocator_for(options_.device).stats().capacity_bytes;
  const double room =
      options_.policy == Policy::kConst ? static_cast<double>(options_.const_budget_bytes)
      : capacity > 0 ? static_cast<double>(capacity) * (1.0 - margin_) - device_home_bytes_
                     : 1e300;
  for (size_t t = 0; t < trace_.size(); ++t) {
    const std::vector<int>& own = trace_[t].chunks;
    double bytes = options_.policy == Policy::kConst ? 0.0 : static_cast<double>(nonmodel_.at(t));
    for (int c : own) bytes += planned_copy_bytes(*chunks_[static_cast<size_t>(c)]);
    if (t + 1 < trace_.size())
      for (int c : trace_[t + 1].chunks)
        if (chunks_[static_cast<size_t>(c)]->sharded() &&
            std::find(own.begin(), own.end(), c) == own.end())
          bytes += planned_copy_bytes(*chunks_[static_cast<size_t>(c)]);
    if (bytes > room) fits = false;
  }
  prefetch_shards_ = reduction_.sum_over_ranks(fits ? 0.0 : 1.0) == 0.0;
  if (options_.verbose)
    std::printf("gemini: sharded chunks %s\n",
                prefetch_shards_ ? "gathered one op ahead (Note [Shard prefetch])"
                                 : "gathered by the op that needs them: a rank has no room to "
                                   "gather one op ahead, or a replicated chunk is offloaded");
}

void Gemini::prefetch_shards(int64_t t) {
  if (t + 1 >= plan_ops()) return;
  for (int c : trace_[static_cast<size_t>(t + 1)].chunks) {
    Chunk& chunk = *chunks_[static_cast<size_t>(c)];
    if (!chunk.sharded() || chunk.gathered()) continue;
    const double t0 = now_us();
    const DType dtype = prefetch_dtype(chunk, t, t + 1);
    shard_inflight_[c] = start_prefetch_gather(chunk, t + 1, dtype);  // Note [Memory pressure]
    ++iter_.gathers;
    ++run_.gathers;
    if (trace_out_) trace_out_->slice(str("prefetch chunk ", c), "move", t0, now_us() - t0, 1);
  }
  if (t + 2 < plan_ops())  // Note [Pieces on disk]: the reads for the gathers of the next op
    for (int c : trace_[static_cast<size_t>(t + 2)].chunks)
      start_piece_read(*chunks_[static_cast<size_t>(c)]);
}

// The op that needs a prefetched chunk waits for the rest of its all_gather.
void Gemini::join_shard_gather(Chunk& c) {
  auto it = shard_inflight_.find(c.index());
  if (it == shard_inflight_.end()) return;
  std::function<void()> wait = std::move(it->second);
  shard_inflight_.erase(it);
  const double ms = await_copy(c, wait);
  iter_.shard_gather_ms += ms;
  run_.shard_gather_ms += ms;
}

// with_parameters_streamed under sharded parameters (Note [Streaming from rank 0]): every rank
// gathers the sharded chunks rank 0's writer reaches into RAM, one at a time.
void Gemini::stream_sharded(const std::function<void(const Touch& touch)>& fn,
                            const std::function<void(Chunk& c)>& local) {
  MW_CHECK(static_cast<bool>(reduction_.from_rank0), "Gemini: saving sharded chunks needs ",
           "from_rank0 (set_gradient_reduction)");
  Rank0Stream s;
  s.root = options_.shard_rank == 0;
  s.from_rank0 = reduction_.from_rank0;
  s.gather = [&](int64_t k) { gather_shard(*chunks_[static_cast<size_t>(k)], Device::cpu()); };
  s.release = [&](int64_t k) { chunks_[static_cast<size_t>(k)]->release_copy(); };
  stream_from_rank0(s, [&](const std::function<void(int64_t)>& need) {
    fn([&](const std::string& name) {
      auto it = index_of_.find(name);
      MW_CHECK_T(InvalidArgument, it != index_of_.end(), "Gemini: no parameter named '", name, "'");
      Chunk& c = *chunks_[chunk_of_[it->second]];
      if (c.sharded())
        need(c.index());
      else
        local(c);  // a disk-homed chunk, read by the writer's rank alone
    });
  });
}

}  // namespace mw::gemini
