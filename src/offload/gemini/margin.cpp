// Note [Chunks moved to the device]: ColossalAI's gpu_margin_mem_ratio. Under auto every chunk is
// homed on the host: each iteration gathers it before its ops, sends its gradient down and steps
// it there with the CPU kernel (on an H100, GPT-2 small B8 T1024 took 335 ms per step that way
// against 191 ms without Gemini). When the device has room the warmup's plan never uses, that is
// waste. So after the warmup (the plan is known) the chunks, in chunk order, are homed on the
// device for good with their Adam states, their gradient buffers go on the device too, and
// HybridAdam steps them there (the fused kernel on CUDA), while the room lasts:
//
//   room   = capacity x (1 - margin) - lower bound (the largest, over ops, of that op's non-model
//            memory plus its own chunks plus what is already resident);
//   budget = gpu_margin_mem_ratio x room;
//   a chunk costs 4x its bytes: its parameters, m, v, and its gradient buffer during backward.
//
// Chunks are taken in order until one does not fit (deterministic; ColossalAI also walks its
// chunks in order). The plan is then rebuilt without them and with their bytes resident, so every
// op keeps the room for its own chunks that it had, and auto only evicts more among the rest.
// Nothing in the arithmetic changes: the parameters, m and v are moved bit for bit and the
// update's kernel is the one the plain run uses for a parameter on that device, so losses and
// weights stay the plain run's bit for bit on sim (tests/gemini/gemini_loop_test.cpp). ColossalAI
// moves the fp32 master chunks and the states (three shards per parameter: its fp16 chunks stay
// managed); memwall's chunks are the f32 masters themselves, so the chunk moves and counts once
// more for its gradient.
//
// Not with three tiers (--host-capacity plans the host's budget with the states on the host) or
// ZeRO sharding. The memory plan printed before the run counts the states on the host (the
// warmup's placement, an upper bound there) and, on the device, the moved chunks' m and v by this
// arithmetic with its own lower bound (train/gemini_plan.cpp, moved_chunk_bytes).
#include <cstdio>

#include "core/allocator.h"
#include "core/error.h"
#include "offload/gemini/gemini.h"

namespace mw::gemini {

void check_gpu_margin(const GeminiOptions& o) {
  const double ratio = o.gpu_margin_mem_ratio;
  MW_CHECK_T(InvalidArgument, ratio >= 0 && ratio <= 1, "--gpu-margin-mem-ratio ", ratio,
             ": expected a share in [0, 1]");
  if (ratio == 0) return;
  MW_CHECK_T(InvalidArgument, o.policy == Policy::kAuto,
             "--gpu-margin-mem-ratio moves chunks after auto's warmup: use it with --gemini auto");
  MW_CHECK_T(InvalidArgument, o.host_capacity_bytes == 0,
             "--gpu-margin-mem-ratio does not work with --host-capacity (three tiers plan the host "
             "budget with every Adam state on the host); drop one of them");
  MW_CHECK_T(InvalidArgument, o.shard_ranks == 1,
             "--gpu-margin-mem-ratio does not work with --zero 2|3 (sharded chunks stay homed "
             "where ZeRO puts them); drop one of them");
}

void Gemini::move_chunks_to_device() {
  const int64_t capacity = allocator_for(options_.device).stats().capacity_bytes;
  const double room = capacity > 0 ? static_cast<double>(capacity) * (1.0 - margin_) -
                                         static_cast<double>(lower_bound_bytes_)
                                   : 1e300;  // an unlimited sim device
  const double budget = options_.gpu_margin_mem_ratio * std::max(0.0, room);
  double used = 0;  // 4x the bytes moved
  std::vector<char> moved(chunks_.size(), 0);
  for (auto& owned : chunks_) {
    Chunk& c = *owned;
    const size_t k = static_cast<size_t>(c.index());
    const auto state = static_cast<size_t>(adam_index_[k]);
    if (!c.host_home() || c.on_nvme() || c.sharded() || adam_->offloaded(state)) continue;
    const double cost = 4.0 * static_cast<double>(c.nbytes());
    if (used + cost > budget) break;
    c.set_home(options_.device);
    track_host(-c.nbytes());
    device_home_bytes_ += c.nbytes();
    params_off_[k] = false;
    optim_on_host_[k] = false;
    adam_->move_states(state, options_.device);
    device_state_bytes_ += 3 * c.nbytes();  // m, v and the gradient buffer in backward
    // The parameters and, after the warmup's update, m and v went host -> device once.
    run_.h2d_bytes += 3 * c.nbytes();
    used += cost;
    moved[k] = 1;
    ++moved_chunks_;
  }
  if (moved_chunks_ == 0) return;
  for (TraceOp& op : trace_) {  // resident for good: no longer gathered by any op
    std::vector<int> rest;
    for (int c : op.chunks)
      if (!moved[static_cast<size_t>(c)]) rest.push_back(c);
    op.chunks = std::move(rest);
  }
  if (options_.verbose)
    std::printf(
        "gemini auto: gpu_margin_mem_ratio %g: %d of %zu chunks (%.1f MiB) moved to %s with "
        "their gradients and Adam states, of %s the plan leaves free\n",
        options_.gpu_margin_mem_ratio, moved_chunks_, chunks_.size(), used / 4 / 1048576.0,
        options_.device.str().c_str(),
        capacity > 0 ? str(static_cast<int64_t>(room / 1048576.0), " MiB").c_str()
                     : "an unlimited device");
  build_plan();
}

}  // namespace mw::gemini
