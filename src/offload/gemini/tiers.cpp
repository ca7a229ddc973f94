// Gemini's three tiers (Note [Three tiers]): the host budget, disk-homed chunks on their way to and
// from disk, and the prefetch of the next ops' chunks (Note [Prefetch]). gemini.cpp has the rest.
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "core/allocator.h"
#include "core/cuda_stream.h"
#include "core/numbers.h"
#include "offload/gemini/gemini.h"
#include "offload/io/scratch_dir.h"

namespace mw::gemini {

namespace {
double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }
}  // namespace

// Note [Three tiers]: with a host budget, chunks and optimizer states share host RAM; what does not
// fit goes to disk. Adam states go first (they are two thirds of the model data and are streamed
// through a fixed window by NvmeAdamStates), then parameter chunks, last chunk first, are homed on
// disk (Note [NVMe-homed chunks], chunk.h). Kept free for transients: the gradient buffers of the
// chunk being reduced and of the first chunk, which completes last in backward, and a chunk on its
// way home for its update, which may be either: 2 x the largest chunk + the next. With deferred
// updates (--grad-accum, --grad-clip, fp16) step() brings a disk-homed chunk home while the one
// before it still waits for its update and write-back, each with its gradient: 2 x (the largest +
// the next). Measured (6 blocks of width 256, GPT-2's vocabulary, --grad-accum 2, both chunks on
// disk): 136 MiB + 8 of NVMe slots at step(), the embedding's and a block chunk's copy and
// gradient, against 125.2 planned from 2 x the largest + the next. Until session 22 the reserve
// was 3 x the largest chunk: for GPT-2 medium's 196 MiB embedding chunk beside 32 MiB block chunks,
// 589 MiB against 425 now (its transients measured 216-248 MiB). The budget plans
// the homes; transients are reported (host_chunk_peak_bytes), not enforced, but backward keeps them
// within the reserve: a chunk whose update waits on the updater thread (its Adam states stream from
// disk) holds its gradient buffer until the update ran, so when the disk is slower than backward
// those buffers pile up, and backward waits for the oldest update once more than one is queued
// (disk-homed chunks: pending_, finish_chunk; RAM-homed ones: throttle_updates). Measured (5 blocks
// of width 512, vocabulary 5000, B2 T16, static 1/1, --chunk-size 20000, --host-capacity 96MiB,
// --nvme-window 1MiB): the host peak 112 MiB against 100 planned, with five gradient buffers
// queued, before the throttle.
//
// Note [Three tiers under data parallel]: under mpirun every rank plans its own tiers from its own
// share of the model (TierChunk: a sharded chunk's home is its piece, and the Adam states are
// those of this rank's pieces) against its own --host-capacity, with its own files (a private
// directory, or files named by process id in a shared --nvme-dir).
//  - A sharded chunk's piece goes to disk only after every replicated chunk (Note [Pieces on
//    disk], shard.cpp).
//  - Construction: a chunk homed on disk takes rank 0's values (a broadcast) as it is filled,
//    before it is written; the chunks that stay in memory are broadcast after construction.
//  - Backward: a disk-homed chunk's complete gradient buffer is written only after its reduction:
//    the spill waits for it, then takes the mean and the norm's share (stage 0), or copies out
//    this rank's piece and frees the buffer, leaving nothing to write (stages 2-3). That wait
//    exposes the collective, but every rank waits for the same reductions in the same order, so
//    none waits for one the others have not started.
//  - Update: stage 0 steps the chunk's RAM copy as one process does; stage 2 reads the chunk into
//    RAM and steps this rank's piece; at the step every rank's updated piece is all_gathered into
//    a RAM copy, which is written back and freed. A piece stepped in backward (Note [Updates as
//    reductions complete]) waits for the step on disk, the chunk's copy freed unwritten
//    (park_stepped).
//  - Saving: rank 0 reads its disk-homed chunks one at a time while sharded chunks are gathered
//    collectively (stream_sharded).
void Gemini::plan_tiers(optim::HybridAdamOptions& adam) {
  const int64_t cap = options_.host_capacity_bytes;
  std::vector<TierChunk> tiers;
  int64_t largest = 0;
  for (const auto& c : chunks_) {  // this rank's share (Note [Sharded optimizer states])
    const size_t k = static_cast<size_t>(c->index());
    const int64_t piece_bytes = piece(*c).stride * 4;
    tiers.push_back({c->nbytes(), shard_params_[k] ? piece_bytes : c->nbytes(), 2 * piece_bytes,
                     params_off_[k], optim_on_host_[k], shard_params_[k]});
    tiers.back().sharded_states = sharded();
    if (options_.keeps_gradients_until_step && optim_on_host_[k]) {
      tiers.back().kept_grad_bytes = piece_bytes;
      tiers.back().kept_on_disk = sharded();
    }
    largest = std::max(largest, c->nbytes());
  }
  const TierPlan plan = gemini::plan_tiers(tiers, cap, adam.nvme.fraction, adam.nvme.window_bytes,
                                           adam.nvme.slice_numel);
  adam.nvme.fraction = plan.nvme_fraction;
  std::vector<int> to_disk;
  for (int c = static_cast<int>(chunks_.size()) - 1; c >= 0; --c)
    if (plan.on_disk[static_cast<size_t>(c)]) to_disk.push_back(c);
  const int64_t disk_bytes = plan.disk_chunk_bytes;
  // A budget means RSS: the host cache keeps at most one chunk's worth of freed blocks (gradient
  // buffers and update copies recur every step at chunk sizes) instead of up to 4 GiB.
  set_host_max_cached_bytes(largest);
  // On sim the device's pages are host RAM too: no overflow pages kept beyond use (Note [Sim
  // arena]; measured: GPT-2 medium B2 T128 on sim:768MiB, --host-capacity 1GiB, peak RSS 1778 and
  // 1810 MiB with them against 1760 and 1728).
  if (options_.device.is_sim()) set_sim_max_cached_bytes(options_.device.index, 0);
  if (to_disk.empty()) return;
  const bool private_dir = options_.nvme_dir.empty();
  const std::string dir = private_dir ? io::make_private_dir("gemini") : options_.nvme_dir;
  try {
    engine_ = io::IoEngine::create(adam.nvme.io);
    io::SwapOptions swap_options;
    swap_options.file_stem = "memwall-chunks";
    swap_ = std::make_unique<io::SwapSpace>(std::vector<std::string>{dir}, *engine_, swap_options);
  } catch (...) {
    if (private_dir) ::rmdir(dir.c_str());
    throw;
  }
  // Note [NVMe files] (optim/nvme_states.h): nothing stays behind, whatever way the process ends.
  for (const std::string& path : swap_->file_paths()) ::unlink(path.c_str());
  if (private_dir) ::rmdir(dir.c_str());
  for (int c : to_disk) to_disk_[static_cast<size_t>(c)] = true;  // written once filled
  size_t pieces = 0;                                              // Note [Pieces on disk]
  for (int c : to_disk) pieces += shard_params_[static_cast<size_t>(c)];
  if (options_.verbose)
    std::printf(
        "Gemini three tiers: host budget %.0f MiB: %zu of %zu chunks (%.0f MiB%s) homed on "
        "disk%s, Adam states %s\n",
        mib(cap), to_disk.size(), chunks_.size(), mib(disk_bytes),
        pieces > 0 ? str(", ", pieces, " of them this rank's pieces of sharded chunks").c_str()
                   : "",
        private_dir ? "" : str(" in ", dir).c_str(),
        adam.nvme.fraction > 0 ? "on disk (NVMe offload)" : "in RAM");
}

std::string Gemini::describe() const {
  int64_t host = 0, dev = 0, optim_host = 0;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const Chunk& k = *chunks_[c];  // a sharded chunk homes this rank's piece
    if (!to_disk_[c])
      (params_off_[c] ? host : dev) += k.sharded() ? k.shard().nbytes() : k.nbytes();
    if (optim_on_host_[c]) optim_host += chunks_[c]->nbytes();
  }
  std::string s =
      str("Gemini ", policy_name(options_.policy), ": ", chunks_.size(), " chunks of up to ",
          options_.chunk_numel > 0 ? options_.chunk_numel : search_.chunk_numel, " elements on ",
          options_.device.str(), " | params homed on host ");
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "%.1f MiB, on disk %.1f MiB, on device %.1f MiB | Adam states off the device for "
                "%.1f MiB of params",
                mib(host), mib(nvme_chunk_bytes()), mib(dev), mib(optim_host));
  s += buf;
  if (shards_parameters()) {
    int64_t n = 0;
    for (const auto& c : chunks_) n += c->sharded();
    s += str(" | ", n, " chunks (", format_fixed(mib(sharded_numel_ * 4), 1),
             " MiB) sharded across ", options_.shard_ranks, " ranks: this rank homes its ",
             format_fixed(mib(sharded_param_bytes_), 1), " MiB of them");
  }
  if (options_.policy == Policy::kConst)
    s += str(" | budget ", static_cast<long long>(mib(options_.const_budget_bytes)), " MiB");
  if (options_.copy_worker)  // Note [Copy worker]
    s += options_.device.is_cuda() ? " | copy stream" : " | copy worker";
  return s;
}

void Gemini::with_parameters_readable(const std::function<void()>& fn) {
  MW_CHECK(pending_.empty() && gathered_.empty(),
           "with_parameters_readable must be called between steps");
  std::vector<Chunk*> read;
  struct Drop {  // frees the RAM copies on every exit path
    std::vector<Chunk*>& chunks;
    ~Drop() {
      for (Chunk* c : chunks) c->drop_ram();
    }
  } drop{read};
  std::vector<Chunk*> gathered;
  struct Release {  // Note [Sharded parameters]: every rank's pieces, for the call only
    std::vector<Chunk*>& chunks;
    ~Release() {
      for (Chunk* c : chunks) c->release_copy();
    }
  } release{gathered};
  for (auto& c : chunks_)
    if (c->sharded()) {
      gather_shard(*c, Device::cpu());
      gathered.push_back(c.get());
    }
  for (auto& c : chunks_)
    if (c->on_nvme()) {
      c->bring_home_to_ram();
      read.push_back(c.get());
      swap_->read(str("chunk.", c->index()), c->storage()->data()).wait();
    }
  fn();
}

void Gemini::with_parameters_streamed(const std::function<void(const Touch& touch)>& fn) {
  MW_CHECK(pending_.empty() && gathered_.empty(),
           "with_parameters_streamed must be called between steps");
  Chunk* current = nullptr;
  struct Drop {  // frees the RAM copy on every exit path
    Chunk*& chunk;
    ~Drop() {
      if (chunk) chunk->drop_ram();
    }
  } drop{current};
  auto from_disk = [&](Chunk& c) {  // one disk-homed chunk in RAM at a time
    if (!c.on_nvme() || &c == current) return;
    if (current) current->drop_ram();
    current = nullptr;
    c.bring_home_to_ram();
    current = &c;
    swap_->read(str("chunk.", c.index()), c.storage()->data()).wait();
  };
  if (shards_parameters()) return stream_sharded(fn, from_disk);  // Note [Sharded parameters]
  fn([&](const std::string& name) {
    auto it = index_of_.find(name);
    MW_CHECK_T(InvalidArgument, it != index_of_.end(), "Gemini: no parameter named '", name, "'");
    from_disk(*chunks_[chunk_of_[it->second]]);
  });
}

int64_t Gemini::nvme_chunk_bytes() const {
  int64_t n = 0;
  for (auto& c : chunks_) {
    if (c->on_nvme()) n += c->nbytes();
    if (c->shard_on_nvme()) n += c->shard().nbytes();  // Note [Pieces on disk]
  }
  return n;
}

// Note [Prefetch]: with a plan, the chunks of the next two ops are gathered while op t computes,
// when the room that both periods' budgets leave allows it without evicting anything: disk-homed
// chunks are read into their device copies (io_uring does the work; no thread of ours), and
// RAM-homed ones copied by the copy worker when there is one (Note [Copy worker]; without it
// their gather is a memcpy on the compute thread when the op starts). The op that needs a chunk
// waits for its bytes (prefetch_wait_ms); an eviction of an in-flight chunk waits too.
void Gemini::prefetch_after(int64_t t) {
  if (prefetch_shards_ && !recording_ && !off_plan_) prefetch_shards(t);  // Note [Shard prefetch]
  if (!planned() || (!swap_ && !options_.copy_worker)) return;
  const int64_t n = plan_ops();
  const AllocatorStats st = allocator_for(options_.device).stats();
  int64_t room = avail_[static_cast<size_t>(t)];
  for (int64_t u = t + 1; u < std::min(n, t + 3); ++u) {
    room = std::min(room, avail_[static_cast<size_t>(u)]);
    for (int c : trace_[static_cast<size_t>(u)].chunks) {
      Chunk& chunk = *chunks_[static_cast<size_t>(c)];
      if (chunk.gathered() || chunk.sharded() || !(chunk.on_nvme() || options_.copy_worker))
        continue;
      // Note [16-bit copies]: in the dtype op u's use will want.
      const DType dtype = prefetch_dtype(chunk, t, u);
      const int64_t bytes = chunk.copy_nbytes(dtype);
      if (gathered_bytes_ + bytes > room) return;
      if (st.capacity_bytes > 0 &&
          allocator_for(options_.device).stats().current_bytes + bytes > st.capacity_bytes)
        return;
      const double t0 = now_us();
      try {
        start_prefetch(chunk, dtype);
      } catch (const OutOfMemory&) {  // optional: the op gathers it, making room first (cuda's
        return;                       // capacity is not what it has free; pinned memory runs out)
      }
      gathered_.push_back(c);
      track_gathered(chunk.copy_nbytes());
      ++iter_.gathers;
      ++run_.gathers;
      ++iter_.prefetches;
      ++run_.prefetches;
      if (trace_out_) trace_out_->slice(str("prefetch chunk ", c), "move", t0, now_us() - t0, 1);
    }
  }
}

// The read or copy of one chunk gathered ahead (Note [Prefetch]), with its traffic.
void Gemini::start_prefetch(Chunk& c, DType dtype) {
  if (c.on_nvme()) {
    void* bytes = c.gather_uninitialized(options_.device);
    try {  // a failed start (cuda: no pinned buffer) leaves the chunk as it was
      if (refuses_prefetches())
        throw OutOfMemory("MW_GEMINI_PREFETCH_OOM=1 (the read's buffer)", c.nbytes(), 0, 0);
      inflight_[c.index()] = start_disk_read(c, bytes);
    } catch (...) {
      inflight_.erase(c.index());
      c.release_copy();
      throw;
    }
    iter_.nvme_read_bytes += c.nbytes();
    run_.nvme_read_bytes += c.nbytes();
    return;
  }
  if (!copier_) copier_ = std::make_unique<CopyWorker>(options_.device);
  const Chunk::GatherBytes b = c.gather_deferred(options_.device, dtype);
  try {  // a failed start (cuda: no pinned memory) leaves the chunk as it was
    if (refuses_prefetches())
      throw OutOfMemory("MW_GEMINI_PREFETCH_OOM=1 (the copy's staging)", c.copy_nbytes(), 0, 0);
    inflight_[c.index()].copy = copier_->copy(b.device, c.copy_nbytes(), [&c, this](void* to) {
      // on cuda the staging is filled on this thread (Note [Copy worker]): the pool's work
      c.fill_copy(to, options_.device.is_cuda());
    });
  } catch (...) {
    inflight_.erase(c.index());
    c.release_copy();
    throw;
  }
  iter_.h2d_bytes += c.copy_nbytes();
  run_.h2d_bytes += c.copy_nbytes();
}

// Note [Disk reads through the host]: the io engine reads with O_DIRECT, which lands in memory the
// kernel can reach: sim's device memory is host memory, so there a disk-homed chunk is read
// straight into its device copy; a CUDA device's is not, so there the read goes into a host buffer
// (pinned, for a fast copy) and is copied to the device when the op waits for it. The buffer lives
// as long as the read: one chunk per read in flight (up to the next two ops' chunks with a plan),
// on top of the host budget's homes; it is counted as host->device traffic too.
Gemini::DiskRead Gemini::start_disk_read(Chunk& c, void* device_bytes) {
  DiskRead r;
  const std::string key = str("chunk.", c.index());
  if (!options_.device.is_cuda() && !options_.disk_reads_through_host) {
    r.io = swap_->read(key, device_bytes);
    return r;
  }
  const int64_t n = (c.nbytes() + 4095) / 4096 * 4096;  // O_DIRECT reads whole blocks
  r.bounce = options_.device.is_cuda() ? PinnedHostBuffer(n) : AlignedBuffer(n);
  r.device_bytes = device_bytes;
  r.io = swap_->read(key, r.bounce.data());
  return r;
}

void Gemini::finish_disk_read(Chunk& c, DiskRead& read) {
  read.copy.wait();  // a RAM-homed chunk's copy (Note [Copy worker]): the device sees it
  read.io.wait();    // throws the IoError naming the file, offset and errno
  if (!read.device_bytes) return;
  copy_bytes(read.device_bytes, options_.device, read.bounce.data(), Device::cpu(), c.nbytes());
  iter_.h2d_bytes += c.nbytes();
  run_.h2d_bytes += c.nbytes();
}

// Waits for bytes in flight into a gathered chunk (a disk read, an all_gather) and returns the
// milliseconds waited; on failure the copy is given up (the chunk no longer gathered) and the
// error rethrown.
double Gemini::await_copy(Chunk& c, const std::function<void()>& wait) {
  const auto w0 = std::chrono::steady_clock::now();
  try {
    wait();
  } catch (...) {
    const int64_t copy_bytes = c.copy_nbytes();  // f32, or a 16-bit all_gather's
    c.release_copy();
    forget_gathered(c, copy_bytes);
    throw;
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count();
}

void Gemini::wait_inflight(Chunk& c) {
  if (c.sharded()) {  // Note [Shard prefetch], Note [Memory pressure]
    join_shard_gather(c);
    return unspill_shard(c);
  }
  auto it = inflight_.find(c.index());
  if (it == inflight_.end()) return;
  DiskRead read = std::move(it->second);
  inflight_.erase(it);
  const double t0 = now_us();
  const double ms = await_copy(c, [&] { finish_disk_read(c, read); });
  iter_.prefetch_wait_ms += ms;
  run_.prefetch_wait_ms += ms;
  if (trace_out_) trace_out_->slice(str("prefetch wait chunk ", c.index()), "wait", t0, ms * 1e3);
}

// Note [NVMe-homed chunks]: RAM bytes for the update, from the device copy when it is still there.
void Gemini::bring_home(Chunk& c) {
  wait_inflight(c);
  if (c.bring_home_to_ram()) {
    forget_gathered(c, c.nbytes());
  } else {
    swap_->read(str("chunk.", c.index()), c.storage()->data()).wait();
    iter_.nvme_read_bytes += c.nbytes();
    run_.nvme_read_bytes += c.nbytes();
  }
  track_host(c.nbytes());
}

// A stepped disk-homed chunk's (or piece's, Note [Pieces on disk]) write to its blob.
io::IoHandle Gemini::start_write_back(const PendingWrite& w) {
  const Chunk& c = *chunks_[static_cast<size_t>(w.chunk)];
  if (w.piece)
    return swap_->write(str("shard.", w.chunk), c.shard().raw_data(), c.shard().nbytes());
  return swap_->write(str("chunk.", w.chunk), c.storage()->data(), c.nbytes());
}

int64_t Gemini::write_back_bytes(const PendingWrite& w) const {
  const Chunk& c = *chunks_[static_cast<size_t>(w.chunk)];
  return w.piece ? c.shard().nbytes() : c.nbytes();
}

void Gemini::drop_written_back(const PendingWrite& w) {
  Chunk& c = *chunks_[static_cast<size_t>(w.chunk)];
  const int64_t n = write_back_bytes(w);
  if (w.piece)
    c.drop_shard_ram();
  else
    c.drop_ram();
  track_host(-n);
}

// A stepped disk-homed chunk goes back to disk once its update ran, and frees its RAM once written.
// block: wait for both; else only move on what is done. Returns true when pending_[k] is finished
// (and erased).
bool Gemini::settle_pending(size_t k, bool block) {
  PendingWrite& w = pending_[k];
  if (!w.writing) {
    if (block)
      adam_->wait_update(w.update_ticket);
    else if (!adam_->update_done(w.update_ticket))
      return false;
    w.write = start_write_back(w);
    w.writing = true;
    iter_.nvme_write_bytes += write_back_bytes(w);
    run_.nvme_write_bytes += write_back_bytes(w);
  }
  if (!block && !w.write.done()) return false;
  w.write.wait();  // throws the IoError naming the file, offset and errno
  drop_written_back(w);
  pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(k));
  return true;
}

void Gemini::throttle_updates(uint64_t ticket) {
  if (ticket == 0 || options_.host_capacity_bytes <= 0) return;
  queued_updates_.push_back(ticket);
  while (!queued_updates_.empty() && adam_->update_done(queued_updates_.front()))
    queued_updates_.pop_front();
  if (queued_updates_.size() <= 1) return;
  const double w0 = now_us();
  for (; queued_updates_.size() > 1; queued_updates_.pop_front())
    adam_->wait_update(queued_updates_.front());
  if (trace_out_) trace_out_->slice("wait for chunk updates", "wait", w0, now_us() - w0);
}

void Gemini::poll_pending(bool wait) {
  for (size_t k = 0; k < pending_.size();)
    if (!settle_pending(k, wait)) ++k;
}

}  // namespace mw::gemini
