// Gemini in the full training loop: updates deferred to after backward (--grad-clip,
// --grad-accum) and evaluation forwards between steps. gemini.cpp has the chunks and hooks.
//
// Note [Deferred updates]: the global gradient norm must be known before any chunk is updated,
// and with K micro-batches a chunk's gradient is only final after the K-th backward. So in
// deferred mode a chunk whose gradients are complete in a backward is not stepped: its buffer
// keeps them, and later backwards add into it. Per tensor, grad_in_buffer_ says whether the buffer
// holds a gradient of it: the first is copied (as autograd takes a leaf's first gradient), later
// ones added with the plain run's operation (AccumulateGrad's axpy_, autograd/engine.cpp), so the
// sums are bitwise those of .grad in a plain run, also for a tensor that some micro-batches leave
// without a gradient. A chunk is complete in a backward once every member's gradient arrived in
// that backward: c.grads_ready counts them from 0 at each backward's start, which
// set_final_backward marks (the trainer calls it before each backward; without it, a tensor's
// second gradient since the last mark does, which misses a backward whose first gradient is of a
// tensor the one before lacked). In the last backward each complete chunk gives its members' block
// partials of the squared norm at once (Note [Norm order], optim/grad_norm.h), while the buffer
// is still in memory; a chunk not complete in it gives them in grad_norm(), which adds them in
// parameter order, the plain run's order, so the norm and the clip factor are identical. step()
// then updates every chunk (the clip factor and 1/K are HybridAdam's div_scale). A member without
// a gradient in the whole step, beside members with one, cannot be the plain run's: that leaves
// the parameter as it is, but HybridAdam steps the chunk whole (m and v decay, the weight decay
// applies). In one process grad_norm() and step() refuse such a step first, naming the tensor
// (InvalidArgument; skip_step drops it), unless updates in the last backward stepped chunks
// already: then, as with one backward a step, the chunk is stepped with a zero gradient for it.
// Under data parallel the plain run steps it with a zero gradient (its bucket is zero-filled,
// train/data_parallel.cpp), as the chunk does.
//
// Gradient buffers of disk-homed chunks (three tiers) do not stay in RAM: once complete in a
// backward, all but the newest are written to the swap space ("grad.C") and freed when written;
// a later backward or the update reads a buffer back (or takes it back unread when its write is
// still in flight). The update pass goes, to move the fewest bytes: chunks homed on the device or
// in RAM (no disk traffic), then disk-homed chunks whose gradients are still in RAM, newest first,
// then the spilled ones. Against updating in backward, a disk-homed chunk costs per step one more
// read of its parameters (in backward its update took them from the device copy) and a write and
// read of its gradient (docs/gemini.md has the measured bytes).
//
// Note [Gemini under data parallel]: every rank holds the same chunks (replicated: ZeRO stage 0;
// stages 2 and 3 in shard.cpp) and trains on
// its rows of the global batch. Updates are deferred: in the step's last backward, a chunk whose
// gradients are complete starts an all_reduce of its buffer at once, so the reductions overlap the
// rest of backward; the chunks that never completed (a member without a gradient) start theirs
// after backward, in chunk order. Every rank completes the same chunks in the same order, so the
// collectives match. Before the norm (grad_norm) or the update (step), each reduction is waited
// for in chunk order, the sum scaled to the mean, and the chunk's norm partials taken from it.
// Disk-homed chunks' gradient buffers go to disk only after their reductions (Note [Three tiers
// under data parallel], tiers.cpp).
//
// Note [Evaluation forward]: an evaluation (no_grad forwards, between steps) must neither record
// into nor disturb the training plan. With a plan, it uses the warmup's forward ops (the trace up
// to the first backward op: an evaluation forward calls the same modules in the same order) with
// their own next uses, so a chunk is released after its last use in the evaluation forward and
// disk-homed chunks are read ahead as in training; the budgets are the training forward's, whose
// non-model memory (saved activations) is at least an evaluation's at the same op. Without a plan
// (static, or before the first step), minimal residency. Every forward of the evaluation repeats
// the op sequence from op 0. end_eval releases every gathered chunk and resets the op counter, so
// the next training step starts as after any step; its counters go to eval_stats().
#include <algorithm>
#include <cmath>

#include "autograd/autograd.h"
#include "core/allocator.h"
#include "core/ops.h"
#include "offload/gemini/gemini.h"
#include "optim/grad_norm.h"

namespace mw::gemini {

void Gemini::set_deferred_updates(bool on) {
  MW_CHECK(op_ == 0 && !evaluating_, "Gemini::set_deferred_updates must be called between steps");
  deferred_ = on;
  norm_parts_.assign(names_.size(), {});
}

void Gemini::set_final_backward(bool final) {
  final_backward_ = final;
  begin_backward();
}

void Gemini::begin_backward() {
  std::fill(arrived_in_backward_.begin(), arrived_in_backward_.end(), 0);
  for (auto& c : chunks_) c->grads_ready = 0;
}

void Gemini::refuse_missing_gradients() const {
  if (reducing()) return;  // the plain data-parallel run steps it with a zero gradient too
  // Updates in the last backward (Note [Updates in the last backward]) stepped the complete chunks
  // already: a refusal now would leave the step half applied. As with one backward a step, the
  // incomplete chunk is stepped with a zero gradient for the member that got none.
  if (stepped_chunks_ > 0) return;
  for (const auto& c : chunks_) {
    if (!c->grad.defined() && !c->grad_on_disk) continue;  // no member has one: none is stepped
    for (const ChunkMember& m : c->members())
      MW_CHECK_T(InvalidArgument, grad_in_buffer_[m.tensor], "Gemini: parameter '",
                 names_[m.tensor], "' got no gradient in any backward of this step, but other ",
                 "parameters of its chunk (", c->index(),
                 ") did. A plain optimizer would leave it as it is; Gemini steps the chunk whole, "
                 "which would move it. Use every parameter in some micro-batch of each step, or "
                 "leave it out of the model's parameters; skip_step() drops this step");
  }
}

// A member's first gradient in the step is copied (as autograd takes a leaf's first gradient);
// later ones are added with AccumulateGrad's operation.
void Gemini::add_gradient(Chunk& c, const ChunkMember& member, const Tensor& g,
                          Device grad_device) {
  Tensor gc = g.contiguous();
  if (!gc.device().is_cpu() && grad_device.is_cpu()) {
    iter_.d2h_bytes += gc.nbytes();
    run_.d2h_bytes += gc.nbytes();
  }
  if (!grad_in_buffer_[member.tensor]) {
    copy_bytes(static_cast<float*>(c.grad.raw_data()) + member.offset, grad_device, gc.raw_data(),
               gc.device(), gc.nbytes());
    grad_in_buffer_[member.tensor] = 1;
    return;
  }
  // A later micro-batch adds into the buffer. A gradient on another device comes over in slices
  // (kAddSliceNumel), so the host never holds a second copy of a large one (wte's: 147 MiB for
  // GPT-2 small; measured with --grad-accum 2, the host peak that much above the memory plan).
  const Tensor flat = gc.view({member.numel});
  const bool here = gc.device() == grad_device;
  const int64_t step = here ? member.numel : kAddSliceNumel;
  for (int64_t at = 0; at < member.numel; at += step) {
    const int64_t n = std::min(step, member.numel - at);
    const Tensor part = flat.narrow(0, at, n);
    Tensor dst = c.grad.narrow(0, member.offset + at, n);
    ops::axpy_(dst, here ? part : part.to(grad_device));
  }
}

void Gemini::complete_deferred(Chunk& c) {
  c.grads_ready = 0;
  if (final_backward_) {
    if (reducing())  // Note [Gemini under data parallel]
      start_reduction(c);
    else
      take_norm_parts(c);
    // Note [Updates as reductions complete], Note [Updates in the last backward]
    if (updates_as_reduced_) {
      reduced_order_.push_back(c.index());
      update_reduced(1);
    }
  }
  if (c.on_nvme()) spill_grads(/*all=*/false);
}

// Note [Updates in the last backward]: with accumulation and nothing that needs every gradient
// first (no clipping, no fp16 loss scaling), the divisor 1/K is known before backward (the
// trainer sets it as HybridAdam's div_scale). So in the step's last backward a chunk, once its
// gradient is complete (the sum over the micro-batches, added in the plain run's order), is
// updated one chunk behind as Note [Updates as reductions complete] does it, without a
// reduction to wait for: the same sums, divisor and Adam step as at step(), bitwise, and the
// updates overlap the rest of backward again.

// Note [Updates as reductions complete]: under data parallel without clipping, accumulation or
// fp16 loss scaling (nothing needs every gradient before the first update), a chunk is updated in
// backward, as one process updates it, one chunk behind its reduction: when backward completes a
// chunk and starts its reduction, the reduction of the chunk completed before it is waited for
// and that chunk updated, so each reduction has a chunk's worth of backward to complete in. A
// replicated chunk is stepped whole (no collective); under sharded states this rank's piece is
// stepped and the all_gathers of the updated pieces are left to step(), in the order the pieces
// were stepped: every rank issues the same collectives in the same order (a disk-homed chunk
// keeps only its updated piece until then, park_stepped in shard.cpp). Left to step(), as before:
// the last chunk, a chunk still in use, chunks backward never completed, gradients on disk. The
// logged norm is still every chunk's share, taken as each reduction settles.
void Gemini::set_updates_as_reduced(bool on) {
  MW_CHECK(op_ == 0 && !evaluating_ && (!on || deferred_),
           "Gemini::set_updates_as_reduced needs deferred updates, between steps");
  updates_as_reduced_ = on;
}

// Updates the oldest chunks whose reductions started, until `keep` are left.
void Gemini::update_reduced(size_t keep) {
  while (reduced_order_.size() > keep) {
    Chunk& c = *chunks_[static_cast<size_t>(reduced_order_.front())];
    reduced_order_.erase(reduced_order_.begin());
    if (reducing()) settle_reduction(c);
    if (c.gathered() && pinned(c)) continue;  // still in use: step() updates it
    if (sharded()) {
      if (!piece_grads_[static_cast<size_t>(c.index())].defined()) continue;
      update_piece(c, /*gather=*/false);
      if (c.on_nvme()) park_stepped(false);
    } else {
      if (!c.grad.defined()) continue;  // on disk: step() restores and updates it
      forget_grads_in_ram(c);
      struct Updating {  // finish_chunk steps it now rather than deferring it again
        bool& flag;
        ~Updating() { flag = false; }
      } updating{updating_};
      updating_ = true;
      finish_chunk(c);
    }
    iter_.updated_in_backward += keep > 0;  // not the last, at step()
    run_.updated_in_backward += keep > 0;
  }
}

void Gemini::forget_grads_in_ram(const Chunk& c) {
  grads_in_ram_.erase(std::remove(grads_in_ram_.begin(), grads_in_ram_.end(), c.index()),
                      grads_in_ram_.end());
}

void Gemini::set_gradient_reduction(GradientReduction reduction) {
  MW_CHECK(op_ == 0 && !evaluating_, "Gemini::set_gradient_reduction must be called between steps");
  MW_CHECK_T(InvalidArgument, deferred_, "Gemini under data parallel needs deferred updates");
  MW_CHECK_T(InvalidArgument,
             sharded()
                 ? reduction.reduce_scatter && reduction.all_gather && reduction.sum_over_ranks &&
                       (reduction.from_rank0 || !shards_parameters())
                 : static_cast<bool>(reduction.start),
             "Gemini: sharded optimizer states need reduce_scatter, all_gather and "
             "sum_over_ranks (and from_rank0 with sharded parameters); replicated chunks need "
             "start");
  reduction_ = std::move(reduction);
  reducing_.assign(chunks_.size(), nullptr);
}

void Gemini::settle_reductions() {
  if (!reducing()) return;
  for (auto& c : chunks_) {  // chunks the backward never completed start now, in chunk order
    if (reducing_[static_cast<size_t>(c->index())] || c->norm_taken) continue;
    if (c->grad_on_disk) restore_grad(*c);  // accumulated in an earlier micro-batch
    if (c->grad.defined()) start_reduction(*c);
  }
  for (auto& c : chunks_) settle_reduction(*c);
}

// Waits for the chunk's reduction (if one is in flight) and turns the sum into the mean and the
// norm's share; under sharded states the piece is copied out and the full buffer freed.
void Gemini::settle_reduction(Chunk& c) {
  std::function<void()> wait = std::move(reducing_[static_cast<size_t>(c.index())]);
  reducing_[static_cast<size_t>(c.index())] = nullptr;
  if (!wait) return;
  wait();           // throws the communicator's error (a timeout names the collective)
  if (sharded()) {  // Note [Sharded optimizer states]
    settle_piece(c);
    return;
  }
  ops::scale_(c.grad, reduction_.scale);  // on the buffer's device: a GPU's is not the host's
  take_norm_parts(c);
}

void Gemini::take_norm_parts(Chunk& c) {
  for (const ChunkMember& m : c.members()) {  // on the buffer's device (Note [Norm order])
    std::vector<double>& parts = norm_parts_[m.tensor];
    parts.clear();
    optim::append_block_squares(c.grad.narrow(0, m.offset, m.numel), parts);
  }
  c.norm_taken = true;
}

// Writes complete gradient buffers of disk-homed chunks to disk, oldest first, keeping the newest
// in RAM unless `all`.
void Gemini::spill_grads(bool all) {
  const size_t keep = all ? 0 : 1;
  size_t complete = 0;
  for (int ci : grads_in_ram_)
    if (chunks_[static_cast<size_t>(ci)]->grads_ready == 0) ++complete;
  for (size_t k = 0; k < grads_in_ram_.size() && complete > keep;) {
    Chunk& c = *chunks_[static_cast<size_t>(grads_in_ram_[k])];
    if (c.grads_ready != 0) {  // still receiving this backward's gradients
      ++k;
      continue;
    }
    // Note [Three tiers under data parallel]: the buffer is written once its reduction is done.
    // A sharded chunk's is then freed instead (settle_piece), which takes it off the list.
    if (reducing()) settle_reduction(c);
    --complete;
    if (!c.grad.defined()) continue;  // settle_piece freed it and took it off the list
    Spill s;
    s.chunk = c.index();
    s.buffer = std::move(c.grad);
    s.write = swap_->write(str("grad.", c.index()), s.buffer.raw_data(), c.nbytes());
    spills_.push_back(std::move(s));
    c.grad = Tensor();
    c.grad_on_disk = true;
    iter_.nvme_write_bytes += c.nbytes();
    run_.nvme_write_bytes += c.nbytes();
    grads_in_ram_.erase(grads_in_ram_.begin() + static_cast<std::ptrdiff_t>(k));
  }
}

// Frees the RAM of gradient buffers whose write is done (wait: all of them).
void Gemini::poll_spills(bool wait) {
  for (size_t k = 0; k < spills_.size();) {
    Spill& s = spills_[k];
    if (!wait && !s.write.done()) {
      ++k;
      continue;
    }
    s.write.wait();  // throws the IoError naming the file, offset and errno
    track_host(-s.buffer.nbytes());
    spills_.erase(spills_.begin() + static_cast<std::ptrdiff_t>(k));
  }
}

void Gemini::restore_grad(Chunk& c) {
  auto it = std::find_if(spills_.begin(), spills_.end(),
                         [&](const Spill& s) { return s.chunk == c.index(); });
  if (it != spills_.end()) {  // still in RAM: take it back unread
    it->write.wait();
    c.grad = std::move(it->buffer);
    spills_.erase(it);
  } else {
    c.grad = Tensor::zeros({grad_buffer_numel(c)}, DType::F32, Device::cpu());
    swap_->read(str("grad.", c.index()), c.grad.raw_data()).wait();
    iter_.nvme_read_bytes += c.nbytes();
    run_.nvme_read_bytes += c.nbytes();
    track_host(c.grad.nbytes());
  }
  c.grad_on_disk = false;
  grads_in_ram_.push_back(c.index());
}

double Gemini::grad_norm() {
  MW_CHECK(deferred_, "Gemini::grad_norm needs deferred updates (set_deferred_updates)");
  refuse_missing_gradients();
  settle_reductions();  // Note [Gemini under data parallel]
  if (sharded()) return sharded_norm();
  // A chunk that did not complete (a member without a gradient) gives its share now.
  for (auto& c : chunks_)
    if ((c->grad.defined() || c->grad_on_disk) && !c->norm_taken) {
      if (c->grad_on_disk) restore_grad(*c);
      take_norm_parts(*c);
    }
  double sum_sq = 0;
  for (const std::vector<double>& parts : norm_parts_) sum_sq = optim::add_in_order(sum_sq, parts);
  return std::sqrt(sum_sq);
}

void Gemini::step_deferred() {
  refuse_missing_gradients();
  update_reduced(0);  // Note [Updates as reductions complete]
  settle_reductions();
  std::vector<int> order;
  for (auto& c : chunks_)
    if ((sharded() ? piece_grads_[static_cast<size_t>(c->index())] : c->grad).defined() &&
        !c->on_nvme())
      order.push_back(c->index());
  for (auto it = grads_in_ram_.rbegin(); it != grads_in_ram_.rend(); ++it) order.push_back(*it);
  for (auto& c : chunks_)  // sharded states: disk-homed chunks' pieces (their buffers are freed)
    if (c->grad_on_disk ||
        (sharded() && c->on_nvme() && piece_grads_[static_cast<size_t>(c->index())].defined()))
      order.push_back(c->index());
  updating_ = true;
  struct Done {  // on every exit path
    Gemini& g;
    ~Done() {
      g.updating_ = false;
      for (auto& c : g.chunks_) c->norm_taken = false;
      for (auto& parts : g.norm_parts_) parts.clear();
    }
  } done{*this};
  for (int ci : order) {
    Chunk& c = *chunks_[static_cast<size_t>(ci)];
    if (c.grad_on_disk) restore_grad(c);
    forget_grads_in_ram(c);
    finish_chunk(c);
  }
  start_piece_gathers(true);  // Note [Sharded optimizer states]
  finish_gather(true);
  poll_spills(true);
  drop_kept_pieces();  // Note [Pieces on disk]
}

void Gemini::begin_eval() {
  MW_CHECK(!evaluating_ && op_ == 0 && pending_.empty(),
           "Gemini::begin_eval must be called between steps");
  evaluating_ = true;
  saved_iter_ = iter_;
  iter_ = GeminiStats();
  iter_.host_chunk_peak_bytes = host_chunk_bytes_;
  iter_.gathered_peak_bytes = gathered_bytes_;
  if (!recording_ && options_.policy != Policy::kStatic && !eval_next_) {
    std::vector<TraceOp> forward;
    for (size_t t = 0; t < trace_keys_.size() && !trace_keys_[t].second; ++t)
      forward.push_back(trace_[t]);
    eval_ops_ = static_cast<int64_t>(forward.size());
    eval_next_ = std::make_unique<NextUse>(forward, static_cast<int>(chunks_.size()));
  }
  // Nothing to follow before the first step, or under static: minimal residency.
  off_plan_ = recording_ || options_.policy == Policy::kStatic;
}

void Gemini::end_eval() {
  if (!evaluating_) return;
  for (int c : std::vector<int>(gathered_)) release(*chunks_[static_cast<size_t>(c)], false);
  settle_piece_reads();  // Note [Pieces on disk]
  for (size_t i = 0; i < in_use_.size(); ++i)
    if (in_use_[i] > 0) {  // a forward that threw
      in_use_[i] = 0;
      states_.set(i, TensorState::kHold);
    }
  op_ = 0;
  off_plan_ = false;
  evaluating_ = false;
  eval_stats_ = iter_;
  iter_ = saved_iter_;
}

}  // namespace mw::gemini
