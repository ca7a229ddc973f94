// Placement decisions of Gemini's policies (docs/gemini.md): which chunks live on the device for
// good, and which gathered chunks to evict when an op needs room.
//
// Note [OPT eviction]: an iteration's ops, recorded on the warmup iteration, repeat exactly in
// every later one, so the next use of every chunk is known. When op t needs room on the device, the
// gathered chunk whose next use is farthest away is evicted first (Belady's OPT; a chunk with no
// further use this iteration is farthest of all, and is released right after its last use anyway).
// Ties go to the larger chunk, then the lower index, so the plan is deterministic. For chunks of
// equal size this evicts the fewest chunks possible (Belady); for unequal sizes it is the standard
// heuristic. plan_opt() runs exactly the same decisions as the live manager, so a test can compare
// it with an exhaustive search (brute_force_min_load_bytes) on a small model.
#pragma once

#include <cstdint>
#include <vector>

namespace mw::gemini {

// One recorded op: the chunks whose data it needs on the device.
struct TraceOp {
  std::vector<int> chunks;
};

// For each op t and chunk c: the index of c's next use after t (or INT64_MAX if none).
class NextUse {
 public:
  NextUse(const std::vector<TraceOp>& trace, int num_chunks);
  int64_t after(int chunk, int64_t t) const;  // first use strictly after t
  bool used_after(int chunk, int64_t t) const { return after(chunk, t) != INT64_MAX; }

 private:
  std::vector<std::vector<int64_t>> uses_;  // per chunk, ascending op indices
};

// Picks chunks to evict from `gathered` (excluding `keep`) so that `gathered_bytes - evicted +
// need_bytes <= avail_bytes`, farthest next use after t first (Note [OPT eviction]). Returns the
// chunks to evict; if even evicting every candidate is not enough, returns all candidates.
std::vector<int> choose_evictions(const std::vector<int>& gathered, const std::vector<int>& keep,
                                  const std::vector<int64_t>& chunk_bytes, int64_t gathered_bytes,
                                  int64_t need_bytes, int64_t avail_bytes, const NextUse& next,
                                  int64_t t);

struct PlanResult {
  int64_t load_bytes = 0;  // host -> device
  int64_t loads = 0;
  int64_t evictions = 0;  // forced by room (not the release after a last use)
  int64_t peak_gathered_bytes = 0;
  bool fits = true;  // every op's own chunks fit its avail
};

// Simulates one iteration of the auto/const policy from an empty device: at each op, evict by OPT
// to make room within avail_bytes[t], gather what the op needs, and release chunks after their last
// use in the iteration.
PlanResult plan_opt(const std::vector<TraceOp>& trace, const std::vector<int64_t>& chunk_bytes,
                    const std::vector<int64_t>& avail_bytes);

// The least host -> device bytes any eviction schedule can achieve for the same problem (the same
// release-after-last-use rule, gathered bytes within avail at every op), by exhaustive search. For
// tests on small traces only (exponential).
int64_t brute_force_min_load_bytes(const std::vector<TraceOp>& trace,
                                   const std::vector<int64_t>& chunk_bytes,
                                   const std::vector<int64_t>& avail_bytes);

// Static placement (ColossalAI's offload_param_frac / offload_optim_frac): walking chunks in
// order, offload a chunk while the bytes offloaded so far are below frac x total. Deterministic.
std::vector<bool> choose_offloaded(const std::vector<int64_t>& chunk_bytes, double frac);

// Note [Auto margin] (gemini.cpp): the share of the device auto keeps free; 2% on sim, 10% on cuda.
double default_auto_margin(bool cuda);

// The arithmetic of Note [Three tiers] (tiers.cpp), shared by Gemini and the memory plan
// (train/memory_plan.h) so the plan printed before the run is the run's own: given each chunk as
// one rank holds it, a host budget, the requested fraction of Adam states on disk and the NVMe
// window, which chunks are homed on disk. InvalidArgument, naming the bytes needed, when even
// that cannot fit.
struct TierChunk {
  int64_t bytes = 0;          // the whole chunk (a gradient buffer, a copy on its way home)
  int64_t home_bytes = 0;     // its home: the chunk, or this rank's piece when sharded
  int64_t state_bytes = 0;    // its Adam m and v (of this rank's piece under --zero 2|3)
  bool params_off = true;     // homed off the device
  bool optim_on_host = true;  // its Adam states off the device
  bool sharded = false;  // Note [Sharded parameters]; on_disk: its piece (Note [Pieces on disk])
  // Deferred updates (--grad-accum, --grad-clip, fp16): its gradient kept in RAM until step()
  // while homed there; homed on disk it spills, unless kept_on_disk (sharded states: a piece).
  int64_t kept_grad_bytes = 0;
  bool kept_on_disk = false;
  bool sharded_states = false;  // its Adam states are this rank's piece (--zero 2|3)
};
struct TierPlan {
  std::vector<bool> on_disk;     // per chunk: homed on disk
  double nvme_fraction = 0;      // of Adam states on disk: as asked, or 1 when they do not fit
  int64_t host_chunk_bytes = 0;  // chunk homes in RAM
  int64_t host_state_bytes = 0;  // Adam states in RAM, plus the NVMe window when streaming
  int64_t reserve_bytes = 0;     // transients (Note [Three tiers], tiers.cpp)
  int64_t disk_chunk_bytes = 0;
  int64_t disk_state_bytes = 0;
  int64_t kept_grad_bytes = 0;  // deferred updates: gradients in RAM until step()
  bool deferred = false;        // some chunk keeps its gradient until step()
  int64_t host_bytes() const {
    return host_chunk_bytes + host_state_bytes + reserve_bytes + kept_grad_bytes;
  }
};
// window_bytes and slice_numel: the Adam states' NVMe options; the window counts as the slots
// it makes for these chunks (optim::staging_window_bytes).
TierPlan plan_tiers(const std::vector<TierChunk>& chunks, int64_t host_capacity_bytes,
                    double nvme_fraction, int64_t window_bytes, int64_t slice_numel);

}  // namespace mw::gemini
