// The memory plan's Gemini rows (plan_parts.h): chunks packed as Gemini packs them, their homes
// by placement policy, and the host's gradient buffers, gathers and tiers (docs/gemini.md).
#include <algorithm>
#include <functional>
#include <string>

#include "core/allocator.h"
#include "models/gpt2/spec.h"
#include "offload/gemini/chunk_search.h"
#include "offload/gemini/gemini.h"
#include "offload/gemini/placement.h"
#include "train/plan_bytes.h"
#include "train/plan_parts.h"

namespace mw::train {

using plan_bytes::clamp_bytes;

namespace {

struct ChunkBytes {
  // The parameters' bytes under Gemini: packed, each chunk rounded once, not every tensor (a tiny
  // model's many small tensors would otherwise count up to 4 KiB each that no chunk holds).
  int64_t total = 0;
  int64_t largest = 0;
  int64_t first = 0;  // the chunk of wte (first in parameter order): the LM head's, at the peak
  int64_t widest_numel = 0;   // the largest tensor's elements
  std::vector<int64_t> each;  // in chunk order; empty past kListedLayers
  // Note [16-bit copies]: each chunk's device copy when its 16-bit part travels in 16 bits (the
  // same as `each` without 16-bit copies, and past kListedLayers).
  std::vector<int64_t> copy;
  // Per op of a transformer block (a module: its weight and bias), the block and the chunks
  // holding the op's tensors (two where it straddles a chunk boundary); empty past
  // kListedLayers, where an op may straddle two.
  struct Op {
    size_t block = 0;
    std::vector<int> chunks;
    int64_t grad_bytes = 0;  // its weight's and bias's gradients, made on the device
  };
  std::vector<Op> block_ops;
};

// The ops of the transformer blocks (their tensors named "transformer.h.K.MODULE.NAME"), each
// with the chunks holding its tensors.
std::vector<ChunkBytes::Op> ops_of_blocks(const PlanInputs& in, const std::vector<int>& of) {
  std::vector<ChunkBytes::Op> out;
  const std::string prefix = "transformer.h.";
  std::string module;
  size_t i = 0;
  for (const auto& spec : tensor_specs(in.config)) {
    const int c = of[i++];
    if (spec.name.rfind(prefix, 0) != 0) continue;
    const std::string name = spec.name.substr(0, spec.name.rfind('.'));
    if (out.empty() || name != module) out.push_back({std::stoul(name.substr(prefix.size())), {}});
    module = name;
    ChunkBytes::Op& op = out.back();
    if (std::find(op.chunks.begin(), op.chunks.end(), c) == op.chunks.end()) op.chunks.push_back(c);
    op.grad_bytes += round_up(shape_numel(spec.shape) * in.dtype_bytes, kHostAlignment);
  }
  return out;
}

// Gemini's chunks in bytes, from the tensor table alone (Note [Chunk-size search]): chunks
// allocate only what their tensors use. Past kListedLayers the search would be slow, and the
// capacity is taken as max(min chunk, largest tensor): chunks of many layers fill it.
ChunkBytes chunk_bytes(const PlanInputs& in) {
  const bool listed = in.config.n_layer <= kListedLayers;
  const std::vector<int64_t> sizes =
      parameter_numels(listed ? in.config : with_layers(in.config, 2));
  gemini::ChunkSearchOptions search = in.gemini_options.search;
  search.interval_numel = in.config.n_embd;  // as gpt2_train sets it
  int64_t capacity = in.gemini_options.chunk_numel;
  std::vector<bool> alone(sizes.size(), false);
  const int64_t widest = *std::max_element(sizes.begin(), sizes.end());
  if (capacity <= 0 && listed) {
    const gemini::ChunkSearchResult r = gemini::search_chunk_size(sizes, search);
    capacity = r.chunk_numel;
    alone = r.outlier;
  } else if (capacity <= 0) {
    capacity = std::max(search.min_chunk_numel, widest);
  }
  if (!listed) {  // chunks of `capacity` elements, filled in order; at most kMaxPlannedChunks
    const int64_t total = clamp_bytes(parameter_bytes(in));
    int64_t bytes = round_up(capacity * in.dtype_bytes, kHostAlignment);
    if (total / bytes >= kMaxPlannedChunks)  // an absurd model: coarser chunks, planned in time
      bytes = round_up(total / kMaxPlannedChunks + 1, kHostAlignment);
    ChunkBytes out{total, bytes, bytes, widest, {}, {}, {}};
    for (int64_t done = 0; done < total; done += bytes)
      out.each.push_back(std::min(bytes, total - done));
    out.copy = out.each;
    return out;
  }
  const std::vector<int> chunk_of = gemini::pack_chunks(sizes, capacity, alone);
  const auto& g = in.gemini_options;
  const std::vector<char> low =
      g.low_copies != DType::F32 ? g.low_copy_tensors : std::vector<char>(sizes.size(), 0);
  std::vector<int64_t> chunk_numel, low_numel;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto c = static_cast<size_t>(chunk_of[i]);
    if (chunk_numel.size() <= c) {
      chunk_numel.resize(c + 1, 0);
      low_numel.resize(c + 1, 0);
    }
    chunk_numel[c] += sizes[i];
    if (low.at(i)) low_numel[c] += sizes[i];
  }
  ChunkBytes out;
  for (size_t c = 0; c < chunk_numel.size(); ++c) {
    out.each.push_back(round_up(chunk_numel[c] * in.dtype_bytes, kHostAlignment));
    out.copy.push_back(round_up(
        (chunk_numel[c] - low_numel[c]) * in.dtype_bytes + low_numel[c] * dtype_size(g.low_copies),
        kHostAlignment));
    out.total += out.each.back();
  }
  out.largest = *std::max_element(out.each.begin(), out.each.end());
  out.first = out.each.front();
  out.widest_numel = widest;
  out.block_ops = ops_of_blocks(in, chunk_of);
  return out;
}

// Homes and state devices as Gemini's constructor chooses them (offload/gemini/placement.h), and
// the Adam states' bytes on each side.
struct GeminiHomes {
  int64_t device_homes = 0;  // chunks (or sharded chunks' pieces) homed on the device
  std::vector<bool> params_off, optim_on_host;
  int64_t host_chunks = 0, host_states = 0, device_states = 0;
  std::vector<gemini::TierChunk> tiers;  // Note [Three tiers], as this rank holds them
  bool sharded_states = false;           // --zero 2|3 under mpirun: pieces of m, v, gradients
};

GeminiHomes gemini_homes(const PlanInputs& in, const ChunkBytes& chunks) {
  const auto& g = in.gemini_options;
  const size_t n = chunks.each.size();
  GeminiHomes h;
  h.params_off.assign(n, true);
  h.optim_on_host.assign(n, true);
  if (g.policy == gemini::Policy::kStatic) {
    h.params_off = gemini::choose_offloaded(chunks.each, g.offload_param_frac);
    const std::vector<bool> optim_off = gemini::choose_offloaded(chunks.each, g.offload_optim_frac);
    for (size_t c = 0; c < n; ++c) h.optim_on_host[c] = h.params_off[c] || optim_off[c];
  }
  // Note [Sharded optimizer states] (--zero 2|3 under mpirun): each rank's m, v of its 1/N
  // piece; Note [Sharded parameters]: the sharded chunks' homes hold pieces too.
  const int64_t pieces = in.zero_stage >= 2 && in.ranks > 1 ? in.ranks : 1;
  h.sharded_states = pieces > 1;
  const std::vector<bool> sharded = pieces > 1
                                        ? gemini::choose_offloaded(chunks.each, g.shard_param_frac)
                                        : std::vector<bool>(n, false);
  for (size_t c = 0; c < n; ++c) {
    const int64_t piece = ((chunks.each[c] / 4 + pieces - 1) / pieces) * 4;
    const int64_t home = sharded[c] ? piece : chunks.each[c];
    if (h.params_off[c]) h.host_chunks += home;
    if (!h.params_off[c]) h.device_homes += home;
    (h.optim_on_host[c] ? h.host_states : h.device_states) += 2 * piece;
    h.tiers.push_back({chunks.each[c], home, 2 * piece, h.params_off[c], h.optim_on_host[c],
                       static_cast<bool>(sharded[c])});
    h.tiers.back().sharded_states = h.sharded_states;
    if (!in.update_in_backward && h.optim_on_host[c]) {  // as Gemini::plan_tiers
      h.tiers.back().kept_grad_bytes = piece;
      h.tiers.back().kept_on_disk = h.sharded_states;
    }
  }
  return h;
}

// The share of the device Gemini keeps free (--gpu-margin-mem-ratio's complement; as Gemini's
// constructor sets it).
double device_margin(const PlanInputs& in) {
  const auto& g = in.gemini_options;
  return g.auto_margin >= 0 ? g.auto_margin : gemini::default_auto_margin(in.device.is_cuda());
}

// What Gemini lets chunks and non-model memory use of the device: capacity x (1 - margin).
double usable_device_bytes(const PlanInputs& in) {
  return static_cast<double>(in.device_capacity_bytes) * (1.0 - device_margin(in));
}

// A sharded chunk's reduced piece of the gradient: 1/N of the largest chunk.
int64_t reduced_piece(const PlanInputs& in, int64_t largest) {
  return (largest + in.ranks - 1) / in.ranks;
}

int64_t sum_of_largest(std::vector<int64_t> each, size_t k) {
  std::sort(each.begin(), each.end(), std::greater<>());
  int64_t sum = 0;
  for (size_t i = 0; i < std::min(k, each.size()); ++i) sum += each[i];
  return sum;
}

// Note [Sharded optimizer states]: after the updates, step() all_gathers every rank's updated
// piece of each replicated chunk into a host buffer of the whole chunk, two chunks at a time, each
// beside this rank's piece (measured: GPT-2 small --gemini auto --zero 2 at 2 ranks on sim, the
// host peak two of its largest chunks and pieces above the homes and states, 1441 MiB against
// 1197.2 planned from the backward's gradient buffers alone). Sharded chunks gather nothing then.
int64_t piece_gathers(const GeminiHomes& h) {
  if (!h.sharded_states) return 0;
  std::vector<int64_t> each;
  for (const gemini::TierChunk& c : h.tiers)
    if (!c.sharded) each.push_back(c.bytes + c.state_bytes / 2);  // buffer + piece
  return sum_of_largest(std::move(each), 2);
}

// Note [Shard prefetch] (offload/gemini/shard.cpp): under static and auto, when every offloaded
// chunk is sharded and the room allows, the next op's sharded chunk is gathered while wte's is in
// use at the peak (measured: GPT-2 small --gemini static --offload-param-frac 1 --zero 3 at 2 ranks
// on sim, 555 MiB against 392.5 planned without it).
int64_t shard_prefetch(const PlanInputs& in, const GeminiHomes& h, const ChunkBytes& chunks,
                       int64_t device_total) {
  if (!h.sharded_states || in.device_capacity_bytes <= 0) return 0;
  int64_t next = 0;
  for (size_t c = 0; c < h.tiers.size(); ++c) {
    if (h.tiers[c].params_off && !h.tiers[c].sharded) return 0;  // no prefetch then
    if (c > 0 && h.tiers[c].sharded) next = std::max(next, chunks.each[c]);
  }
  const double room = usable_device_bytes(in);
  return static_cast<double>(device_total + next) <= room ? next : 0;
}

// The bytes of `next`'s gathered-on-use chunks that `op` does not hold already.
int64_t ahead_bytes(const ChunkBytes& chunks, const std::vector<bool>& on_use,
                    const ChunkBytes::Op& next, const ChunkBytes::Op& op) {
  int64_t bytes = 0;
  for (int c : next.chunks)
    if (on_use[static_cast<size_t>(c)] &&
        std::find(op.chunks.begin(), op.chunks.end(), c) == op.chunks.end())
      bytes += chunks.each[static_cast<size_t>(c)];
  return bytes;
}

// Note [Minimal residency] (offload/gemini): under static an offloaded chunk, and under every
// policy a sharded one (Note [Sharded parameters]), is gathered for the ops that use it and
// released when an op starts that does not, so an op whose weight and bias straddle two chunks
// holds both in its backward, beside the saved tensors of its block and those below it, wte's
// gradient, the block's own temporaries and the op's weight gradient (measured: GPT-2 small B4 T64
// `--gemini static --offload-param-frac 1` on sim, the peak 560 MiB at block 5's backward against
// 490.3 planned from wte's chunk at the LM head). Returns the chunk bytes to plan beyond the
// device homes so that, with `act_peak` beside them, the larger of the two peaks is covered.
// `on_use`: per chunk, whether it is gathered so; `prefetch`: the sharded chunk gathered beside
// wte's at the LM head (shard_prefetch); when non-zero, each op's neighbours' are gathered too.
int64_t gathered_on_use(const PlanInputs& in, const Activations& a, const ChunkBytes& chunks,
                        const std::vector<bool>& on_use, int64_t act_peak, int64_t prefetch) {
  const bool any_off = std::find(on_use.begin(), on_use.end(), true) != on_use.end();
  // wte's at the LM head's backward, and the next sharded chunk if prefetched then
  int64_t most = any_off ? chunks.first + prefetch : 0;
  std::string recompute;
  const Recomputation r = recomputation(in, a, &recompute);
  const std::vector<ChunkBytes::Op>& ops = chunks.block_ops;
  for (size_t k = 0; k < ops.size(); ++k) {
    const ChunkBytes::Op& op = ops[k];
    int64_t gathered = 0;
    for (int c : op.chunks)
      if (on_use[static_cast<size_t>(c)]) gathered += chunks.each[static_cast<size_t>(c)];
    // With the shard prefetch on, the next op's sharded chunks are gathered beside the op's own:
    // the op after it in forward, the one before it in backward (measured: 6 layers of width 512,
    // --chunk-size 20000 --zero 3 under auto at 2 ranks, the sim peak 27 MiB against 22.8 planned
    // without them).
    if (prefetch > 0)
      gathered += std::max(k > 0 ? ahead_bytes(chunks, on_use, ops[k - 1], op) : 0,
                           k + 1 < ops.size() ? ahead_bytes(chunks, on_use, ops[k + 1], op) : 0);
    // As activation_peak counts a block's backward: the op's incoming gradient and its weight's
    // gradient, or the attention's workspace (on the host under autocast, the f32 copies of the
    // MLP's products and weight gradients); with recomputation the longest segment rebuilt beside
    // the checkpoints' inputs, or the segment not checkpointed with what is stored, at any block's
    // ops (an upper bound). Offloaded activations come back before their block's backward: at
    // most the plain run's.
    const double op_bytes =
        std::max(a.mlp_grad + static_cast<double>(op.grad_bytes), a.attention_backward);
    const double alive =
        r.longest == 0
            ? static_cast<double>(op.block + 1) * a.block + a.backward_extra + op_bytes
            : std::max(r.stored + a.backward_extra,  // the last segment is not checkpointed
                       r.inputs + recomputing_bytes(a, r) - a.mlp_grad) +
                  op_bytes;
    most = std::max(most, gathered - (act_peak - clamp_bytes(alive)));
  }
  if (chunks.block_ops.empty() && any_off && chunks.each.size() > 1)
    most = std::max(most, 2 * chunks.largest);  // unlisted: any op may straddle two
  return most;
}

// Note [16-bit copies]: the chunks as the device holds them, their gathered copies of chunks homed
// in RAM (not on disk) and of sharded chunks (Note [16-bit gathers]) with their 16-bit part in 16
// bits (a 16-bit gather's slots pad each rank's run by at most the chunk's f32 part).
ChunkBytes device_copies(const ChunkBytes& chunks, const GeminiHomes& h,
                         const std::vector<bool>& on_disk) {
  ChunkBytes out = chunks;
  out.total = 0;
  for (size_t c = 0; c < out.each.size(); ++c) {
    if (h.tiers[c].sharded || (h.params_off[c] && !(c < on_disk.size() && on_disk[c])))
      out.each[c] = chunks.copy[c];
    out.total += out.each[c];
  }
  out.largest = *std::max_element(out.each.begin(), out.each.end());
  out.first = out.each.front();
  return out;
}

// The device's chunk bytes at its peak, and what they are.
int64_t device_chunk_bytes(const PlanInputs& in, const Activations& a, const ChunkBytes& chunks,
                           const GeminiHomes& h, int64_t act_peak, std::string* chunk_note) {
  const int64_t params = chunks.total;
  const auto& g = in.gemini_options;
  const size_t n = chunks.each.size();
  // Per chunk: gathered by the ops that use it and released after (static's offloaded chunks,
  // wte's first, and every sharded chunk); auto keeps the others while they fit, below.
  std::vector<bool> on_use(n);
  int64_t kept = 0;
  for (size_t c = 0; c < n; ++c) {
    on_use[c] = h.tiers[c].sharded || (g.policy == gemini::Policy::kStatic && h.params_off[c]);
    // a device-homed sharded chunk keeps its piece there
    kept += !on_use[c] ? chunks.each[c] : h.params_off[c] ? 0 : h.tiers[c].home_bytes;
  }
  const int64_t at_head = kept + chunks.first + h.device_states + act_peak;
  const int64_t gathered =
      gathered_on_use(in, a, chunks, on_use, act_peak, shard_prefetch(in, h, chunks, at_head));
  int64_t device_chunks = kept + gathered;
  if (g.policy == gemini::Policy::kConst) {  // the replicated chunks cached up to the budget
    // The budget holds chunks of any size: counted in units of the largest (wte's, 73.6 MiB
    // beside chunks of 1 MiB), it held wte's alone, 172.0 MiB planned against a 226.1 MiB peak.
    device_chunks = std::min(kept, std::max(chunks.first, g.const_budget_bytes)) +
                    (kept < params ? gathered : 0);  // sharded chunks: as under every policy
  }
  const int64_t device_total = device_chunks + h.device_states + act_peak;
  *chunk_note = "chunks on the device at the peak";
  if (g.policy == gemini::Policy::kAuto && in.device_capacity_bytes > 0) {
    const auto cap = static_cast<int64_t>(usable_device_bytes(in));
    const int64_t floor = act_peak + chunks.first;  // the op's chunk plus non-model memory
    const int64_t fitted = std::max(std::min(device_total, cap), floor);
    device_chunks = std::max<int64_t>(0, fitted - act_peak - h.device_states);
    *chunk_note = "auto: what fits in capacity x (1 - margin)";
  }
  return device_chunks;
}

// Note [Chunks moved to the device] (offload/gemini/margin.cpp): after auto's warmup, chunks in
// chunk order are homed on the device with their Adam states while gpu_margin_mem_ratio x
// (capacity x (1 - margin) - the plan's lower bound) lasts, 4x its bytes each. The lower bound is
// taken as wte's chunk beside the activations (Gemini measures its own, a little higher: as many
// chunks or more are planned to move, the device's safe side). Their m and v join the device, and
// the gradient buffer of the largest moved chunk but wte's, which is counted at the LM head
// already (measured, GPT-2 small B2 T128 on sim:3GiB: ratio 0.3 moved wte's chunk, 1112 MiB
// against 817.8 planned without it; ratio 1 all three, 1891; on an H200 at B8 T1024, 7830 against
// 6878.6). The host's rows stay as planned: the warmup holds every chunk and state there.
int64_t moved_chunk_bytes(const PlanInputs& in, const ChunkBytes& chunks, int64_t act_peak) {
  const auto& g = in.gemini_options;
  if (g.policy != gemini::Policy::kAuto || g.gpu_margin_mem_ratio <= 0) return 0;
  const double room = in.device_capacity_bytes > 0
                          ? usable_device_bytes(in) - static_cast<double>(act_peak + chunks.first)
                          : 1e300;
  const double budget = g.gpu_margin_mem_ratio * std::max(0.0, room);
  // Deferred updates (--grad-clip/--grad-accum) keep every moved chunk's gradient buffer on the
  // device until step(): one buffer counted, the plan was 9-23% under the peak (4 blocks of width
  // 128, vocabulary 5000, B2 T32, ratio 1 on sim:64MiB: 24.3 MiB planned, 29.8 measured).
  int64_t used = 0, states = 0, grad = 0;
  for (size_t c = 0; c < chunks.each.size(); ++c) {
    if (static_cast<double>(used + 4 * chunks.each[c]) > budget) break;
    used += 4 * chunks.each[c];
    states += 2 * chunks.each[c];
    if (!in.update_in_backward)
      grad += chunks.each[c];
    else if (c > 0)
      grad = std::max(grad, chunks.each[c]);
  }
  return states + grad;
}

// A chunk whose states stay on the device gathers its gradients there, updated as the chunk's
// last gradient comes (measured: GPT-2 B2 T32 of width 256 and vocabulary 256 under `--gemini
// static`, nothing offloaded, the sim peak 55 MiB against 42.7 planned without it).
// Under sharded states, as on the host (plan_host): two buffers while one is reduced, and a piece.
// Note [Chunk gradients after the head]: a chunk's gradient buffer is made when backward reaches
// its ops, after the LM head's backward has freed the logits (wte's dense gradient, which lives
// until the embedding's backward, is in the activations' row): the buffers count only past the
// logits' bytes. Counted on top, GPT-2 of 5 blocks of width 256, B2 T128, static 0/0 with
// --grad-clip planned 379.7 MiB for a 314.5 MiB peak (the chunks, m and v and the activations
// exactly) and was refused at 330 MiB.
// With recomputation or offloaded activations the activations' peak can fall later in backward,
// beside the buffers: counted whole there.
int64_t beyond_the_logits(const PlanInputs& in, int64_t grads, const Activations& a) {
  const bool peak_at_head =
      !in.checkpoint_every_block && in.checkpoint_segments < 0 && !in.offload_activations;
  return std::max<int64_t>(0, grads - (peak_at_head ? clamp_bytes(a.logits) : 0));
}

void plan_device_gradients(MemoryPlan& p, const PlanInputs& in, const Activations& a,
                           const ChunkBytes& chunks, const GeminiHomes& h) {
  if (!in.update_in_backward) return;  // deferred: plan_gemini
  std::vector<int64_t> each;
  for (size_t c = 0; c < chunks.each.size(); ++c)
    if (!h.optim_on_host[c]) each.push_back(chunks.each[c]);
  const int64_t grads = sum_of_largest(each, h.sharded_states ? 2 : 1);
  const int64_t piece = h.sharded_states && !each.empty() ? reduced_piece(in, chunks.largest) : 0;
  add(p, "gradient buffers", p.device_name, beyond_the_logits(in, grads + piece, a),
      h.sharded_states ? "chunks whose Adam states are on the device: two, one reducing"
                       : "the largest chunk whose Adam states are on the device");
}

// The host's rows: chunk homes, Adam states and gradient buffers, or the three tiers'.
void plan_host(MemoryPlan& p, const PlanInputs& in, const ChunkBytes& chunks, const GeminiHomes& h,
               const gemini::TierPlan& t, int64_t deferred_host_grads,
               const HostActivations& host_act) {
  const int64_t largest = chunks.largest;
  const size_t n = chunks.each.size();
  // Under sharded states a chunk's reduce_scatter writes this rank's piece of its gradient beside
  // the whole buffer (measured: --zero 2 and 3 at 2 ranks on sim, the host peak one piece of the
  // largest chunk above the plan without it, 358 / 307 MiB against 306.6 / 255.5).
  // Backward goes on while a chunk's reduction runs: the next chunk's buffer fills beside it
  // (measured: --gemini auto --zero 3, GPT-2 small at 2 ranks on sim, 1121 MiB against 959.9
  // planned from one buffer).
  // Only chunks whose Adam states are on the host have their buffers there; but a chunk is built
  // in RAM whatever its home (Note [Streaming construction]): the largest at least.
  std::vector<int64_t> on_host;
  for (size_t c = 0; c < n; ++c)
    if (h.optim_on_host[c]) on_host.push_back(chunks.each[c]);
  const int64_t piece = h.sharded_states && !on_host.empty() ? reduced_piece(in, largest) : 0;
  const int64_t buffers = sum_of_largest(on_host, h.sharded_states ? 2 : 1);
  if (t.disk_chunk_bytes == 0 && t.disk_state_bytes == 0) {
    // With offloaded activations the host peaks at the end of forward, with all of them, or later
    // beside gradient buffers, which appear only after the loss's backward has freed its logits
    // (measured: 4 blocks of width 128, vocabulary 50257, B4 T128, static 0.3/0.5 on sim, the host
    // 199 MiB against 227.1 planned when both were counted at once). So the buffers count only
    // beyond those bytes; the sum stays above both moments. step()'s all_gathers come after
    // backward has freed every offloaded activation (measured: 2 blocks of width 128, vocabulary
    // 50257, B2 T128, auto, --zero 2 at 2 ranks on sim, the host 91 MiB with and without
    // offloaded activations, against 118.2 planned with both counted at once).
    // Construction builds each chunk in RAM whatever its home, before any activation exists
    // (measured: 4 blocks of width 64, vocabulary 50257, static 0/0 --offload-activations
    // --grad-accum 2 --zero 3 at 2 ranks on sim, the host 13 MiB against 26.7 planned with wte's
    // chunk beside the activations).
    const int64_t built = std::max<int64_t>(0, largest + piece - host_act.offloaded);
    const int64_t grads =
        std::max<int64_t>(0, std::max(buffers, deferred_host_grads) + piece - host_act.freed_first);
    const int64_t gathers = std::max<int64_t>(0, piece_gathers(h) - host_act.offloaded);
    add(p, "chunk homes + Adam m, v + gradient buffers", "host",
        h.host_chunks + h.host_states + std::max({built, grads, gathers}),
        gathers > std::max(built, grads) ? "step(): two chunks' all_gathers of updated pieces"
        : built > grads                  ? "the largest chunk, built in RAM"
        : deferred_host_grads > 0        ? "every chunk's gradients until step()"
        : h.sharded_states               ? "two chunks' gradients: one reducing"
                                         : "the largest chunk for gradients");
    return;
  }
  if (t.disk_state_bytes > 0)
    add(p, "Adam m, v (NVMe)", "disk", t.disk_state_bytes, "beyond --host-capacity (three tiers)");
  add(p, t.nvme_fraction > 0 ? "Adam m, v in RAM + NVMe window" : "Adam m, v", "host",
      t.host_state_bytes, "");
  add(p, "parameter chunks (NVMe)", "disk", t.disk_chunk_bytes, "homed on disk, last chunk first");
  add(p, "chunk homes", "host", t.host_chunk_bytes, "");
  add(p, "gradient buffers", "host", t.reserve_bytes,
      t.deferred ? "2 x (the largest chunk + the next), kept free"
                 : "2 x the largest chunk + the next, kept free");
  if (deferred_host_grads > 0)  // RAM-homed chunks keep theirs until step(); disk-homed spill
    add(p, "gradient buffers until step()", "host", deferred_host_grads,
        h.sharded_states ? "updates after backward: this rank's pieces"
                         : "updates after backward: RAM-homed chunks' gradients");
}

}  // namespace

// Gemini (docs/gemini.md): chunks hold the parameters; gradients and Adam states of a chunk live
// where its placement says. Update in backward keeps one chunk's gradient buffer at a time (two
// under sharded states, one being reduced). The device peaks at the LM head's backward (Note
// [Activation arithmetic]), which needs wte's chunk, or at a block op's backward that gathers its
// chunks (device_chunk_bytes); auto fills the device with more chunks while they fit.
// Note [Staged collectives] (dist/communicator.h): over NCCL a collective on a chunk off the device
// (its gradient in RAM, its piece and whole chunk gathered into RAM) runs on device copies: one
// chunk for an all_reduce, a piece and a chunk for an all_gather. Measured under NCCL's rule on
// sim (Note [Device memory on the CPU]; 4 blocks of width 384, 2.5M-element chunks, 2 ranks,
// static with everything offloaded): sim peaks 34 / 34 / 46 MiB at stages 0 / 2 / 3 against
// 25.2 / 24.5 / 31.8 planned without this row. Auto samples them as non-model memory in its warmup
// and places chunks around them (49 against 46.8 at stage 2), so it plans none.
void plan_staged_collectives(MemoryPlan& p, const PlanInputs& in, const ChunkBytes& chunks,
                             const GeminiHomes& h) {
  if (!in.collectives_on_device || in.gemini_options.policy == gemini::Policy::kAuto) return;
  bool off_device = false;
  for (size_t c = 0; c < h.params_off.size(); ++c)
    off_device = off_device || h.params_off[c] || h.optim_on_host[c];
  if (!off_device) return;
  // Sharded parameters are gathered around the ops, beside their memory: the piece too (stage 3:
  // 46 MiB measured, 45.4 planned). Stage 2 gathers after the update, a quieter moment (34, 34.3).
  const bool sharded_params = in.ranks > 1 && in.gemini_options.shard_param_frac > 0;
  const int64_t piece = sharded_params ? (chunks.largest + in.ranks - 1) / in.ranks : 0;
  add(p, "staged collective copies", p.device_name, chunks.largest + piece,
      "Note [Staged collectives]: a chunk off the device reduced or gathered over NCCL");
}

void plan_gemini(MemoryPlan& p, const PlanInputs& in, const Activations& a, int64_t act_peak,
                 const HostActivations& host_act) {
  const ChunkBytes chunks = chunk_bytes(in);
  const auto& g = in.gemini_options;
  const std::string dev = p.device_name;
  const size_t n = chunks.each.size();
  const GeminiHomes h = gemini_homes(in, chunks);
  // Note [Three tiers] (docs/gemini.md), by Gemini's own arithmetic.
  gemini::TierPlan t;
  if (g.host_capacity_bytes > 0)
    t = gemini::plan_tiers(h.tiers, g.host_capacity_bytes, in.nvme_fraction, in.nvme_window_bytes,
                           in.nvme_slice_numel);
  std::string chunk_note;
  const int64_t device_chunks =
      device_chunk_bytes(in, a, device_copies(chunks, h, t.on_disk), h, act_peak, &chunk_note);
  add(p, "parameter chunks", dev, device_chunks, chunk_note);
  add(p, "Adam m, v", dev, h.device_states, "chunks whose states stay on the device");
  plan_device_gradients(p, in, a, chunks, h);
  int64_t moved = moved_chunk_bytes(in, chunks, act_peak);
  if (moved > 0 && in.device_capacity_bytes > 0) {  // auto then evicts more to stay within it
    const auto cap = static_cast<int64_t>(usable_device_bytes(in));
    moved = std::min(moved, std::max<int64_t>(0, cap - p.device_bytes - act_peak));
  }
  add(p, "chunks moved: Adam m, v + a gradient buffer", dev, moved,
      "--gpu-margin-mem-ratio, after the warmup");
  add(p, "activations + head", dev, act_peak, "Note [Activation arithmetic]");
  plan_staged_collectives(p, in, chunks, h);
  // Note [Deferred updates] (offload/gemini/deferred.cpp): with --grad-clip/--grad-accum (and
  // under data parallel) every chunk's gradient buffer lives until step(), where its Adam states
  // are; those of disk-homed chunks go to disk (all but the newest, inside the reserve). Under
  // sharded states only this rank's reduced piece lives on, disk-homed chunks' too (Note [Three
  // tiers under data parallel]); the three tiers' reserve holds the full buffers being reduced.
  // Without a host budget there is no reserve, and whole buffers are counted: they cover those
  // (measured: docs/distributed.md, "Gemini with --zero 2").
  // (A budget that sends nothing to disk plans no tiers, hence no reserve: whole buffers then.
  // Measured: 2 blocks of width 512, static 0.5/0, fp16, --zero 3 at 2 ranks on sim with
  // --host-capacity 192MiB, the host 36 MiB against 31.4 planned from pieces.)
  const bool reserve = t.disk_chunk_bytes > 0 || t.disk_state_bytes > 0;
  // With tiers, the host's are the budget's own (TierPlan::kept_grad_bytes: pieces, those of
  // disk-homed chunks spilled unless they are sharded states' pieces).
  int64_t deferred_host_grads = reserve ? t.kept_grad_bytes : 0;
  if (!in.update_in_backward) {
    int64_t device_grads = 0;
    for (size_t c = 0; c < n; ++c) {
      const int64_t kept = reserve ? h.tiers[c].state_bytes / 2  // a piece
                                   : chunks.each[c];
      if (!h.optim_on_host[c])
        device_grads += kept;
      else if (!reserve)
        deferred_host_grads += kept;
    }
    add(p, "gradient buffers until step()", dev, beyond_the_logits(in, device_grads, a),
        "--grad-clip/--grad-accum: updates after backward");
  }
  // From the second micro-batch on, a gradient made on the device comes into its host buffer in
  // slices (gemini::kAddSliceNumel), one beside the buffers (measured: GPT-2 small B4 T64 static
  // offload 1 `--grad-accum 2` on sim, the host peak 16 MiB above the plan without it).
  if (in.micro_batches > 1 && deferred_host_grads > 0)
    deferred_host_grads += round_up(
        std::min(chunks.widest_numel, gemini::kAddSliceNumel) * in.dtype_bytes, kHostAlignment);
  plan_host(p, in, chunks, h, t, deferred_host_grads, host_act);
}

}  // namespace mw::train
