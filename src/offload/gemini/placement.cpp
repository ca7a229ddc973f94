// The policies by name (gemini.h), Note [OPT eviction] and static placement (placement.h).
#include "offload/gemini/placement.h"

#include <algorithm>
#include <climits>
#include <functional>

#include "core/error.h"
#include "core/numbers.h"
#include "offload/gemini/gemini.h"

namespace mw::gemini {

Policy parse_policy(const std::string& text) {
  if (text == "static") return Policy::kStatic;
  if (text == "auto") return Policy::kAuto;
  if (text == "const") return Policy::kConst;
  throw InvalidArgument(str("gemini policy '", text, "': expected static, auto or const"));
}

const char* policy_name(Policy p) {
  switch (p) {
    case Policy::kStatic: return "static";
    case Policy::kAuto: return "auto";
    case Policy::kConst: return "const";
  }
  return "?";
}

NextUse::NextUse(const std::vector<TraceOp>& trace, int num_chunks) : uses_(num_chunks) {
  for (size_t t = 0; t < trace.size(); ++t)
    for (int c : trace[t].chunks) {
      auto& u = uses_.at(static_cast<size_t>(c));
      if (u.empty() || u.back() != static_cast<int64_t>(t)) u.push_back(static_cast<int64_t>(t));
    }
}

int64_t NextUse::after(int chunk, int64_t t) const {
  const auto& u = uses_[static_cast<size_t>(chunk)];
  auto it = std::upper_bound(u.begin(), u.end(), t);
  return it == u.end() ? INT64_MAX : *it;
}

std::vector<int> choose_evictions(const std::vector<int>& gathered, const std::vector<int>& keep,
                                  const std::vector<int64_t>& chunk_bytes, int64_t gathered_bytes,
                                  int64_t need_bytes, int64_t avail_bytes, const NextUse& next,
                                  int64_t t) {
  std::vector<int> candidates;
  for (int c : gathered)
    if (std::find(keep.begin(), keep.end(), c) == keep.end()) candidates.push_back(c);
  // Farthest next use first; then the larger chunk; then the lower index (deterministic).
  std::sort(candidates.begin(), candidates.end(), [&](int a, int b) {
    const int64_t na = next.after(a, t), nb = next.after(b, t);
    if (na != nb) return na > nb;
    if (chunk_bytes[a] != chunk_bytes[b]) return chunk_bytes[a] > chunk_bytes[b];
    return a < b;
  });
  std::vector<int> evict;
  int64_t bytes = gathered_bytes;
  for (int c : candidates) {
    if (bytes + need_bytes <= avail_bytes) break;
    evict.push_back(c);
    bytes -= chunk_bytes[c];
  }
  return evict;
}

namespace {

// The state shared by plan_opt's simulation: what is gathered and how many bytes.
struct Device {
  std::vector<int> gathered;
  int64_t bytes = 0;
  void drop(int c, const std::vector<int64_t>& sizes) {
    gathered.erase(std::find(gathered.begin(), gathered.end(), c));
    bytes -= sizes[c];
  }
  bool has(int c) const { return std::find(gathered.begin(), gathered.end(), c) != gathered.end(); }
};

}  // namespace

PlanResult plan_opt(const std::vector<TraceOp>& trace, const std::vector<int64_t>& chunk_bytes,
                    const std::vector<int64_t>& avail_bytes) {
  MW_CHECK_T(InvalidArgument, avail_bytes.size() == trace.size(), "plan_opt: ", trace.size(),
             " ops but ", avail_bytes.size(), " budgets");
  const NextUse next(trace, static_cast<int>(chunk_bytes.size()));
  PlanResult r;
  Device dev;
  for (size_t t = 0; t < trace.size(); ++t) {
    const auto& need = trace[t].chunks;
    int64_t need_bytes = 0;
    for (int c : need)
      if (!dev.has(c)) need_bytes += chunk_bytes[c];
    for (int c : choose_evictions(dev.gathered, need, chunk_bytes, dev.bytes, need_bytes,
                                  avail_bytes[t], next, static_cast<int64_t>(t))) {
      dev.drop(c, chunk_bytes);
      ++r.evictions;
    }
    for (int c : need)
      if (!dev.has(c)) {
        dev.gathered.push_back(c);
        dev.bytes += chunk_bytes[c];
        r.load_bytes += chunk_bytes[c];
        ++r.loads;
      }
    if (dev.bytes > avail_bytes[t]) r.fits = false;
    r.peak_gathered_bytes = std::max(r.peak_gathered_bytes, dev.bytes);
    for (int c : need)  // released right after the last use in the iteration
      if (!next.used_after(c, static_cast<int64_t>(t))) dev.drop(c, chunk_bytes);
  }
  return r;
}

int64_t brute_force_min_load_bytes(const std::vector<TraceOp>& trace,
                                   const std::vector<int64_t>& chunk_bytes,
                                   const std::vector<int64_t>& avail_bytes) {
  const int n = static_cast<int>(chunk_bytes.size());
  MW_CHECK_T(InvalidArgument, n <= 16, "brute force: at most 16 chunks");
  const NextUse next(trace, n);
  int64_t best = INT64_MAX;
  // Depth-first over (op, gathered set as a bitmask): at each op, any subset of the gathered
  // chunks not needed now may be evicted, as long as the result fits.
  std::function<void(size_t, uint32_t, int64_t)> visit = [&](size_t t, uint32_t set,
                                                             int64_t loaded) {
    if (loaded >= best) return;
    if (t == trace.size()) {
      best = loaded;
      return;
    }
    uint32_t need = 0;
    for (int c : trace[t].chunks) need |= 1u << c;
    const uint32_t optional = set & ~need;
    for (uint32_t drop = optional;; drop = (drop - 1) & optional) {  // every subset of optional
      uint32_t after = (set & ~drop) | need;
      int64_t bytes = 0, load = 0;
      for (int c = 0; c < n; ++c) {
        if (after >> c & 1) bytes += chunk_bytes[c];
        if ((need >> c & 1) && !(set >> c & 1)) load += chunk_bytes[c];
      }
      if (bytes <= avail_bytes[t]) {
        uint32_t kept = after;
        for (int c = 0; c < n; ++c)
          if ((need >> c & 1) && !next.used_after(c, static_cast<int64_t>(t))) kept &= ~(1u << c);
        visit(t + 1, kept, loaded + load);
      }
      if (drop == 0) break;
    }
  };
  visit(0, 0, 0);
  return best;
}

std::vector<bool> choose_offloaded(const std::vector<int64_t>& chunk_bytes, double frac) {
  MW_CHECK_T(InvalidArgument, frac >= 0.0 && frac <= 1.0, "offload fraction ", frac,
             " is outside [0, 1]");
  int64_t total = 0;
  for (int64_t b : chunk_bytes) total += b;
  const double target = frac * static_cast<double>(total);
  std::vector<bool> offloaded(chunk_bytes.size(), false);
  int64_t done = 0;
  for (size_t c = 0; c < chunk_bytes.size(); ++c) {
    if (static_cast<double>(done) >= target || frac == 0.0) break;
    offloaded[c] = true;
    done += chunk_bytes[c];
  }
  return offloaded;
}

namespace {
std::string mib(int64_t bytes) {
  return format_fixed(static_cast<double>(bytes) / (1 << 20), 2) + " MiB";
}
}  // namespace

double default_auto_margin(bool cuda) { return cuda ? 0.10 : 0.02; }

// Note [Three tiers]: Adam states go to disk first (two thirds of the model data, streamed through
// a fixed window), then parameter chunks, last chunk first, until the rest fits beside the reserve.
// Under data parallel the homes and states are this rank's (pieces when sharded); sharded chunks'
// pieces go to disk after every replicated chunk (Note [Pieces on disk], shard.cpp).
TierPlan plan_tiers(const std::vector<TierChunk>& chunks, int64_t host_capacity_bytes,
                    double nvme_fraction, int64_t window, int64_t slice_numel) {
  const int64_t cap = host_capacity_bytes;
  TierPlan t;
  t.on_disk.assign(chunks.size(), false);
  int64_t states = 0, largest = 0, second = 0, largest_states = 0, largest_piece = 0;
  for (const TierChunk& c : chunks) {
    if (c.sharded_states) largest_piece = std::max(largest_piece, c.state_bytes / 2);
    if (c.params_off) t.host_chunk_bytes += c.home_bytes;
    if (c.optim_on_host) states += c.state_bytes;
    t.kept_grad_bytes += c.kept_grad_bytes;
    largest_states = std::max(largest_states, c.state_bytes);
    // Only a chunk homed or stepped off the device sends gradients or copies through RAM (with
    // every chunk and state on the device, static 0/0, --host-capacity reserved 30 MiB of
    // transients and a 32 MiB NVMe window for nothing).
    if (!c.params_off && !c.optim_on_host) continue;
    second = std::max(second, std::min(largest, c.bytes));
    largest = std::max(largest, c.bytes);
  }
  // Note [Three tiers] (tiers.cpp): two gradient buffers of different chunks and one RAM copy,
  // which may be either's; with deferred updates step() has two chunks' gradients and RAM copies.
  t.deferred = std::any_of(chunks.begin(), chunks.end(),
                           [](const TierChunk& c) { return c.kept_grad_bytes > 0; });
  t.reserve_bytes = t.deferred ? 2 * (largest + second) : 2 * largest + second;
  // Sharded states (Note [Three tiers under data parallel]): step() all_gathers two chunks' updated
  // pieces (each a whole buffer and a piece) while two disk-homed chunks' RAM copies wait to be
  // written home (measured: 6 blocks of width 512, auto, --zero 2 --shard-param-frac 0.3 at 2
  // ranks, --host-capacity 48MiB: 46-49 MiB + 8 of NVMe slots against 44.1 planned without them).
  if (largest_piece > 0)
    t.reserve_bytes = std::max(t.reserve_bytes, 2 * (largest + largest_piece) + 2 * largest);
  // The states' parameters are the chunks (this rank's pieces): m and v, 8 bytes per element.
  // No more slots than the states have slices (the window makes none they could not use).
  const int64_t window_bytes = optim::staging_window_bytes(
      window, slice_numel, largest_states / 8,
      (states / 8 + slice_numel - 1) / slice_numel + static_cast<int64_t>(chunks.size()));
  t.nvme_fraction = nvme_fraction;
  if (t.host_chunk_bytes + states + t.reserve_bytes + t.kept_grad_bytes > cap &&
      t.nvme_fraction == 0 && states > 0)
    t.nvme_fraction = 1.0;
  t.host_state_bytes = states;
  if (t.nvme_fraction > 0) {
    t.host_state_bytes =
        static_cast<int64_t>(static_cast<double>(states) * (1.0 - t.nvme_fraction)) + window_bytes;
    t.disk_state_bytes = states - (t.host_state_bytes - window_bytes);
  }
  // Replicated chunks first, then sharded chunks' pieces (Note [Pieces on disk]), each last first.
  for (bool pieces : {false, true})
    for (size_t k = chunks.size(); k-- > 0;) {
      if (t.host_bytes() <= cap) break;
      if (!chunks[k].params_off || chunks[k].sharded != pieces) continue;
      t.on_disk[k] = true;
      t.disk_chunk_bytes += chunks[k].home_bytes;
      t.host_chunk_bytes -= chunks[k].home_bytes;
      if (!chunks[k].kept_on_disk) t.kept_grad_bytes -= chunks[k].kept_grad_bytes;
    }
  if (t.host_bytes() <= cap) return t;
  const int64_t staged = t.nvme_fraction > 0 ? window_bytes : 0;
  // Two slots are the least the states' pipeline works with: there --nvme-window cannot help.
  const bool least = staged > window;
  throw InvalidArgument(str(
      "--host-capacity ", cap, " bytes (", mib(cap), ") cannot hold Gemini's host data: ",
      mib(t.host_chunk_bytes), " of chunks on the host, ", mib(t.host_state_bytes - staged),
      " of Adam states in RAM, ", mib(staged), " of staging window for the states on disk ",
      least ? str("(two slots of ", mib(staged / 2), ", the least it works with; --nvme-window ",
                  mib(window), " cannot shrink it), ")
            : std::string("(--nvme-window), "),
      mib(t.kept_grad_bytes),
      " of gradients kept until the step (--grad-accum, --grad-clip, fp16) and ",
      mib(t.reserve_bytes),
      " for gradients and RAM copies in flight (two of the largest chunk and one or two of the "
      "next), ",
      mib(t.host_bytes()), " in all. Raise --host-capacity to at least ", t.host_bytes(),
      " (bytes), or shrink ",
      least ? "the chunks (--chunk-size: smaller chunks, smaller slots)"
            : "the window (--nvme-window) or the chunks (--chunk-size)"));
}

}  // namespace mw::gemini
