// The memory plan (memory_plan.h, Note [Activation arithmetic]); the check against what the
// machine has is memory_check.cpp.
#include "train/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/allocator.h"
#include "core/error.h"
#include "models/gpt2/spec.h"
#include "offload/gemini/chunk_search.h"
#include "optim/nvme_states.h"
#include "train/activation_plan.h"
#include "train/data_parallel.h"
#include "train/plan_bytes.h"
#include "train/plan_parts.h"

namespace mw::train {

using plan_bytes::clamp_bytes;
using plan_bytes::mib;
using plan_bytes::mib_text;

// Elements of each parameter, in the tensor table's order (spec.h).
std::vector<int64_t> parameter_numels(const Config& config) {
  std::vector<int64_t> sizes;
  for (const auto& spec : tensor_specs(config)) {
    int64_t numel = 1;
    for (int64_t d : spec.shape) numel *= d;
    sizes.push_back(numel);
  }
  return sizes;
}

Config with_layers(Config c, int64_t n_layer) {
  c.n_layer = n_layer;
  return c;
}

// In double, clamped by the caller: an absurd model must not overflow.
double parameter_bytes(const PlanInputs& in) {
  auto bytes_of = [&](const Config& c) {
    double total = 0;
    for (int64_t numel : parameter_numels(c))
      total += static_cast<double>(round_up(numel * in.dtype_bytes, kHostAlignment));
    return total;
  };
  const int64_t L = in.config.n_layer;
  if (L <= kListedLayers) return bytes_of(in.config);
  const double first = bytes_of(with_layers(in.config, 1));
  const double block = bytes_of(with_layers(in.config, 2)) - first;
  return first + static_cast<double>(L - 1) * block;
}

void add(MemoryPlan& p, const std::string& what, const std::string& tier, int64_t bytes,
         const std::string& note) {
  if (bytes <= 0) return;
  p.rows.push_back({what, tier, bytes, note});
  if (tier == "host")
    p.host_bytes += bytes;
  else if (tier == "disk")
    p.disk_bytes += bytes;
  else
    p.device_bytes += bytes;
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Data parallel's gradients (Note [Gradient buckets], train/data_parallel.h): each gradient is
// added into its bucket and released as soon as it is final, so the buckets live beside the
// activations for the whole of backward. Stage 0 keeps every bucket (Psi floats); stage 1 those
// and this rank's summed piece (Psi/N); stage 2 only the piece, a bucket's buffer being freed when
// its reduce_scatter completes: at most two in flight (a third waits for the oldest) beside the
// one being filled, three buckets at most. Stage 3 reduces gradients as stage 2; its
// parameters stay counted whole, an upper bound: a rank holds its pieces (Psi/N) and the buckets
// in use (Note [ZeRO stage 3], train/zero3.cpp), which the plan does not lay out.
// The buckets and shards are host memory on cpu and sim (train/data_parallel.cpp: MPI's
// collectives run on host buffers); on sim they were once counted on the device, 475 MiB too much
// there and too little on the host for GPT-2 small at 2 ranks. Over NCCL they are device memory
// (Note [Buckets on CUDA]; stages 2-3 there: device_buckets_in_flight), measured on sim under
// NCCL's rule (Note [Device memory on the CPU]) within 0.2% at stages 0-2 and +9% at stage 3;
// not measured on a GPU. Sizes come from the buckets themselves (bucket_numels): a parameter
// larger than --bucket-mb is a bucket of its own (GPT-2's wte, 147 MiB), so stage 2's buckets are
// the three largest, not 3 x --bucket-mb. (Planned as two until session 23, when the reductions
// were not bounded: a 5-block 512-wide model at 2 ranks, --zero 3, measured 161 MiB of host
// against 144.3 planned.)
// Stages 1 and 2 then rebuild the parameters after the update by all_gathers of three buckets at
// a time, each from a host piece into a host buffer of the whole bucket (stage 1's is the kept
// bucket): a moment after backward, so only what it holds beyond backward's host extras (the
// buckets in flight, the activations when they are on the host) is added. Measured on sim, 26.8M
// parameters (wte a bucket of 73.6 MiB), 2 ranks: host peaks 307 / 293 MiB at stages 1 / 2 against
// 255.7 / 203.4 planned without these two corrections.
// The f32 bytes of the data-parallel buckets (bucket_numels over the parameters in registration
// order), in bucket order: the last holds the first parameters registered (wte).
std::vector<int64_t> bucket_bytes(const PlanInputs& in) {
  std::vector<int64_t> numels;
  for (const auto& spec : gpt2::tensor_specs(in.config)) numels.push_back(shape_numel(spec.shape));
  std::vector<int64_t> bytes;
  for (int64_t n : bucket_numels(numels, in.bucket_bytes)) bytes.push_back(4 * n);
  return bytes;
}

// The same, largest first.
std::vector<int64_t> bucket_bytes_largest_first(const PlanInputs& in) {
  std::vector<int64_t> bytes = bucket_bytes(in);
  std::sort(bytes.rbegin(), bytes.rend());
  return bytes;
}

// What plain ZeRO 3 holds of each bucket while it is gathered, largest first: its f32 bytes, or
// under autocast its 16-bit gather (Note [16-bit parameter gathers], train/zero3_low.cpp: the f32
// members first, N slots of the longest rank's run). GPT-2 small at 2 ranks: 160.77 MiB at most
// at once measured, 168.26 in f32.
bool plans_low_gathers(const PlanInputs& in) {
  return !in.gemini && in.gemini_options.low_copies != DType::F32;
}

std::vector<int64_t> gathered_bucket_bytes(const PlanInputs& in) {
  const gemini::GeminiOptions& g = in.gemini_options;
  if (!plans_low_gathers(in)) return bucket_bytes_largest_first(in);
  std::vector<int64_t> numels;
  for (const auto& spec : gpt2::tensor_specs(in.config)) numels.push_back(shape_numel(spec.shape));
  std::vector<int64_t> out;
  size_t k = numels.size();  // buckets hold runs of the tensors, from the last registered
  for (int64_t numel : bucket_numels(numels, in.bucket_bytes)) {
    int64_t f32 = 0;
    for (int64_t seen = 0; seen < numel; seen += numels[k])
      f32 += g.low_copy_tensors[--k] ? 0 : numels[k];
    out.push_back(f32 == numel
                      ? 4 * numel
                      : in.ranks * low_gather_slot(f32, ceil_div(numel, in.ranks), in.ranks));
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

// Stage 3's parameters row counts the two largest buckets gathered (the op's and the next's).
int64_t two_gathered_buckets(const PlanInputs& in) {
  const std::vector<int64_t> bytes = gathered_bucket_bytes(in);
  int64_t gathered = 0;
  for (size_t i = 0; i < 2 && i < bytes.size(); ++i) gathered += bytes[i];
  return gathered;
}

// Stages 2-3 over device memory (Note [Buckets on CUDA]): the embedding's gradient is reduced
// whole, so its bucket starts at the very end of backward, when the engine still holds the
// gradient it was copied from and two more buckets may be in flight, beside what little is left
// of the activations; at the activations' peak (the LM head's backward) no bucket is in flight yet.
// So the row is what that moment holds beyond the activations' peak, and at least the three
// largest other buckets (filled as the activations go). Measured under NCCL's rule on sim (the
// 26.8M model at 2 ranks, wte's bucket 73.6 MiB): stage 2 329 MiB against 329.3 planned (366.5
// with the three largest beside the peak), stage 3 312 against 340.1 (413.8; still an upper
// bound: the other buckets counted beside the peak are filled only as the activations go).
int64_t device_buckets_in_flight(const PlanInputs& in, int64_t device_activations) {
  std::vector<int64_t> bytes = bucket_bytes(in);
  if (bytes.empty()) return 0;
  const int64_t embedding = bytes.back();  // the first parameters registered: wte's bucket
  // Stage 3's parameters row counts the two largest buckets gathered beside the peak
  // (plan_parameters); the embedding's backward gathers none (it reads only the ids).
  std::sort(bytes.rbegin(), bytes.rend());
  const int64_t gathered = in.zero_stage == 3 && in.ranks > 1 ? two_gathered_buckets(in) : 0;
  bytes.erase(std::find(bytes.begin(), bytes.end(), embedding));  // the others, largest first
  int64_t two = 0, three = 0;
  for (size_t i = 0; i < bytes.size() && i < 3; ++i) (i < 2 ? two : three) += bytes[i];
  three += two;
  return std::max(three, 2 * embedding + two - device_activations - gathered);
}

void plan_gradient_buckets(MemoryPlan& p, const PlanInputs& in, int64_t params,
                           int64_t host_activations) {
  const std::vector<int64_t> bytes = bucket_bytes_largest_first(in);
  auto largest = [&](size_t k, auto each) {
    int64_t sum = 0;
    for (size_t i = 0; i < k && i < bytes.size(); ++i) sum += each(bytes[i]);
    return sum;
  };
  const int64_t piece = ceil_div(params, in.ranks);
  // Note [Buckets on CUDA] (data_parallel.cpp): NCCL's buckets are on the device.
  const std::string where = in.collectives_on_device ? p.device_name : "host";
  if (in.zero_stage < 2)
    add(p, "gradient buckets", where, params, "data parallel: every bucket kept");
  if (in.zero_stage >= 1)
    add(p, "gradient shard", where, piece, str("ZeRO ", in.zero_stage, ": 1/", in.ranks));
  int64_t in_flight = in.zero_stage >= 2 ? largest(3, [](int64_t b) { return b; }) : 0;
  if (in.zero_stage >= 2 && in.collectives_on_device)
    in_flight = device_buckets_in_flight(in, host_activations);
  if (in.zero_stage >= 2)
    add(p, "gradient buckets in flight", where, in_flight,
        in.collectives_on_device ? "beyond the activations: the embedding's, reduced whole at the "
                                   "end of backward, and two more"
                                 : "the three largest: two reduced, one filled");
  if (in.zero_stage == 1 || in.zero_stage == 2) {
    const int64_t gather =
        largest(3, [&](int64_t b) { return ceil_div(b, in.ranks) + (in.zero_stage == 2 ? b : 0); });
    add(p, "all_gather buffers beyond backward's", where,
        std::max<int64_t>(0, gather - in_flight - host_activations),
        "three buckets at a time, after the update");
  }
}

// What the first block's backward holds beside the gradients, the last moment of a backward
// without updates in it: the block's saved tensors (with offload and no recomputation, what the
// prefetch window has brought back of them; with recomputation, the segment recomputed), the
// gradient inside its MLP [N, F] and the incoming gradient [N, C]. Measured: the L4 C256 model of
// tests/train/memory_plan_test.cpp with a 4 MiB prefetch window and no update in backward, sim
// peak 36.54 MiB, at that moment; 28.77 planned with the gradients alone.
int64_t first_block_backward(const PlanInputs& in, const Activations& a) {
  std::string name;
  const Recomputation r = recomputation(in, a, &name);
  double saved = r.longest > 0 ? r.longest * a.block : a.block;
  if (in.offload_activations && r.longest == 0)
    saved = std::min(saved, static_cast<double>(in.offload_in_flight_bytes));
  // The MLP's gradient or the attention's workspace, as activation_peak counts a block's backward
  // (on the host under autocast the f32 copies of the products: fp16, whose loss scaling defers
  // the updates, with every block checkpointed, 4 blocks of width 256, B8 T128 on sim, measured
  // 48 MiB against 39.3 planned with the MLP's gradient alone), less the weight gradients, which
  // the caller counts with every other gradient (3 blocks of width 256, B2 T128, fp16: 24 MiB
  // measured, 28.0 planned with them twice).
  return clamp_bytes(saved + std::max(a.mlp_grad, a.attention_backward_beside_grads) + a.input);
}

// --offload-activations. Every tensor saved inside the offload scope goes to the host: without
// recomputation all of them, the head's and the loss's included (gpt2_train computes the loss
// inside the scope); with it, what recomputation stores (the checkpoints' inputs, packed by the
// offloader: Trainer::build_recomputation) and the head's and the loss's. The device keeps the
// gradients in flight, one logits-sized buffer (the logits' gradient) and, with recomputation,
// the segment being recomputed; plus what the offloader has prefetched back, up to
// offload_in_flight_bytes (at the default a small model's activations all come back). `kept` and
// `in_flight` are the device's bytes at its peak moment.
struct OffloadSplit {
  int64_t offloaded = 0, kept = 0, in_flight = 0;
  const char* kept_what = "logits and head gradients";
  const char* in_flight_when = "prefetched back at the LM head's backward";
};

OffloadSplit offload_split(const PlanInputs& in, const Activations& a, int64_t act_peak) {
  OffloadSplit s;
  std::string name;
  const Recomputation r = recomputation(in, a, &name);
  const double in_flight = static_cast<double>(in.offload_in_flight_bytes);
  if (r.longest == 0) {
    s.kept = clamp_bytes(a.logits + a.backward_extra);
    s.offloaded = std::max<int64_t>(0, act_peak - clamp_bytes(a.backward_extra));
    const int64_t returning = std::max<int64_t>(0, s.offloaded - clamp_bytes(a.logits));
    s.in_flight = std::min(returning, in.offload_in_flight_bytes);
    // A block's backward: the window of the blocks before it (the prefetch refills it as the
    // block's own tensors are unpacked) and one block's saved bytes, of which its backward has
    // freed what its MLP's gradient and the incoming gradient take. The larger moment when the
    // window is smaller than the activations (Note [Offload window]). Measured on sim, 4 blocks of
    // width 256, B4 T128: 12.0 MiB beside the parameters with a 4 MiB window, 24.1 with a 16.1 MiB
    // one, a block 8.0; 8 blocks of width 128, vocabulary 512, B4 T128, an 8.1 MiB window: 18.6
    // MiB against 16.6 planned with the head's moment alone, 19.1 now.
    const double block = a.block;
    const int64_t ahead = std::min(std::max<int64_t>(0, returning - clamp_bytes(a.block)),
                                   in.offload_in_flight_bytes);
    if (block + static_cast<double>(ahead) > static_cast<double>(s.kept + s.in_flight)) {
      s.kept = clamp_bytes(block), s.in_flight = ahead;
      s.kept_what = "a block's backward";
      s.in_flight_when = "prefetched back for the blocks before it";
    }
    return s;
  }
  s.offloaded = clamp_bytes(r.stored + a.head + a.logits);
  // The device's peak is the larger of two moments. At the LM head's backward everything stored
  // and the head's tensors are on their way back; a segment stored whole is backwarded next and
  // spent. When a checkpointed segment is recomputed only the checkpoints' inputs remain.
  // As activation_peak counts them: the LM head's products (on the host under autocast, the f32
  // accumulators and widened blocks of mixed::gemm), and a recomputed segment's backward with the
  // MLP's gradient or the attention's workspace, whichever is larger (measured: 4 blocks of width
  // 256, B8 T128, bf16 on sim with both flags, the sim peak 41 MiB against 28.3 planned with the
  // gradients alone).
  const double head = a.logits + head_backward_bytes(a) + std::min(r.stored + a.head, in_flight);
  const double recompute_kept = recomputing_bytes(a, r) - a.mlp_grad + block_backward_bytes(a);
  const double recompute_back = std::min(r.inputs, in_flight);
  if (head >= recompute_kept + recompute_back) {
    s.kept = clamp_bytes(a.logits + head_backward_bytes(a));
    s.in_flight = clamp_bytes(head) - s.kept;
  } else {
    s.kept = clamp_bytes(recompute_kept);
    s.in_flight = clamp_bytes(recompute_back);
    s.kept_what = "a recomputed segment and gradients";
    s.in_flight_when = "prefetched back to recompute";
  }
  return s;
}

void plan_offloaded_activations(MemoryPlan& p, const PlanInputs& in, const Activations& a,
                                int64_t act_peak, const std::string& act_note) {
  const OffloadSplit s = offload_split(in, a, act_peak);
  add(p, "activations (offloaded)", "host", s.offloaded, act_note);
  add(p, s.kept_what, p.device_name, s.kept, "");
  add(p, "offloaded activations in flight", p.device_name, s.in_flight, s.in_flight_when);
}

// Note [Sampling during training] runs between steps, when the activations are gone. Without
// Gemini on a host-addressable device the KV-cache decoder (models/gpt2/generate.h) holds keys and
// values for n_positions in every layer plus a token's buffers, on the heap (outside the
// allocators, in the RSS). Under Gemini or on CUDA a sampling forward is a no-grad forward of
// [1, t] whose tensors die as the next op consumes them: its peak is the widest of three moments,
// each with the residual stream and a layernorm's output [t, C]: the logits [t, V]; attention's
// qkv [t, 3C], its kept statistics (on sim each row's max and 1/sum [H, t, 2]; on CUDA counted as
// probabilities [H, t, t], an upper bound on its score blocks) and output [t, C]; the MLP's [t, F]
// input and output, beside ln_2's output and c_proj's (Block::forward and Mlp::forward keep their
// temporaries to the end of the expression; one more [t, C] is measured at t 1024 and not counted).
bool samples_by_forwards(const PlanInputs& in) { return in.gemini || in.device.is_cuda(); }

double kv_cache_bytes(const PlanInputs& in) {
  const Config& c = in.config;
  const double P = static_cast<double>(c.n_positions), C = static_cast<double>(c.n_embd);
  const double V = static_cast<double>(c.vocab_size);
  return 4 * (2 * static_cast<double>(c.n_layer) * P * C + P + V + 9 * C);
}

double sampling_forward_double(const PlanInputs& in) {
  const Config& c = in.config;
  const double e = 4;  // f32 at every --precision (Note [Sampling during training])
  const double t =
      static_cast<double>(std::min(std::max<int64_t>(1, in.sample_context), c.n_positions));
  const double C = static_cast<double>(c.n_embd), F = static_cast<double>(c.mlp_width());
  auto r = [](double bytes) { return std::ceil(bytes / kHostAlignment) * kHostAlignment; };
  const double head = r(t * static_cast<double>(c.vocab_size) * e);
  const double kept = static_cast<double>(c.n_head) * t * (in.device.is_cuda() ? t : 2.0) * e;
  const double attention = r(3 * t * C * e) + r(kept) + r(t * C * e);
  const double mlp = 2 * r(t * F * e) + 2 * r(t * C * e);
  return 2 * r(t * C * e) + std::max({head, attention, mlp});
}

void plan_sampling(MemoryPlan& p, const PlanInputs& in, int64_t device_act_peak) {
  if (in.sample_tokens <= 0) return;
  if (!samples_by_forwards(in)) {
    add(p, "sampling: KV cache", "host", clamp_bytes(kv_cache_bytes(in)),
        str("--sample-every: ", in.config.n_layer, " layers x ", in.config.n_positions,
            " positions, on the heap"));
    return;
  }
  add(p, "sampling forward beyond the activations", p.device_name,
      std::max<int64_t>(0, clamp_bytes(sampling_forward_double(in)) - device_act_peak),
      str("--sample-every: a no-grad forward of up to ", in.sample_context, " tokens"));
}

}  // namespace

int64_t sampling_forward_bytes(const PlanInputs& in) {
  return clamp_bytes(sampling_forward_double(in));
}

// The parameters' row: whole, or under ZeRO 3 on a device this rank's pieces and the buckets
// gathered around the ops.
void plan_parameters(MemoryPlan& p, const PlanInputs& in, int64_t params, bool on_device) {
  const std::string& dev = p.device_name;
  if (in.zero_stage == 3 && in.ranks > 1 && on_device) {
    // Note [ZeRO stage 3]: this rank's pieces, and the buckets of the op running and of the next
    // (prefetched), gathered whole beside them: the two largest. Counted whole, the parameters were
    // 18% under the sim peak (26.8M parameters, 2 ranks: 213.1 MiB planned, 260 measured), the
    // pieces on the device beside them. On the CPU the parameters stay counted whole (within 1%
    // there).
    add(p, "parameters", dev, ceil_div(params, in.ranks) + two_gathered_buckets(in),
        plans_low_gathers(in)
            ? "ZeRO 3: this rank's pieces and two buckets gathered, matrices in 16 bits"
            : "ZeRO 3: this rank's pieces and two buckets gathered");
  } else {
    add(p, "parameters", dev, params, "");
  }
}

// The gradients beyond the activations: data parallel's buckets, those kept across micro-batches,
// or all of them at the end of a backward without updates in it. `device_act`: what the device
// holds of the activations at their peak.
void plan_gradients(MemoryPlan& p, const PlanInputs& in, const Activations& a, int64_t params,
                    int64_t device_act) {
  const bool on_device = !in.device.is_cpu();
  const std::string& dev = p.device_name;
  const bool data_parallel = in.ranks > 1 || in.zero_stage > 0;
  // What backward's moment holds beside the buffers where they are: the device's activations
  // (a cpu run's are host memory), none on the host for host buffers beside a device.
  if (data_parallel)
    plan_gradient_buckets(p, in, params, !on_device || in.collectives_on_device ? device_act : 0);
  if (in.micro_batches > 1) {
    // The gradients of the micro-batches so far stay through the next one's forward and
    // backward, beside its activations (measured: GPT-2 small B2 T128 --grad-accum 2 on sim,
    // peak 1292.7 MiB = parameters + gradients + activations; this row missing, the plan said
    // 949.6). Data parallel too: the buckets take them only after the last micro-batch.
    add(p, "gradients kept across micro-batches", dev, params,
        str("--grad-accum ", in.micro_batches, ": beside the next micro-batch's activations"));
  } else if (!data_parallel && (in.adamw || !in.update_in_backward)) {
    // At the first block's backward nearly every gradient exists (all are counted, an upper
    // bound by that block's own) beside what the block holds, the other activations gone: the
    // peak is the larger of that moment and the activations' peak, the device's share of them
    // (with offload, not all of them: GPT-2 small B2 T256 --offload-activations --grad-clip on
    // sim was planned 849.7 MiB, measured 962).
    add(p, "gradients beyond the activations' peak", dev,
        std::max<int64_t>(0, params + first_block_backward(in, a) - device_act),
        "no update in backward: all gradients at the first block's backward");
  }
}

namespace {
// HybridAdam's NVMe offload keeps the states of host parameters on disk (ColossalAI's
// nvme_offload_fraction: CPU parameters only; under Gemini, those of the chunks homed on the
// host). On a GPU without Gemini no parameter is on the host: it offloaded nothing, silently
// (measured on an H200: --device cuda --offload nvme kept its 949 MiB of m and v on the GPU, while
// this plan put them on disk). Chunks homed on the GPU with host states cannot go to disk either.
void check_nvme_offload(const PlanInputs& in) {
  MW_CHECK_T(InvalidArgument, in.nvme_fraction <= 0 || in.gemini || !in.device.is_cuda(),
             "--offload nvme keeps the Adam states of host parameters on disk, but on --device "
             "cuda every parameter and its m and v live on the GPU, so nothing would be "
             "offloaded. Add --gemini static --offload-param-frac 1 --offload-optim-frac 1 to "
             "home the parameters on the host, where --offload nvme puts their states on disk "
             "(docs/gemini.md); or train with --device cpu");
  // Three tiers put the Adam states that do not fit in --host-capacity on disk, as --offload nvme.
  const auto& g = in.gemini_options;
  // Static placement with every chunk's states on the device: nothing for the disk (it was
  // ignored without a word on sim; on cuda too when --offload-param-frac was 0 as well).
  MW_CHECK_T(InvalidArgument,
             in.nvme_fraction <= 0 || !in.gemini || g.policy != gemini::Policy::kStatic ||
                 g.offload_optim_frac > 0,
             "--offload nvme puts on disk the Adam states of chunks homed on the host, but "
             "--gemini static with --offload-optim-frac 0 keeps every chunk's states on the "
             "device, so nothing would be offloaded. Pass --offload-optim-frac F and "
             "--offload-param-frac F (ColossalAI's placement_policy='cpu' is 1 and 1)");
  const bool to_disk = in.nvme_fraction > 0 || g.host_capacity_bytes > 0;
  MW_CHECK_T(InvalidArgument,
             !to_disk || !in.gemini || !in.device.is_cuda() ||
                 g.policy != gemini::Policy::kStatic ||
                 g.offload_param_frac >= g.offload_optim_frac,
             in.nvme_fraction > 0 ? "--offload nvme" : "--host-capacity",
             " on --device cuda can put on disk the Adam states of chunks homed on the host only, "
             "but --offload-optim-frac ",
             g.offload_optim_frac, " > --offload-param-frac ", g.offload_param_frac,
             " keeps some chunks with host states on the GPU, whose states would stay in RAM. "
             "Pass --offload-param-frac ",
             g.offload_optim_frac, " (ColossalAI's placement_policy='cpu' is 1 and 1)");
}
}  // namespace

// Note [Evaluation-only plan]: --eval-only runs forwards without grad mode, so it holds the
// parameters and one forward's tensors (the sampling forward's arithmetic for each of its rows),
// no Adam states, gradients or saved activations. Planned as a training step, GPT-2 xl's
// evaluation asked for 18.4 GiB of host RAM, 11.6 of it states it never allocates (a 4-layer
// width-512 model on the CPU: 584.5 MiB planned, 189 MiB peak RSS; 177.6 planned now). Under
// Gemini the training plan stays (an upper bound: the chunks' placement is the run's).
void plan_evaluation_only(MemoryPlan& p, const PlanInputs& in, int64_t params, int64_t io_bytes) {
  plan_parameters(p, in, params, !in.device.is_cpu());
  PlanInputs row = in;
  row.sample_context = in.seq;
  add(p, "evaluation forward (no grad)", p.device_name,
      clamp_bytes(static_cast<double>(in.batch) * sampling_forward_double(row)),
      str("--eval-only: B", in.batch, " T", in.seq, ", no optimizer states or gradients"));
  add(p, "token ids", p.device_name, io_bytes, "");
}

int64_t offload_window_bytes(const PlanInputs& global) {
  PlanInputs in = global;  // one rank's rows, as plan_memory
  in.batch = global.batch / std::max<int64_t>(1, global.ranks);
  return std::min(int64_t{128} << 20, clamp_bytes(2 * activations(in).block));
}

MemoryPlan plan_memory(const PlanInputs& global) {
  check_nvme_offload(global);
  PlanInputs in = global;  // one rank's: its rows of the global batch (Note [Global batch])
  in.ranks = std::max<int64_t>(1, global.ranks);
  in.batch = global.batch / in.ranks;
  MemoryPlan p;
  p.ranks_on_host = std::max<int64_t>(1, global.ranks_on_host);
  const bool on_device = !in.device.is_cpu();
  p.device_name = on_device ? in.device.str() : "host";
  const Activations a = activations(in);
  p.activation_bytes =
      clamp_bytes(static_cast<double>(in.config.n_layer) * a.block + a.head + a.logits);
  const int64_t act_peak = clamp_bytes(activation_peak(in, a, &p.recompute));
  const int64_t params = clamp_bytes(parameter_bytes(in));
  const int64_t io_bytes = 2 * round_up(in.batch * in.seq * 4, kHostAlignment);  // ids + copy
  if (in.eval_only && !in.gemini) {
    plan_evaluation_only(p, in, params, io_bytes);
    return p;
  }
  if (in.gemini) {
    int64_t device_act = act_peak;
    HostActivations host_act;
    if (in.offload_activations && on_device) {  // Gemini's non-model memory is what stays
      const OffloadSplit s = offload_split(in, a, act_peak);
      add(p, "activations (offloaded)", "host", s.offloaded,
          str("B", in.batch, " T", in.seq, ", recompute: ", p.recompute));
      device_act = s.kept + s.in_flight;
      host_act.offloaded = s.offloaded;
      // Under --grad-accum the first micro-batch's gradient buffers are there when the next
      // forward ends (measured: 6 blocks of width 32, vocabulary 50257, B2 T64, auto, --grad-accum
      // 2 on sim, the host 39 MiB against 32.5 planned with the logits taken off).
      if (in.micro_batches == 1)
        host_act.freed_first = std::min(clamp_bytes(a.logits), s.offloaded);
    }
    if (in.sample_tokens > 0)  // Gemini's non-model memory covers the sampling forward too
      device_act = std::max(device_act, clamp_bytes(sampling_forward_double(in)));
    plan_gemini(p, in, a, device_act, host_act);
    add(p, "token ids", p.device_name, io_bytes, "");
    return p;
  }
  const std::string dev = p.device_name;
  plan_parameters(p, in, params, on_device);
  std::string act_note = str("B", in.batch, " T", in.seq, ", recompute: ", p.recompute);
  if (in.ranks > 1) act_note += str(" (B", global.batch, " over ", in.ranks, " ranks)");
  if (in.offload_activations && on_device) {
    plan_offloaded_activations(p, in, a, act_peak, act_note);
  } else {
    add(p, "activations + logits at the LM head's backward", dev, act_peak, act_note);
  }
  // What the device holds of the activations at their peak: all of them, or with offload what
  // stays and what has been prefetched back.
  int64_t device_act = act_peak;
  if (in.offload_activations && on_device) {
    const OffloadSplit s = offload_split(in, a, act_peak);
    device_act = s.kept + s.in_flight;
  }
  plan_sampling(p, in, device_act);
  plan_gradients(p, in, a, params, device_act);
  // HybridAdam keeps a sim device's states on the host unless told otherwise, a CUDA device's on
  // the device (its fused kernel steps them there); AdamW beside the parameters. ZeRO 1 and 2 keep
  // this rank's shard's.
  const bool states_on_host = !on_device || (in.states_on_host && !in.adamw && in.device.is_sim());
  const std::string states_tier = states_on_host ? "host" : dev;
  const int64_t states = in.zero_stage >= 1 ? ceil_div(2 * params, in.ranks) : 2 * params;
  const auto on_disk = static_cast<int64_t>(in.nvme_fraction * static_cast<double>(states));
  add(p, "Adam m, v", states_tier, states - on_disk,
      in.zero_stage >= 1 ? str("ZeRO ", in.zero_stage, ": this rank's 1/", in.ranks) : "");
  if (in.nvme_fraction > 0) {
    add(p, "Adam m, v (NVMe)", "disk", on_disk, str("--fraction ", in.nvme_fraction));
    const Config& c = in.config;  // the largest parameter: wte, wpe or an MLP weight
    const int64_t largest = std::max({c.vocab_size, c.n_positions, c.mlp_width()}) * c.n_embd;
    // at most a slice per slice_numel of the offloaded elements, and a part-slice per tensor
    const int64_t slices = ceil_div(on_disk / 2, in.nvme_slice_numel) + 4 + 12 * c.n_layer;
    add(p, "NVMe window", "host",
        optim::staging_window_bytes(in.nvme_window_bytes, in.nvme_slice_numel, largest, slices),
        "staging");
  }
  add(p, "token ids", dev, io_bytes, "");
  return p;
}

std::string MemoryPlan::table() const {
  std::string out = "Memory plan (MiB):\n";
  char line[256];
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, "  %-48s %-6s %10.1f  %s\n", r.what.c_str(), r.tier.c_str(),
                  mib(r.bytes), r.note.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  total: host %.1f MiB | %s %.1f MiB | disk %.1f MiB%s\n",
                mib(host_bytes), device_name == "host" ? "device" : device_name.c_str(),
                mib(device_bytes), mib(disk_bytes), ranks_on_host > 1 ? " (per rank)" : "");
  out += line;
  if (ranks_on_host > 1) {
    std::snprintf(line, sizeof line, "  %lld ranks on this host: host %.1f MiB | disk %.1f MiB\n",
                  static_cast<long long>(ranks_on_host),
                  mib(host_bytes) * static_cast<double>(ranks_on_host),
                  mib(disk_bytes) * static_cast<double>(ranks_on_host));
    out += line;
  }
  return out;
}

}  // namespace mw::train
