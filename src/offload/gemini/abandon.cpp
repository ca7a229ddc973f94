// Gemini::abandon_step: closing an iteration that an exception left open; skip_step, a step
// dropped on purpose.
//
// Note [Abandoning a step]: an IoError (a chunk move, a state write), an OutOfMemory or a stop
// request can escape a forward, a backward or step() with the iteration half done: chunks
// gathered, reads in flight, gradients half collected, some chunks stepped and on their way back
// to disk. abandon_step() closes it without stepping anything more:
//  - every update already handed to HybridAdam is waited for (its failure is not thrown again:
//    the caller already holds the first one), so each chunk is stepped whole or not at all, and
//    its Adam states per slice (Note [NVMe failure guarantee], optim/nvme_states.h);
//  - a stepped disk-homed chunk is written back; when that write fails too, its RAM bytes become
//    its home (Chunk::keep_in_ram), so the new p stays with its new m and v;
//  - a disk-homed chunk (or piece, Note [Pieces on disk]) read into RAM for an update that never
//    ran drops those bytes (its blob is still the truth), and every gathered copy is released;
//  - collected gradients and autograd's own are dropped, with deferred updates' spilled and
//    accumulated gradient buffers (Note [Deferred updates]).
// When no chunk had been stepped (a failure in forward, or in backward before the first chunk's
// gradients were all in), the model is exactly as before the step and training may go on (a
// half-recorded warmup is recorded again). Otherwise the model holds a step applied chunk by chunk
// (docs/gemini.md, "Failure guarantee"): with_parameters_readable() and with_parameters_streamed()
// work, so it can be inspected or saved, but every further op and step() is refused: training
// goes on from a checkpoint.
// tests/faults/fault_sweep_test.cpp fails every request of a three-tier step in turn.
#include "core/error.h"
#include "offload/gemini/gemini.h"

namespace mw::gemini {

void Gemini::refuse_if_failed() const {
  MW_CHECK(!failed_,
           "Gemini: an earlier step failed after some chunks were stepped, so the model holds a "
           "partially applied step (Note [Abandoning a step]); restart from the last checkpoint");
}

void Gemini::skip_step() {
  MW_CHECK(deferred_ && stepped_chunks_ == 0 && !evaluating_,
           "Gemini::skip_step needs deferred updates, between the backwards and step()");
  abandon_step();  // nothing was stepped: the model is as before the step
}

// Stepped disk-homed chunks and pieces: their update, then their write-back; where that fails,
// the RAM bytes become the home.
void Gemini::write_back_stepped() {
  for (PendingWrite& w : pending_) {
    Chunk& c = *chunks_[static_cast<size_t>(w.chunk)];
    try {
      adam_->wait_update(w.update_ticket);
    } catch (const Error&) {  // the state store failed: p was stepped slice by slice, kept below
    }
    bool written = false;
    try {
      if (!w.writing) w.write = start_write_back(w);
      w.write.wait();
      written = true;
    } catch (const Error&) {
    }
    if (written) {
      drop_written_back(w);
    } else if (w.piece) {  // Note [Pieces on disk]: the RAM bytes are newer than the blob
      c.keep_shard_in_ram();
    } else {
      c.keep_in_ram();
    }
  }
  pending_.clear();
}

void Gemini::abandon_step() {
  failed_ = failed_ || stepped_chunks_ > 0;
  // Reductions in flight keep their buffers alive in the communicator; nothing waits for them.
  for (auto& wait : reducing_) wait = nullptr;
  for (auto& g : piece_grads_) g = Tensor();  // Note [Sharded optimizer states]
  for (auto& done : reduced_) done = nullptr;
  gathering_.clear();
  reduced_order_.clear();
  for (const Stepping& s : stepping_) {     // stepped disk-homed chunks in RAM go home as below
    if (s.piece.defined()) s.write.join();  // never free a piece a write is reading
    if (s.piece.defined() || s.on_disk) continue;
    if (chunks_[static_cast<size_t>(s.chunk)]->on_nvme())
      pending_.push_back({s.chunk, s.ticket, io::IoHandle(), false});
  }
  stepping_.clear();
  for (auto& [c, read] : inflight_) read.join();  // never free bytes a read is filling
  for (auto& [c, wait] : shard_inflight_) try {   // or an all_gather (Note [Shard prefetch])
      wait();
    } catch (...) {
    }
  shard_inflight_.clear();
  inflight_.clear();
  write_back_stepped();
  queued_updates_.clear();  // flush() below settles them
  try {
    adam_->flush();  // updates of RAM-homed chunks with states on disk
  } catch (const Error&) {
  }
  // Deferred updates (Note [Deferred updates]): gradient buffers on their way to disk.
  for (Spill& s : spills_) {
    s.write.join();
    track_host(-s.buffer.nbytes());  // counted when made, as poll_spills uncounts them
  }
  spills_.clear();
  grads_in_ram_.clear();
  for (auto& parts : norm_parts_) parts.clear();
  settle_piece_reads();  // Note [Pieces on disk]
  for (auto& c : chunks_) {
    c->grad_on_disk = false;
    c->norm_taken = false;
    if (c->gathered()) release(*c, false);
    // Read into RAM for an update that never ran: the blob on disk is still the truth.
    if (c->on_nvme() && !c->storage()->is_released()) {
      c->drop_ram();
      track_host(-c->nbytes());
    }
    c->piece_kept = false;  // Note [Pieces on disk]
    if (c->shard_on_nvme() && c->shard_in_ram()) {
      c->drop_shard_ram();
      track_host(-c->shard().nbytes());
    }
    if (c->grad.defined() && c->grad.device().is_cpu()) track_host(-c->grad.nbytes());
    c->grad = Tensor();
    c->grads_ready = 0;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    set_grad(params_[i], Tensor());
    in_use_[i] = 0;
  }
  begin_backward();  // Note [Deferred updates]: the next backward counts from nothing
  gathered_.clear();
  gathered_bytes_ = 0;
  op_ = 0;
  off_plan_ = false;
  stepped_chunks_ = 0;
  if (recording_) {  // a half-recorded warmup: the next iteration records again
    trace_.clear();
    trace_keys_.clear();
    nonmodel_.clear();
    period_nonmodel_bytes_ = 0;
  }
}

}  // namespace mw::gemini
