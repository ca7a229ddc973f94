// Gemini: chunk-based heterogeneous memory management (docs/gemini.md), ColossalAI's design with
// its bugs designed out (docs/references.md, "Gemini").
//
// Gemini packs a model's parameters into chunks (chunk.h, chunk_search.h), keeps each chunk at a
// home tier (the device, or the host when offloaded), gathers offloaded chunks onto the device just
// before an op uses them, and evicts them by a placement policy:
//  - static: ColossalAI's offload_param_frac / offload_optim_frac, chunks chosen in chunk order
//    (both at 1 is the documents' placement_policy='cpu');
//  - auto: a warmup iteration records the ops and the non-model memory of each period between
//    them; afterwards chunks may use the capacity minus the coming period's non-model reserve and a
//    margin, evicted by OPT (Note [OPT eviction], placement.h);
//  - const: gathered chunks capped by a fixed budget, evicted by OPT.
// It is an Optimizer: gradients go into their chunk's gradient buffer as each becomes final (the
// grad-ready hook), and each chunk is stepped by HybridAdam as soon as all its gradients are in,
// while backward goes on.
//
// Note [Gemini hooks]: every parameter use is a module call (nn/module.h). Per leaf module that
// owns parameters, Gemini's forward pre-hook and backward pre-hook are *ops*: they count the
// tensors in use (COMPUTE) and gather the chunks the op needs (an embedding's backward needs none:
// it reads only the ids). The forward hook and the backward hook end a use (HOLD, HOLD_AFTER_BWD);
// an op whose input needs no gradient (the embeddings) has no backward hook, so the grad-ready hook
// ends its use. The grad-ready hook moves the state on to READY_FOR_REDUCE, copies the gradient
// into the chunk's buffer, frees autograd's copy and sets HOLD (Note [Tensor states]).
//
// Note [Minimal residency]: without a plan (static, and every policy during the warmup iteration),
// an op first releases every gathered chunk it does not need, so the device holds only the chunks
// of the op in progress: ColossalAI's 'cpu' policy at its smallest. This is the fallback that auto
// degrades to, so auto never fails where static with everything offloaded fits. With a plan, a
// chunk is kept between uses as long as room allows and released right after its last use in the
// iteration (ColossalAI keeps gathered chunks until memory pressure: its #2650).
//
// Contract (Note [Overlapped step contract], optim/hybrid_adam.h): one backward per step() (or K
// with deferred updates, Note [Deferred updates]), no gradient changes between backward and
// step(). Evaluation forwards run inside an EvalScope (Note [Evaluation forward]). Every parameter
// should receive a gradient in each step: with one backward a step, a chunk is stepped with a zero
// gradient for a member that got none (a plain AdamW would skip that parameter); with deferred
// updates in one process, that step is refused naming the parameter unless updates in the last
// backward stepped chunks already (Note [Deferred updates]).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "nn/module.h"
#include "offload/gemini/chunk.h"
#include "offload/gemini/chunk_search.h"
#include "offload/gemini/copy_worker.h"
#include "offload/gemini/placement.h"
#include "offload/gemini/tensor_state.h"
#include "offload/gemini/trace.h"
#include "offload/io/io_engine.h"
#include "offload/io/swap_space.h"
#include "optim/hybrid_adam.h"

namespace mw::gemini {

enum class Policy { kStatic, kAuto, kConst };
Policy parse_policy(const std::string& text);  // static|auto|const; InvalidArgument otherwise
const char* policy_name(Policy p);

struct GeminiOptions {
  Policy policy = Policy::kStatic;
  Device device = Device::sim(0);
  double offload_param_frac = 0.0;  // static: chunks homed on the host, in chunk order
  double offload_optim_frac =
      0.0;  // static: chunks whose gradients and Adam states are on the host
  int64_t const_budget_bytes = int64_t{512} << 20;  // const: cap on gathered chunks
  // auto: the share of the capacity kept free beyond the measured non-model reserve; < 0 picks the
  // device's default (Note [Auto margin] in gemini.cpp).
  double auto_margin = -1.0;
  // auto: ColossalAI's gpu_margin_mem_ratio (Note [Chunks moved to the device], margin.cpp): the
  // share of the device memory the warmup's plan never needs that chunks may take for good after
  // the warmup, homed on the device with their gradients and Adam states and stepped there. 0:
  // none (ColossalAI's default). Not with host_capacity_bytes or sharding.
  double gpu_margin_mem_ratio = 0.0;
  int64_t chunk_numel = 0;  // 0: search (Note [Chunk-size search])
  // Parameter names in first-use order (record_use_order): the packing order; empty: parameter
  // order (Note [First-use order], use_order.h).
  std::vector<std::string> use_order;
  ChunkSearchOptions search;
  optim::HybridAdamOptions adam;
  // Per tensor (the layout's order), whether the weight decay applies to it; empty: to all. The
  // chunks' and pieces' ranges follow (Note [Weight decay by ranges], optim/decay_ranges.h).
  std::vector<char> tensor_decays;
  // Note [16-bit copies]: BF16 or F16 (autocast's dtype of the run): the tensors flagged in
  // low_copy_tensors (per tensor, the layout's order: weights that only autocast's products
  // read) go after the others in each chunk, and a chunk homed in RAM, or sharded (all_gathered
  // in 16 bits: Note [16-bit gathers]), has them in that dtype in its device copy whenever the
  // forward that needs it runs under that autocast; F32: every copy f32.
  DType low_copies = DType::F32;
  std::vector<char> low_copy_tensors;
  // Three tiers (Note [Three tiers] in gemini.cpp): host RAM for chunks and optimizer states;
  // 0 = unlimited. What does not fit goes to disk under nvme_dir ("" = a private directory).
  int64_t host_capacity_bytes = 0;
  std::string nvme_dir;
  // Note [Disk reads through the host] (tiers.cpp): disk-homed chunks are read into a host buffer
  // and copied to the device. Always so on cuda (O_DIRECT cannot land in device memory); on sim
  // (host memory) only when set, which the tests do to run that path.
  bool disk_reads_through_host = false;
  // Note [Copy worker]: with a plan (auto, const), RAM-homed chunks the next two ops need are
  // copied to the device while the current op computes: by a thread of ours on sim, on a copy
  // stream on CUDA.
  bool copy_worker = false;
  // The three tiers' budget counts the RAM-homed chunks' gradients kept until step(): set it when
  // set_deferred_updates(true) will follow without updates as reductions complete in every
  // backward (the trainer: --grad-accum, --grad-clip, fp16).
  bool keeps_gradients_until_step = false;
  bool verbose = true;  // print the search line and the auto plan
  // Note [Sharded optimizer states] (shard.cpp): with shard_ranks > 1, this rank's HybridAdam
  // holds and steps only its piece of each chunk (ZeRO stage 2 on chunks); the gradients are
  // reduce_scattered into those pieces and the updated pieces all_gathered
  // (set_gradient_reduction).
  int shard_rank = 0, shard_ranks = 1;
  // Note [Sharded parameters] (shard.cpp): with shard_ranks > 1, the first chunks holding this
  // share of the bytes (chunk order, ColossalAI's shard_param_frac: 1 is ZeRO stage 3) keep only
  // this rank's piece of their parameters, all_gathered around each run of ops that uses them.
  // Each such chunk, and each chunk homed on disk (Note [Three tiers under data parallel]), takes
  // rank 0's values from broadcast_from_rank0 (when set) as it is filled.
  double shard_param_frac = 0.0;
  std::function<void(const Tensor& t)> broadcast_from_rank0;
};

// Note [Chunks moved to the device] (margin.cpp): InvalidArgument, naming --gpu-margin-mem-ratio,
// unless gpu_margin_mem_ratio is 0, or in [0, 1] under auto without host_capacity_bytes and
// sharding. Gemini's constructor checks it; gpt2_train too, before building the model.
void check_gpu_margin(const GeminiOptions& options);

// A rank's piece of a chunk under sharded states: elements [offset, offset + numel) of the chunk
// (numel 0: the rank has none of it). Every rank's piece starts at rank * stride, where stride =
// ceil(chunk numel / ranks), so the collectives work on stride x ranks elements.
struct ChunkPiece {
  int64_t offset = 0, numel = 0, stride = 0;
};
ChunkPiece chunk_piece(int64_t chunk_numel, int rank, int ranks);

// Counters of one iteration (take_step_stats) or of the whole run (run_stats).
struct GeminiStats {
  int64_t h2d_bytes = 0, d2h_bytes = 0;
  int64_t nvme_read_bytes = 0, nvme_write_bytes = 0;
  int64_t gathers = 0;
  int64_t prefetches = 0;  // gathers started ahead of their op (Note [Prefetch])
  int64_t evictions = 0;   // forced by room (releases after a last use are not counted)
  double prefetch_wait_ms = 0;
  double shard_gather_ms =
      0;  // ops waiting for sharded chunks' all_gathers (Note [Sharded parameters])
  int64_t host_chunk_peak_bytes = 0;  // host bytes of chunks: homes, parked, gradient buffers
  // Chunk copies gathered on the device at once, in their bytes (16-bit copies at 2 an element):
  // what auto's available bytes and const's budget cap (beyond them only one op's own chunks).
  int64_t gathered_peak_bytes = 0;
  int64_t off_plan = 0;             // iterations (or evaluations) whose ops left the recorded plan
  int64_t updated_in_backward = 0;  // chunks (Note [Updates as reductions complete])
  int64_t pressure_evictions = 0;   // of `evictions`: for a refused allocation (pressure.cpp)
  int64_t landed_prefetches = 0;    // sharded prefetches the device refused, gathered into RAM
};

// Note [Deferred updates]: a later micro-batch's gradient on another device than its chunk's
// buffer is added in slices of this many elements (16 MiB of f32), so the host holds no second
// copy.
inline constexpr int64_t kAddSliceNumel = int64_t{1} << 22;

class Gemini : public optim::Optimizer {
 public:
  // Packs `model`'s parameters (created on the cpu) into chunks and installs its hooks. The model
  // must outlive the optimizer's use; hooks do nothing once the optimizer is gone.
  Gemini(nn::Module& model, GeminiOptions options);
  // Note [Streaming construction]: a model larger than RAM is built straight into its chunks. The
  // layout comes from the tensors' names and shapes (in parameter order); the model's constructor
  // takes each parameter from make_parameter (a view into its chunk, uninitialised) and calls
  // parameter_ready once the values are set: a chunk homed on disk is written and its RAM freed as
  // soon as its last tensor is ready, so RAM holds one chunk at a time. attach() then adopts the
  // model (copying in any parameter not built in place).
  Gemini(GeminiOptions options, const std::vector<std::pair<std::string, Shape>>& tensors);
  Tensor make_parameter(const std::string& name);
  void parameter_ready(const std::string& name);
  void attach(nn::Module& model);
  ~Gemini() override;
  void step() override;
  std::string name() const override { return "gemini"; }
  int64_t state_bytes_in_memory() const override { return adam_->state_bytes_in_memory(); }

  const ChunkSearchResult& search() const { return search_; }
  const std::vector<std::unique_ptr<Chunk>>& chunks() const { return chunks_; }
  optim::HybridAdam& adam() { return *adam_; }
  const GeminiOptions& options() const { return options_; }
  // Note [Sharded parameters]: whether some chunks keep only this rank's piece of their
  // parameters, the bytes of those pieces here, and the elements of those chunks.
  bool shards_parameters() const { return sharded_param_bytes_ > 0; }
  int64_t sharded_param_bytes() const { return sharded_param_bytes_; }
  int64_t sharded_numel() const { return sharded_numel_; }
  // The bytes one all_gather of every sharded chunk moves into a rank's copies in a training
  // op: 4 per element, or the 16-bit gathers' slots (Note [16-bit gathers], low_copies.cpp).
  int64_t sharded_gather_bytes() const;
  bool warmed_up() const { return !recording_; }
  // auto, after warmup: the least device memory any schedule needs (the largest, over ops, of
  // that op's non-model memory plus its chunks, plus the chunks homed on the device).
  int64_t lower_bound_bytes() const { return lower_bound_bytes_; }
  // Note [Chunks moved to the device]: the chunks gpu_margin_mem_ratio moved after the warmup.
  int chunks_moved_to_device() const { return moved_chunks_; }
  int64_t illegal_transitions() const { return states_.illegal_transitions(); }
  GeminiStats take_step_stats();
  const GeminiStats& run_stats() const { return run_; }
  // One line: chunks, sizes, homes, the policy's budget.
  std::string describe() const;
  // The recorded ops of the warmup iteration (names and chunks), for tests and the trace.
  const std::vector<TraceOp>& trace_ops() const { return trace_; }
  const std::vector<int64_t>& nonmodel_bytes() const { return nonmodel_; }
  void set_trace(Trace* trace) { trace_out_ = trace; }
  // The engine moving NVMe-homed chunks (null without them), for fault-injection tests.
  io::IoEngine* io_engine() { return engine_.get(); }
  int64_t nvme_chunk_bytes() const;

  // Note [Deferred updates] (deferred.cpp): with --grad-clip or --grad-accum, no chunk is stepped
  // in backward; chunk gradient buffers accumulate over the step's backwards and step() updates
  // every chunk. Set between steps.
  void set_deferred_updates(bool on);
  bool deferred_updates() const { return deferred_; }
  // Whether the coming backward is the step's last (default true): then each chunk's gradient is
  // final when complete, and its share of the norm is taken at once. Called before each backward
  // of a step, it also marks where that backward begins (Note [Deferred updates]).
  void set_final_backward(bool final);
  // Note [Updates as reductions complete] (deferred.cpp): under data parallel, with nothing that
  // needs every gradient before the first update (no clipping, accumulation or loss scaling), each
  // chunk is updated in backward once its reduction completes; Note [Updates in the last
  // backward]: with accumulation alone, in the last micro-batch's backward, once complete (one
  // process or several). Needs deferred updates.
  void set_updates_as_reduced(bool on);
  // Note [Gemini under data parallel] (deferred.cpp): with several ranks, `start` begins summing a
  // chunk's gradient buffer over the ranks in place (an asynchronous all_reduce; it returns the
  // wait), as soon as the step's last backward completes the chunk; the sum is then multiplied by
  // `scale` (1/N) before the norm and the update. Needs deferred updates and no disk tier; set
  // between steps.
  struct GradientReduction {
    std::function<std::function<void()>(const Tensor& grad)> start;
    float scale = 1.f;
    // Sharded states instead (Note [Sharded optimizer states]): the sum's piece of each rank
    // (input: ranks x stride elements, output: stride), every rank's updated piece to every rank
    // (input: stride, output: ranks x stride), and a double summed over the ranks (the norm).
    struct Started {
      std::function<void()> wait;  // throws the communicator's error
      std::function<bool()> done;  // without blocking
    };
    using Collective = std::function<Started(const Tensor& in, const Tensor& out)>;
    Collective reduce_scatter, all_gather;
    std::function<double(double)> sum_over_ranks;
    // Sharded parameters (Note [Sharded parameters]): rank 0's value on every rank.
    std::function<int64_t(int64_t)> from_rank0;
  };
  void set_gradient_reduction(GradientReduction reduction);
  // After the step's last backward, deferred mode: the global L2 norm of every gradient, summed
  // in the plain run's order (Note [Norm order], optim/grad_norm.h).
  double grad_norm();
  // Note [Evaluation forward]: forwards without backward (no_grad) between steps.
  void begin_eval();
  void end_eval();
  // Counters of the last evaluation (kept out of the steps' counters).
  const GeminiStats& eval_stats() const { return eval_stats_; }
  // Runs fn with every parameter readable on its home tier: disk-homed chunks are read into RAM
  // for the call and freed after (saving a model, tests), sharded chunks gathered into RAM (then
  // every rank must call it: Note [Sharded parameters]). Between steps only.
  void with_parameters_readable(const std::function<void()>& fn);
  // Note [Abandoning a step]: closes an iteration that an exception left open (abandon.cpp).
  // Afterwards the parameters can be read and saved, and any further step or op is refused.
  void abandon_step();
  // With deferred updates, after the backwards and before step(): drops the step's gradients,
  // stepping nothing, and training goes on (a loss scaler's overflow, Note [Loss scaling under
  // Gemini] in train/trainer.cpp).
  void skip_step();
  bool failed() const { return failed_; }
  // The same, one disk-homed chunk at a time (Note [Streaming save], models/gpt2/hf_io.cpp): fn
  // gets `touch(name)`, which makes that parameter readable, reading its chunk in and freeing
  // the chunk read before it; RAM holds at most one disk-homed chunk. Between steps only. With
  // sharded parameters every rank calls it and rank 0's fn alone runs (stream_sharded).
  using Touch = std::function<void(const std::string& name)>;
  void with_parameters_streamed(const std::function<void(const Touch& touch)>& fn);

 private:
  struct ModuleInfo {
    std::string name;
    std::vector<size_t> tensors;
    std::vector<int> chunks;  // distinct, in first-member order
    bool needs_data_in_backward = true;
    int64_t last_op = -1;
    double op_start_us = 0;  // for the trace's op slices
  };
  void layout(const std::vector<std::pair<std::string, Shape>>& tensors);
  void install_hooks(nn::Module& model);
  void pre_op(nn::Module& m, bool backward);
  void end_use(nn::Module& m, TensorState after);
  void on_grad_ready(size_t tensor);
  void finish_chunk(Chunk& c);
  void gather(Chunk& c, const std::string& why, DType dtype = DType::F32);
  // Note [16-bit copies]: the dtype an op's use of chunk c wants, and the device bytes a gather
  // of c takes under the plan (the run's training forward).
  DType copy_dtype_for(Chunk& c, bool backward);
  DType prefetch_dtype(const Chunk& c, int64_t t, int64_t u) const;  // op u's, asked at op t
  int64_t planned_copy_bytes(const Chunk& c) const;
  Tensor widened_gradient(const Tensor& g, Device grad_device);
  std::vector<char> low_copy_flags() const;  // per tensor, checked
  void choose_low_chunks();
  void set_chunk_views();
  // Note [16-bit gathers] (low_copies.cpp): the bytes each rank sends for a sharded chunk's
  // 16-bit all_gather, and the collective started.
  int64_t low_gather_slot(const Chunk& c, DType dtype) const;
  std::function<void()> start_low_shard_gather(Chunk& c, DType dtype);
  void release(Chunk& c, bool eviction);
  void make_room(const std::vector<int>& need, int64_t t);
  // Note [Memory pressure] (pressure.cpp).
  void install_pressure_handler();
  void remove_pressure_handler();
  void arm_pressure(bool armed);
  bool relieve_pressure(int64_t nbytes);
  AllocatorStats make_device_room(int64_t bytes);
  // A sharded chunk's copy moved to the host for pressure, and back for its op.
  std::function<void()> start_prefetch_gather(Chunk& c, int64_t op, DType dtype);
  // MW_GEMINI_PREFETCH_OOM=1 (tests): every prefetch's memory refused, as a full device's would.
  static bool refuses_prefetches();
  void spill_shard(Chunk& c);
  void unspill_shard(Chunk& c);
  void forget_spill(Chunk& c);  // before releasing a spilled copy
  struct PressurePause {        // Gemini's own code runs with the handler off, then `then`
    Gemini& g;
    bool then;
    PressurePause(Gemini& gemini, bool armed_after) : g(gemini), then(armed_after) {
      g.pressure_armed_ = false;
    }
    ~PressurePause() { g.arm_pressure(then); }
    PressurePause(const PressurePause&) = delete;
    PressurePause& operator=(const PressurePause&) = delete;
  };
  bool pinned(const Chunk& c) const;
  void sample_nonmodel();
  void close_interval();
  void build_plan();
  void move_chunks_to_device();  // margin.cpp
  void plan_tiers(optim::HybridAdamOptions& adam);
  void bring_home(Chunk& c);
  void poll_pending(bool wait);
  void throttle_updates(uint64_t ticket);  // tiers.cpp, Note [Three tiers]
  void write_back_stepped();               // abandon.cpp
  bool settle_pending(size_t k, bool block);
  void forget_gathered(Chunk& c, int64_t copy_bytes);
  void prefetch_after(int64_t t);
  void wait_inflight(Chunk& c);
  double await_copy(Chunk& c, const std::function<void()>& wait);
  void refuse_if_failed() const;
  void track_host(int64_t delta);
  void track_gathered(int64_t delta);  // gathered_bytes_ and its peaks
  bool planned() const;
  // auto's plan, and the prefetch of sharded chunks under any policy (Note [Shard prefetch]).
  bool samples_nonmodel() const { return options_.policy == Policy::kAuto || shards_parameters(); }
  const NextUse& plan_next() const { return evaluating_ ? *eval_next_ : *next_; }
  int64_t plan_ops() const;
  void complete_deferred(Chunk& c);
  void begin_backward();  // Note [Deferred updates]: no tensor has arrived in it yet
  void refuse_missing_gradients() const;
  void add_gradient(Chunk& c, const ChunkMember& member, const Tensor& g, Device grad_device);
  void take_norm_parts(Chunk& c);
  void spill_grads(bool all);
  void restore_grad(Chunk& c);
  void poll_spills(bool wait);
  void step_deferred();
  void settle_reductions();
  void drop_spill(Chunk& c);
  // Note [Sharded optimizer states] (shard.cpp).
  bool sharded() const { return options_.shard_ranks > 1; }
  bool reducing() const { return reduction_.start || reduction_.reduce_scatter; }
  ChunkPiece piece(const Chunk& c) const;
  optim::NoDecayRanges piece_no_decay(const Chunk& c, const ChunkPiece& p) const;
  int64_t grad_buffer_numel(const Chunk& c) const;
  void settle_reduction(Chunk& c);
  void start_reduction(Chunk& c);
  void settle_piece(Chunk& c);
  void settle_done_pieces();
  void update_piece(Chunk& c, bool gather = true);
  void update_reduced(size_t keep);
  void forget_grads_in_ram(const Chunk& c);
  Tensor copy_piece_out(const Chunk& c) const;
  void finish_gather(bool all);
  double sharded_norm();
  // Note [Sharded parameters] (shard.cpp).
  void shard_chunk(Chunk& c);
  void read_piece(Chunk& c);  // Note [Pieces on disk]
  void drop_piece_if_idle(Chunk& c);
  void piece_into_ram(Chunk& c);
  bool keeps_piece_for_update(int64_t op) const;
  void drop_kept_pieces();
  void start_piece_read(Chunk& c);
  void settle_piece_reads();
  void gather_shard(Chunk& c, Device where, DType dtype = DType::F32);
  void stream_sharded(const std::function<void(const Touch& touch)>& fn,
                      const std::function<void(Chunk& c)>& local);
  std::function<void()> start_shard_gather(Chunk& c, Device where, int64_t op,
                                           DType dtype = DType::F32);
  void plan_shard_prefetch();
  void prefetch_shards(int64_t t);
  void join_shard_gather(Chunk& c);
  int64_t device_model_bytes() const { return gathered_bytes_ + device_home_bytes_; }
  double now_us() const;

  GeminiOptions options_;
  ChunkSearchResult search_;
  std::vector<std::string> names_;
  std::vector<Shape> shapes_;
  std::unordered_map<std::string, size_t> index_of_;
  std::vector<int64_t> filled_;  // per chunk: members with their values
  std::vector<bool> params_off_, to_disk_, shard_params_;
  std::vector<bool> low_chunk_;      // Note [16-bit copies]: may be gathered in 16 bits
  std::vector<DType> forward_copy_;  // per chunk: the dtype its forward use gathered
  int64_t sharded_param_bytes_ = 0, sharded_numel_ = 0;
  optim::HybridAdamOptions adam_options_;
  std::vector<size_t> chunk_of_;  // tensor -> chunk
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::unordered_map<const nn::Module*, ModuleInfo> modules_;
  TensorStates states_{{}};
  std::vector<int> in_use_;  // per tensor: uses in progress (Note [Gemini hooks])
  std::vector<bool> optim_on_host_;
  std::unique_ptr<optim::HybridAdam> adam_;
  std::shared_ptr<char> alive_ = std::make_shared<char>(0);

  // Residency.
  std::vector<int> gathered_;  // offloaded chunks with a device copy
  int64_t gathered_bytes_ = 0, device_home_bytes_ = 0;
  // The plan (Note [OPT eviction]): recorded on the warmup iteration.
  bool recording_ = true;
  bool failed_ = false;         // Note [Abandoning a step]
  int64_t stepped_chunks_ = 0;  // chunks handed to HybridAdam this iteration
  bool off_plan_ = false;
  int64_t op_ = 0;  // ops so far this iteration
  // Note [Memory pressure]: forward/backward on compute_thread_. Atomic: the handler reads them on
  // whichever thread allocates (the activation offloader's worker, too).
  std::atomic<bool> pressure_armed_{false};
  std::atomic<std::thread::id> compute_thread_{};
  std::vector<TraceOp> trace_;
  std::vector<std::pair<const nn::Module*, bool>> trace_keys_;
  std::vector<int64_t> nonmodel_, avail_;
  int64_t period_nonmodel_bytes_ = 0;  // Note [Non-model memory]
  std::unique_ptr<NextUse> next_;
  int64_t lower_bound_bytes_ = 0;
  // Note [Chunks moved to the device]: their Adam states and gradient buffers on the device.
  int64_t device_state_bytes_ = 0;
  int moved_chunks_ = 0;
  double margin_ = 0;

  // Three tiers: NVMe-homed chunks' blobs, and chunks on their way back to disk after an update.
  std::unique_ptr<io::IoEngine> engine_;
  std::unique_ptr<io::SwapSpace> swap_;
  struct PendingWrite {
    int chunk = 0;
    uint64_t update_ticket = 0;  // HybridAdam::update_done
    io::IoHandle write;
    bool writing = false;
    bool piece = false;  // a sharded chunk's piece (Note [Pieces on disk], shard.cpp)
  };
  io::IoHandle start_write_back(const PendingWrite& w);
  int64_t write_back_bytes(const PendingWrite& w) const;
  void drop_written_back(const PendingWrite& w);  // its blob is current: free the RAM copy
  std::vector<PendingWrite> pending_;
  std::deque<uint64_t> queued_updates_;  // RAM-homed chunks' updates on the updater thread
  // A disk read into a gathered chunk's device copy, through `bounce` when the device's memory is
  // not the host's (Note [Disk reads through the host]).
  // Or a RAM-homed chunk's copy on the worker (Note [Copy worker]).
  struct DiskRead {
    io::IoHandle io;
    AlignedBuffer bounce;
    void* device_bytes = nullptr;
    CopyWorker::Handle copy;
    void join() const {  // never throws: a read's failure stays with its handle
      io.join();
      copy.join();
    }
  };
  DiskRead start_disk_read(Chunk& c, void* device_bytes);
  void finish_disk_read(Chunk& c, DiskRead& read);
  // Note [Prefetch]: disk reads of chunks gathered ahead of their op, by chunk.
  std::unordered_map<int, DiskRead> inflight_;
  std::unique_ptr<CopyWorker> copier_;  // Note [Copy worker]
  void start_prefetch(Chunk& c, DType dtype);
  // Note [Pieces on disk] (shard.cpp): disk-homed pieces read ahead of their gather, by chunk.
  std::unordered_map<int, io::IoHandle> piece_reads_;

  // Note [Deferred updates]: chunks with gradients in RAM on their way to disk, oldest first;
  // the chunks whose gradient buffer (disk-homed chunks only) is in RAM, oldest first; per tensor,
  // its block partials of the squared norm, whether its chunk's buffer holds a gradient of it, and
  // whether its gradient arrived in the current backward.
  bool deferred_ = false, final_backward_ = true, updating_ = false;
  std::vector<char> grad_in_buffer_, arrived_in_backward_;
  struct Spill {
    int chunk = 0;
    Tensor buffer;
    io::IoHandle write;
  };
  std::vector<Spill> spills_;
  std::vector<int> grads_in_ram_;
  std::vector<std::vector<double>> norm_parts_;
  // Note [Gemini under data parallel]: per chunk, the wait of its reduction in flight.
  GradientReduction reduction_;
  std::vector<std::function<void()>> reducing_;
  // Note [Sharded optimizer states]: per chunk, its HybridAdam parameter (-1: no piece here), this
  // rank's piece of the reduced gradient and its sum of squares; the all_gathers in flight.
  std::vector<int> adam_index_;
  std::vector<std::function<bool()>> reduced_;  // per chunk in flight: its reduce_scatter is done
  bool updates_as_reduced_ = false;             // Note [Updates as reductions complete]
  std::vector<int> reduced_order_;              // chunks whose reductions started, not yet updated
  std::vector<Tensor> piece_grads_;
  std::vector<double> piece_norm_sq_;
  struct Gathering {
    int chunk = 0;
    Tensor in, out;
    std::function<void()> wait;
  };
  std::vector<Gathering> gathering_;
  // Stepped pieces of replicated chunks waiting for their update before their all_gather.
  struct Stepping {
    int chunk = 0;
    uint64_t ticket = 0;  // HybridAdam::update_done
    // A disk-homed chunk's updated piece, its RAM copy freed (park_stepped): defined while
    // `write` takes it to disk, then only there (on_disk).
    Tensor piece;
    io::IoHandle write;
    bool on_disk = false;
  };
  std::vector<Stepping> stepping_;
  void start_piece_gathers(bool all);
  void park_stepped(bool all);
  // Note [Shard prefetch]: whether every rank agreed to gather the next op's sharded chunks
  // ahead, and the waits of those all_gathers in flight, by chunk.
  bool prefetch_shards_ = false;
  std::unordered_map<int, std::function<void()>> shard_inflight_;
  std::vector<int> spilled_;  // Note [Memory pressure]: sharded copies on the host
  // Note [Evaluation forward]: the warmup's forward ops, their next uses, and the counters the
  // evaluation interrupted.
  bool evaluating_ = false;
  int64_t eval_ops_ = 0;
  std::unique_ptr<NextUse> eval_next_;
  GeminiStats saved_iter_, eval_stats_;

  GeminiStats iter_, run_;  // this iteration's counters, the run's
  int64_t host_chunk_bytes_ = 0;
  Trace* trace_out_ = nullptr;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

// begin_eval / end_eval on every exit path (an exception in an evaluation forward included).
class EvalScope {
 public:
  explicit EvalScope(Gemini& g) : g_(g) { g_.begin_eval(); }
  ~EvalScope() { g_.end_eval(); }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  Gemini& g_;
};

}  // namespace mw::gemini
