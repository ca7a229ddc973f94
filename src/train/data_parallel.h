// Data parallel training and ZeRO stages 1-3 for the Trainer (docs/distributed.md).
//
// Note [Gradient buckets]: the parameters are grouped, in the reverse of their registration order
// (roughly the order backward finishes them), into buckets of about --bucket-mb each, a bucket's
// element count padded to a multiple of the number of ranks N. A grad-ready hook copies each final
// gradient into its bucket and releases it; the bucket's collective starts as soon as its last
// gradient has arrived, on the communicator's progress thread, while backward goes on. After
// backward the trainer waits for the rest and divides by N (the global batch's mean gradient).
//   stage 0 (plain data parallel): all_reduce of each bucket; every rank steps every parameter.
//   stage 1: reduce_scatter of each bucket; rank r keeps piece r of every bucket's gradient sum and
//            steps only those elements (its optimizer holds views of them: m and v for 1/N of the
//            parameters, on NVMe too), then all_gather of each bucket's pieces rebuilds the
//            parameters everywhere. The full-size bucket buffers stay allocated (Psi floats).
//   stage 2: as stage 1, but a bucket's full-size buffer is freed as soon as its reduce_scatter
//            has completed, so gradients cost Psi/N plus the buckets in flight: at most two (a
//            third waits for the oldest) beside the one being filled.
//   stage 3: as stage 2, and the parameters too are sharded by bucket: rank r keeps piece r of
//            each bucket's parameters, which its optimizer steps in place; the full parameters
//            exist only while an op uses them (Note [ZeRO stage 3], zero3.cpp).
// Volume per rank and step (ring algorithms): 2 Psi (N-1)/N elements in stages 0-2, 3 Psi (N-1)/N
// in stage 3 (the parameters are gathered once for forward and once more for backward).
//
// Every rank builds the same buckets and starts the same collectives in the same order (MPI's
// rule): the hooks fire in the engine's deterministic order, and buckets with a parameter that got
// no gradient start after backward, in bucket order.
//
// Note [Split embedding reduction]: GPT-2's tied wte gets the LM head's dense [V, C] gradient at
// the start of backward and the embedding's B*T rows only at its very end. Reduced as one final
// gradient, its bucket (most of the volume: 31% of GPT-2 small, 72% of a narrow model) could only
// start when backward ends. A rows-ready hook (Note [Rows-ready hooks]) instead copies the LM
// head's part into the bucket as soon as it is final and zeroes the pending rows in the engine's
// buffer, so the embedding's rows arrive there alone (0 + x is exact). The bucket's collective
// sums the dense parts across ranks during the rest of backward; the rows, different on every
// rank, are all_gathered after backward (a count per rank, then ids and values padded to the
// largest count: B*T/N rows of C floats, against V*C) and added to the sum in rank order, the same
// on every rank; ZeRO stages add only the elements of this rank's piece. The sum is a different
// rounding of the same terms (the dense parts first, then each rank's rows).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "dist/communicator.h"
#include "nn/module.h"

namespace mw::train {

// Elements [offset, offset + numel) of parameter `param` (the model's order): one optimizer
// parameter of a ZeRO rank (Note [ZeRO checkpoints], zero_state_file.h).
struct ShardPiece {
  size_t param = 0;
  int64_t offset = 0, numel = 0;
};

// Note [Gradient buckets]'s grouping: the element counts of the buckets, in the order their
// collectives start (the reverse of `numels`, the parameters' registration order), each about
// `bucket_bytes` of f32 and at least one parameter. The memory plan sizes its rows from them.
std::vector<int64_t> bucket_numels(const std::vector<int64_t>& numels, int64_t bucket_bytes);

struct DataParallelStats {
  dist::CommStats comm;
  // waiting for gradient collectives after backward, and in it for stage 2-3's third reduction
  // (exposed)
  double backward_end_wait_ms = 0;
  double gather_ms = 0;               // the parameter all_gather after the step (stages 1-2)
  int64_t gradient_buffer_bytes = 0;  // persistent bucket and shard buffers
  // Stage 3: this rank's parameter pieces; the most bytes of full (gathered) parameters at once
  // during the steps; the waits of ops for their parameters' all_gather (exposed) and how many
  // gathers there were (saving's, between steps, not counted).
  int64_t parameter_shard_bytes = 0, gathered_peak_bytes = 0;
  double parameter_wait_ms = 0;
  int64_t parameter_gathers = 0;
  // Stage 3: the first iteration's gathers and collectives (recorded with the fewest buckets
  // gathered, so more of them: Note [ZeRO stage 3]); the report shows the later steps apart.
  int64_t recorded_gathers = 0;
  dist::CommStats recorded_comm;
  int64_t split_reductions = 0;  // Note [Split embedding reduction], summed over steps
  int64_t steps = 0;
};

// Note [16-bit parameter gathers] (zero3_low.cpp): `tensors` flags, per layout entry, those that
// only autocast's products read; each stage-3 bucket puts them after its f32 members. Under an
// autocast of `dtype` (bf16 or f16; F32: never) they are all_gathered in 2 bytes.
struct LowGathers {
  DType dtype = DType::F32;
  std::vector<char> tensors;
};
// The byte at which element `element` of a 16-bit gathered bucket starts, its first `f32_part`
// elements f32; and the slot every rank sends its run of `piece` elements in, over `ranks`.
inline int64_t low_copy_byte(int64_t f32_part, int64_t element) {
  return element <= f32_part ? element * 4 : f32_part * 4 + (element - f32_part) * 2;
}
int64_t low_gather_slot(int64_t f32_part, int64_t piece, int64_t ranks);

class DataParallel {
 public:
  // Stages 0-2, over the parameters of a built model.
  DataParallel(std::shared_ptr<dist::Communicator> comm, std::vector<Tensor> params, int zero_stage,
               int64_t bucket_bytes);
  // Stage 3 (Note [ZeRO stage 3], zero3.cpp): the model is built into the buckets from its layout
  // (names and shapes in parameter order): the model's constructor takes each parameter from
  // make_parameter and calls parameter_ready once its values are set; when a bucket's last
  // parameter is ready, rank 0's values are broadcast, this rank keeps its piece and the bucket's
  // memory is released, so a rank never holds more than the buckets being built. adopt() then
  // installs the hooks. Collective from the first parameter_ready on.
  DataParallel(std::shared_ptr<dist::Communicator> comm,
               const std::vector<std::pair<std::string, Shape>>& layout, int64_t bucket_bytes,
               Device device, LowGathers low = LowGathers());
  Tensor make_parameter(const std::string& name);
  void parameter_ready(const std::string& name);
  void adopt(nn::Module& model);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  bool shards_parameters() const { return zero_stage_ == 3; }
  // Stage 3, between steps: write(touch) runs on rank 0, where touch(name) makes that parameter
  // readable (its bucket gathered, the bucket gathered before released); the other ranks take part
  // in the same gathers, in rank 0's order (it announces each bucket). Collective; RAM holds one
  // bucket beyond the pieces. Saving uses it (Note [Streaming save], models/gpt2/hf_io.cpp).
  using Touch = std::function<void(const std::string& name)>;
  void stream_parameters(const std::function<void(const Touch& touch)>& write);
  // Stage 3: the bytes one gather of every bucket under the run's autocast puts on the wire,
  // summed over the ranks' sends (f32: the padded parameters x 4 B; Note [16-bit parameter
  // gathers]: the 16-bit parts in 2 B).
  int64_t gather_bytes() const;
  DType low_gathers() const { return low_.dtype; }

  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  int zero_stage() const { return zero_stage_; }
  dist::Communicator& comm() { return *comm_; }
  // Rank 0's parameters to every rank (before the first step: the same initial weights). Stage 3
  // did so while the model was built.
  void broadcast_parameters();
  // What the optimizer steps: the parameters (stage 0), or 1-D views of this rank's pieces.
  const std::vector<Tensor>& optimizer_params() const { return optimizer_params_; }
  int64_t shard_numel() const;
  // Stages 1-2: what rank `rank`'s optimizer steps, in its order (optimizer_params() of that rank).
  // Every rank can ask for every rank's: the buckets are the same everywhere.
  std::vector<ShardPiece> pieces(int rank) const;
  const std::vector<Tensor>& params() const { return params_; }
  // The next backward is the last of the update (gradient accumulation: the earlier ones
  // accumulate locally); its grad-ready hooks start the bucket collectives.
  void arm() { armed_ = true; }
  // After the last backward: starts what is left, waits, divides by N and sets the optimizer
  // parameters' gradients.
  void finish_gradients();
  // Stages 1-2, after the optimizer step: every rank's updated pieces to every rank (stage 3: none,
  // the pieces are gathered when used).
  void gather_parameters();
  // The mean of `value` over ranks (the step's loss).
  double mean_over_ranks(double value);
  // The sum of `value` over ranks (in a tensor on the communicator's device: NCCL's on CUDA).
  double sum_over_ranks(double value) const;
  // Where the collectives' tensors live: the NCCL rank's CUDA device, else cpu.
  Device comm_device() const;
  // The global L2 norm of the averaged gradients (stages 1-2: summed over the ranks' pieces).
  double grad_norm() const;
  // Leaves out of stats() the collectives since `before` (a checkpoint's, Note [ZeRO checkpoints]),
  // so that the report counts training steps only.
  void exclude_comm_since(const dist::CommStats& before);
  // The same for everything between begin_uncounted and end_uncounted (evaluation, sampling and
  // saving between steps; under ZeRO 3 their gathers too). Nestable.
  void begin_uncounted();
  void end_uncounted();
  DataParallelStats stats() const;
  std::string describe() const;  // one line for the setup output
  // Gemini reduces its own chunks' gradients (Note [Gemini under data parallel]): the time the
  // step waited for them after backward, for the report.
  void add_backward_end_wait_ms(double ms) { stats_.backward_end_wait_ms += ms; }

 private:
  struct Member {
    size_t param;
    int64_t offset, numel;  // in the bucket
  };
  struct Segment {  // this rank's piece of a bucket, one parameter at a time
    size_t param;
    int64_t param_offset, numel, piece_offset;
  };
  struct Bucket {
    std::vector<Member> members;
    std::vector<Segment> segments;
    int64_t numel = 0, padded = 0, piece = 0;
    int64_t pending = 0;
    std::vector<char> filled;
    Tensor buffer;      // [padded]: gradients in, (stage 1) parameters gathered
    Tensor shard_grad;  // [piece]: stages 1-2
    dist::Work work;
    bool launched = false;
    // Stage 3: this rank's piece of the parameters (what its optimizer steps), and the storage of
    // the full parameters, of which every member parameter is a view; released between uses.
    Tensor param_shard;
    std::shared_ptr<Storage> params_full;
    enum class Residency { kReleased, kGathering, kGathered } residency = Residency::kReleased;
    dist::Work gather_work;
    // Note [16-bit parameter gathers]: the members before f32_part are f32 ones; a 16-bit gather
    // sends each rank's run in `slot` bytes, received in place and moved down after the wait.
    int64_t f32_part = 0, slot = 0;
    DType gathered_dtype = DType::F32, forward_dtype = DType::F32;
    int pins = 0;   // ops using the parameters now
    int ready = 0;  // members built (construction)
  };
  // Note [ZeRO stage 3] (zero3.cpp).
  struct ModuleUse {
    std::vector<size_t> buckets;
    bool needs_data_in_backward = true;
    int64_t op = -1;  // its place in the recorded iteration while in use, or -1
  };
  struct Op {
    const nn::Module* module;
    bool backward;
    DType autocast = DType::F32;  // a forward's autocast dtype
    bool operator==(const Op&) const = default;
  };
  void install_gradient_hooks();
  void install_module_hooks(nn::Module& model);
  void pre_op(nn::Module& m, bool backward);
  void end_op(nn::Module& m, bool backward);
  bool next_op_uses(int64_t op, size_t bucket) const;
  void start_gather(Bucket& b, DType dtype);
  void finish_gather(Bucket& b);
  // Note [16-bit parameter gathers].
  void put_f32_members_first(Bucket& b);
  DType gather_dtype(const Bucket& b, bool backward, DType autocast) const;
  static int64_t copy_byte(const Bucket& b, int64_t element) {
    return low_copy_byte(b.f32_part, element);
  }
  dist::Work start_low_gather(Bucket& b);
  void place_low_runs(Bucket& b);
  void retype(Bucket& b, DType dtype);
  void release(Bucket& b);
  void end_iteration();
  void build_buckets(int64_t bucket_bytes);
  // Note [Buckets on CUDA]: parameters on the communicator's memory (host, or NCCL's device), and
  // a bucket-sized buffer there (cpu for the host backends).
  void check_device(const Device& d) const;
  Tensor buffer(int64_t numel, bool zeroed) const;
  static std::vector<Segment> segments_of(const Bucket& b, int64_t rank);  // rank's piece of b
  void on_grad_ready(size_t param);
  // Note [Split embedding reduction].
  void on_rows_ready(size_t param, const Tensor& partial, const std::vector<int64_t>& rows);
  void add_gathered_rows();
  void launch(Bucket& b);
  void throttle_reductions();
  Tensor flat_param(size_t param) const;  // a 1-D view of the parameter's storage

  std::shared_ptr<dist::Communicator> comm_;
  std::vector<Tensor> params_, optimizer_params_;
  int zero_stage_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_, member_of_;
  struct RowsGradient {  // Note [Split embedding reduction], per parameter, this update only
    bool early = false;  // the dense part is in its bucket; the rows come separately
    std::vector<int64_t> rows;
    std::vector<float> values;  // rows.size() x C: the embedding's rows
  };
  std::vector<RowsGradient> rows_grad_;
  std::vector<size_t> launch_order_;  // buckets, as launched in this update
  bool armed_ = false;
  std::shared_ptr<char> alive_ = std::make_shared<char>(0);
  DataParallelStats stats_;
  dist::CommStats excluded_;  // exclude_comm_since
  // Stage 3: the uses of each parameter-owning module, the ops of the first iteration (recorded),
  // and where this iteration is in them.
  std::unordered_map<const nn::Module*, ModuleUse> uses_;
  std::vector<Op> ops_;
  bool recording_ = true, on_plan_ = true;
  size_t cursor_ = 0;
  int uncounted_ = 0;  // begin_uncounted depth: not the steps' collectives
  dist::CommStats uncounted_since_;
  int64_t gathered_bytes_ = 0;
  // The layout (stage 3 builds the model from it) and where the buckets' memory lives.
  std::vector<int64_t> numels_;
  std::vector<std::string> names_;
  std::vector<Shape> shapes_;
  std::unordered_map<std::string, size_t> index_of_;
  Device device_ = Device::cpu();
  LowGathers low_;
};

// Evaluation, sampling or saving between steps: left out of the data-parallel report (a no-op
// without data parallelism).
class UncountedScope {
 public:
  explicit UncountedScope(DataParallel* dp) : dp_(dp) {
    if (dp_) dp_->begin_uncounted();
  }
  ~UncountedScope() {
    if (dp_) dp_->end_uncounted();
  }
  UncountedScope(const UncountedScope&) = delete;
  UncountedScope& operator=(const UncountedScope&) = delete;

 private:
  DataParallel* dp_;
};

}  // namespace mw::train
