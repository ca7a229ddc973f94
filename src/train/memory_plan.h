// The memory plan of a GPT-2 training run (docs/reliability.md, "A memory plan before the first
// allocation"): from the config, B x T and the optimizer / offload / placement options, what the
// run needs in each tier (host RAM, the device, disk at the NVMe directory), computed without
// allocating anything, in time independent of the model's size beyond one pass over its tensor
// table.
//
// Note [Activation arithmetic]: the activation estimate counts exactly what the ops save for
// backward (autograd/functions.cpp), each tensor rounded up to the allocator's 4096-byte granule
// (Note [Allocator statistics]). Per block with N = B*T rows, C = n_embd, F = mlp width, H heads:
//   ln_1: its input x [N,C] and per-row mean, rstd [N]; c_attn: ln_1's output [N,C];
//   attention: qkv [N,3C] and the probabilities [B,H,T,T]; attn.c_proj: the attention output
//   [N,C]; ln_2: h = x + attn [N,C] and mean, rstd; c_fc: ln_2's output [N,C]; GELU: c_fc's
//   output [N,F]; mlp.c_proj: GELU's output [N,F]. Dropout saves only its RNG state, adds save
//   nothing. So 5 [N,C] + [N,3C] + 2 [N,F] + 4 [N] + [B,H,T,T] per block.
// The head saves ln_f's input and output [N,C], mean, rstd, the logits [N,V] and the log-sum-exp
// [N]. The peak of a step is at the LM head's backward: every saved tensor, dlogits written into
// the logits buffer, plus dx [N,C] and wte's gradient [V,C] (held until the embedding's backward
// adds into it). With recomputation a checkpointed block keeps only its input and the peak moves to
// the recomputation of the longest checkpointed segment.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "models/gpt2/config.h"
#include "offload/gemini/gemini.h"

namespace mw::train {

using gpt2::Config;

struct PlanInputs {
  Config config;
  int64_t batch = 4, seq = 128;
  int64_t dtype_bytes = 4;  // parameters and the f32 activations
  // --precision: autocast's 16-bit activations (Note [Activations under autocast]); F32: off.
  DType precision = DType::F32;
  bool adamw = false;  // the scalar reference (no update in backward)
  bool update_in_backward = true;
  // --grad-accum: micro-batches per step. From the second on, every gradient accumulated so far
  // lives beside the next micro-batch's activations.
  int64_t micro_batches = 1;
  bool states_on_host = true;     // HybridAdam's m and v for a sim device
  double nvme_fraction = 0;       // of parameter elements whose m and v live on disk; 0 = none
  int64_t nvme_window_bytes = 0;  // --nvme-window; the slots it makes: optim::staging_window_bytes
  int64_t nvme_slice_numel = int64_t{1} << 19;
  std::string nvme_dir;  // "" = a private directory under io::default_offload_base()
  Device device = Device::cpu();
  int64_t device_capacity_bytes = 0;  // sim:CAP; 0 = unlimited
  bool checkpoint_every_block = false;
  int64_t checkpoint_segments = -1;  // -1: none; 0: round(sqrt(n_layer))
  bool offload_activations = false;
  // --offload-activations: the device bytes of offloaded activations back on the device at the
  // LM head's backward, the peak: ActivationOffloadOptions' prefetch_bytes (gpt2_train's is
  // offload_window_bytes()). The prefetch brings activations back from the head's backward on, so
  // a model whose offloaded activations fit in it saves no device memory. (Forward holds up to
  // max_pending_bytes of copies not yet done, which the trainer sets to the same bytes, so that
  // this row bounds that moment too.)
  int64_t offload_in_flight_bytes = int64_t{128} << 20;
  // --sample-every (Note [Sampling during training]): 0 = no sampling. `sample_context` bounds the
  // tokens one sampling forward sees (the prompt's and the new ones; n_positions at most).
  int64_t sample_tokens = 0, sample_context = 0;
  bool eval_only = false;  // --eval-only: forwards without grad (Note [Evaluation-only plan])
  bool gemini = false;
  gemini::GeminiOptions gemini_options;  // policy, fractions, budget, margin, host capacity
  // Data parallel (docs/distributed.md): `batch` is the global batch, split across `ranks`. The
  // plan is one rank's; ranks_on_host of them share this machine's RAM and disk.
  int64_t ranks = 1;
  int zero_stage = 0;  // 1: Adam states sharded; 2: gradients too; 3: parameters too
  int64_t bucket_bytes = int64_t{25} << 20;
  int64_t ranks_on_host = 1;
  // The communicator takes tensors on the device only (NCCL; Note [Device memory on the CPU]):
  // the buckets and shards are there (Note [Buckets on CUDA], train/data_parallel.cpp).
  bool collectives_on_device = false;
};

struct PlanRow {
  std::string what;
  std::string tier;  // "host", the device's name, or "disk"
  int64_t bytes = 0;
  std::string note;
};

struct MemoryPlan {
  std::vector<PlanRow> rows;  // the parts, for the table
  int64_t host_bytes = 0;     // predicted peak of the host allocator
  int64_t device_bytes = 0;   // predicted peak of the device allocator (0 on cpu)
  int64_t disk_bytes = 0;     // files under the NVMe directory
  int64_t activation_bytes = 0;
  std::string recompute;  // "none", "every block", "K segments"
  std::string device_name;
  int64_t ranks_on_host = 1;  // host and disk bytes are per rank; the check multiplies
  std::string table() const;  // one table, MiB, the three totals last
};

MemoryPlan plan_memory(const PlanInputs& in);
// Note [Offload window]: the device bytes --offload-activations lets the offloader hold ahead:
// prefetched in backward and, in forward, in copies to the host not yet done. Two blocks' saved
// tensors (one rank's rows), at most 128 MiB: one block's backward runs while the block before it
// comes back, with a block of slack for a late copy. A fixed 128 MiB (before session 40) brought
// every activation of a model under 128 MiB back at the head's backward, so the flag saved no
// device memory there: 8 blocks of width 128, vocabulary 512, B4 T128 on sim, peak 41.3 MiB with
// and without it; with this window (8.1 MiB) 18.6 MiB, planned 19.1, and it runs on sim:20MiB.
// Past 128 MiB the window holds less than two blocks (GPT-2 small at B4 T512 saves ~100 MiB a
// block) and the prefetch goes tensor by tensor, as before.
int64_t offload_window_bytes(const PlanInputs& in);

// The device bytes of one sampling forward (a no-grad forward of [1, sample_context]) beyond the
// parameters: what --sample-every needs between steps under Gemini or on CUDA.
int64_t sampling_forward_bytes(const PlanInputs& in);

// What the machine has: the smaller of MemAvailable (/proc/meminfo) and the cgroup's memory.max
// minus memory.current; free disk at dir, or at its nearest existing parent when the run is
// yet to create it (statvfs; "" = io::default_offload_base()). -1 = unknown.
struct AvailableMemory {
  int64_t host_bytes = -1;
  std::string host_source;
  int64_t disk_bytes = -1;
  std::string disk_path;
  std::string disk_in_memory;  // "tmpfs"/"ramfs": the "disk" is RAM (Note [Offload in RAM])
};
AvailableMemory available_memory(const std::string& nvme_dir);
// "  available: host ... | disk ... at 'DIR'\n" for the plan, and the warning of Note [Offload in
// RAM] when a plan with `disk_bytes` on disk offloads into RAM.
std::string available_text(const AvailableMemory& avail, int64_t disk_bytes);

// Throws OutOfMemory naming, per tier that does not fit, the bytes needed and available and the
// options that would make it fit. A device capacity of 0 (unlimited) always fits. The host and
// disk need is the plan's times the ranks on this host; a disk in RAM adds its need to the host's.
void check_plan_fits(const MemoryPlan& plan, const PlanInputs& in, const AvailableMemory& avail);

}  // namespace mw::train
