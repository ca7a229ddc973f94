// Note [Memory pressure] (core/allocator.h) for Gemini: what a step's non-model memory takes
// beyond what the warmup measured is taken back from chunk copies the current op does not need.
//
// The auto plan (Note [OPT eviction]) budgets each period with the non-model memory the warmup
// measured in it. That is a measurement of one step, not a bound: with --offload-activations the
// offloader's copies to the host and its prefetches back finish at other moments in each step, so
// a later step can hold more activations on the device at the same op than the warmup did. On
// GPT-2 (4 layers, C256, B8 T64, --offload-activations) at the capacity where static cpu placement
// fits, auto ran out of memory in 6 of 8 runs (session 24). Static cpu placement holds no chunk
// beyond the current op's, so the promise "auto never fails where static cpu fits" needs auto to
// fall back to the same minimal residency when memory runs short: an allocation the device refuses
// makes Gemini release the gathered chunks that no running op pins, farthest next use first, and
// the allocation is tried again. Releasing a copy costs nothing but a later gather (parameters do
// not change during forward and backward), and the bits of the run are unchanged.
//
// The handler acts only on the compute thread during forward and backward, from an iteration's
// first op to step(), and never inside Gemini's own hooks (PressurePause: gathers make their own
// room, and gradient buffers, updates and the deferred pass keep their OutOfMemory). Other threads
// (the offloader's worker, whose prefetches are dropped when they do not fit) see the allocator's
// OutOfMemory as before.
//
// A sharded chunk is not released for pressure: gathering it again is an all_gather, a collective
// that every rank would have to join, and memory pressure is one rank's. The gathered sharded
// chunk no running op pins is the next op's, all_gathered ahead (Note [Shard prefetch]), which
// every rank decided after the warmup from the warmup's non-model memory. So its copy goes to the
// host instead (spill_shard: its all_gather completed first, then moved; it stays gathered on
// every rank), and the op that needs it moves it back (unspill_shard), making room as a gather
// does. Only that rank moves bytes; the collectives are unchanged, and so are the bits. The
// prefetch itself is allocated when the op before it starts, after that op's room was made; a rank
// whose device refuses it even then gathers it into RAM, as if spilled at once (every rank still
// starts the same all_gather: the refusal comes before it), and its op moves it to the device.
// Until session 36 that rank stopped with OutOfMemory; no sweep or test had met one, so
// MW_GEMINI_PREFETCH_OOM=1 (tests) refuses every prefetch on the device as a full one would.
// Under NCCL a RAM-homed copy's all_gather is staged through the device (Note [Staged
// collectives]), which needs that room too: there the run still stops with OutOfMemory.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/allocator.h"
#include "offload/gemini/gemini.h"

namespace mw::gemini {

// Note [Non-model memory]: the warmup measures, for each period between two ops, the most device
// memory that was not chunks. A period is cut into intervals at every change of the chunk bytes on
// the device (a gather, a release); within an interval the chunk bytes are constant, so the
// allocator's peak over the interval minus them is exactly its non-model peak. The period's
// reserve is the largest over its intervals. The allocator's window watermark measures them, so
// its run peak (the JSON log's device_peak_bytes, the report) still covers the warmup.
void Gemini::close_interval() {
  if (!recording_ || evaluating_ || !samples_nonmodel()) return;
  Allocator& a = allocator_for(options_.device);
  const int64_t peak = a.stats().window_peak_bytes;
  a.reset_window_peak();
  period_nonmodel_bytes_ = std::max(period_nonmodel_bytes_, peak - device_model_bytes());
}

void Gemini::sample_nonmodel() {
  if (!recording_ || evaluating_ || !samples_nonmodel()) return;
  close_interval();
  if (op_ > 0) nonmodel_.push_back(std::max<int64_t>(0, period_nonmodel_bytes_));
  period_nonmodel_bytes_ = 0;
}

void Gemini::install_pressure_handler() {
  std::weak_ptr<char> alive = alive_;
  allocator_for(options_.device).set_pressure_handler([this, alive](int64_t nbytes) {
    if (alive.expired() || !pressure_armed_ || std::this_thread::get_id() != compute_thread_)
      return false;
    return relieve_pressure(nbytes);
  });
}

void Gemini::remove_pressure_handler() { allocator_for(options_.device).set_pressure_handler({}); }

void Gemini::arm_pressure(bool armed) {
  if (armed) compute_thread_ = std::this_thread::get_id();  // first: never armed for another
  pressure_armed_ = armed;
}

bool Gemini::relieve_pressure(int64_t nbytes) {
  std::vector<int> candidates;
  for (int c : gathered_)  // a sharded copy already on the host frees nothing more
    if (!pinned(*chunks_[static_cast<size_t>(c)]) &&
        std::find(spilled_.begin(), spilled_.end(), c) == spilled_.end())
      candidates.push_back(c);
  if (candidates.empty()) return false;
  if (planned()) {  // farthest next use first, as OPT would (Note [OPT eviction])
    const int64_t t = op_ - 1;
    std::stable_sort(candidates.begin(), candidates.end(), [&](int a, int b) {
      return plan_next().after(a, t) > plan_next().after(b, t);
    });
  }
  const PressurePause pause(*this, pressure_armed_);  // release() frees, waits, never allocates
  int64_t freed = 0;
  for (int c : candidates) {
    if (freed >= nbytes) break;
    Chunk& chunk = *chunks_[static_cast<size_t>(c)];
    freed += chunk.copy_nbytes();
    if (chunk.sharded())
      spill_shard(chunk);
    else
      release(chunk, true);
    ++iter_.pressure_evictions;
    ++run_.pressure_evictions;
  }
  return true;
}

// The device's stats after room for `bytes` more was made where it was short: copies no running
// op pins go (Note [Memory pressure]). The caller sees whether that sufficed.
AllocatorStats Gemini::make_device_room(int64_t bytes) {
  Allocator& a = allocator_for(options_.device);
  const AllocatorStats st = a.stats();
  const int64_t short_by = st.capacity_bytes > 0 ? st.current_bytes + bytes - st.capacity_bytes : 0;
  return short_by > 0 && relieve_pressure(short_by) ? a.stats() : st;
}

bool Gemini::refuses_prefetches() {
  static const bool refuse = [] {
    const char* env = std::getenv("MW_GEMINI_PREFETCH_OOM");
    return env != nullptr && std::string(env) == "1";
  }();
  return refuse;
}

std::function<void()> Gemini::start_prefetch_gather(Chunk& c, int64_t op, DType dtype) {
  std::function<void()> wait;
  try {
    if (refuses_prefetches())
      throw OutOfMemory("MW_GEMINI_PREFETCH_OOM=1", c.copy_nbytes(dtype), 0, 0);
    wait = start_shard_gather(c, options_.device, op, dtype);
  } catch (const OutOfMemory&) {  // no collective started: into RAM, moved at its op
    wait = start_shard_gather(c, Device::cpu(), op, dtype);
    gathered_.push_back(c.index());
    spilled_.push_back(c.index());
    track_host(c.copy_nbytes());
    ++iter_.landed_prefetches;
    ++run_.landed_prefetches;
    return wait;
  }
  gathered_.push_back(c.index());
  track_gathered(c.copy_nbytes());
  return wait;
}

void Gemini::spill_shard(Chunk& c) {
  join_shard_gather(c);  // its all_gather, started by every rank, lands first
  const int64_t bytes = c.copy_nbytes();
  c.storage()->move_to(Device::cpu());
  close_interval();  // Note [Non-model memory]; still gathered (every rank's view), on the host
  spilled_.push_back(c.index());
  track_gathered(-bytes);
  track_host(bytes);
  iter_.d2h_bytes += bytes;
  run_.d2h_bytes += bytes;
  if (trace_out_) trace_out_->counter("device chunks", now_us(), device_model_bytes());
}

// For its op (pre_op, through wait_inflight): the copy back on the device, room made first as a
// gather makes it (which may move another unpinned sharded copy out).
void Gemini::unspill_shard(Chunk& c) {
  if (std::find(spilled_.begin(), spilled_.end(), c.index()) == spilled_.end()) return;
  const int64_t bytes = c.copy_nbytes();
  make_device_room(bytes);
  c.storage()->move_to(options_.device);  // throws OutOfMemory: the op cannot run
  spilled_.erase(std::find(spilled_.begin(), spilled_.end(), c.index()));
  track_host(-bytes);
  track_gathered(bytes);
  iter_.h2d_bytes += bytes;
  run_.h2d_bytes += bytes;
}

// Before release() frees a spilled copy: its bytes as if on the device, which release() forgets.
void Gemini::forget_spill(Chunk& c) {
  auto it = std::find(spilled_.begin(), spilled_.end(), c.index());
  if (it == spilled_.end()) return;
  spilled_.erase(it);
  track_host(-c.copy_nbytes());
  track_gathered(c.copy_nbytes());
}

}  // namespace mw::gemini
