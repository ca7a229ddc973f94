// ZeRO stage 3 for DataParallel: the parameters sharded by bucket, gathered around each op that
// uses them (data_parallel.h).
//
// Note [ZeRO stage 3]: rank r keeps piece r of each bucket's parameters (param_shard, which its
// optimizer steps in place: m and v of the same elements, on NVMe too); every parameter is a view
// into its bucket's full storage (Note [Parameters in chunks], offload/gemini/chunk.h: the layers
// and the saved tensors of the graph follow it), which is released between uses. The model is
// built into the buckets (Note [Streaming construction], offload/gemini/gemini.h, the same
// pattern): a bucket's storage exists from its first parameter's make_parameter until its last
// parameter is ready, then rank 0's values are broadcast, the piece kept and the storage released;
// buckets are contiguous runs of the parameters, so construction holds about one bucket. A rank
// therefore holds Psi/N of parameters plus the buckets in use, from start-up on. Every parameter
// use is a module call (Note [Every parameter use is a module call], nn/module.h), and hooks make
// each use an *op*: its forward pre-hook, or its backward pre-hook (except an embedding's, whose
// backward reads only the ids), all_gathers the buckets the op needs before it runs; its forward or
// backward hook ends the use.
// What happens between ops is decided by the order of the ops:
//  - the first iteration (one optimizer step: every micro-batch's forward and backward, the
//    recomputations of checkpointed segments included) is recorded, with every bucket released as
//    soon as no op in progress uses it (the least memory, more gathers);
//  - afterwards each op follows the record: while op t runs, the buckets of op t+1 are gathered
//    (prefetch, on the communicator's progress thread), and when op t ends, a bucket that op t+1
//    does not use is released. So a bucket is gathered once per run of consecutive ops that use
//    it: once in forward and once in backward for a bucket of one block's layers; the tied wte
//    once at the embedding and once more for the LM head's forward and backward, which are
//    consecutive. That is the 3 Psi of ZeRO-3's volume (2 Psi of all_gather, Psi of
//    reduce_scatter), up to buckets spanning several blocks;
//  - an op that is not the recorded one (an evaluation forward without no-grad, a different
//    sequence) leaves the plan for the rest of the iteration: the first iteration's rule again.
//    Forwards without grad mode never touch the record.
// Evaluation and sampling are forwards like any other (without grad mode: a bucket per op, never
// recorded); saving streams the buckets one at a time in the writer's order (stream_parameters).
// Every rank runs the same ops in the same order, hence the same collectives in the same order
// (MPI's rule; sampling too: the same logits give the same ids everywhere). A rank whose hooks saw
// another sequence would mismatch its collectives, which MPI leaves undefined (an error, wrong
// values, or a wait that the communicator's timeout ends).
#include <algorithm>
#include <chrono>

#include "autograd/autocast.h"
#include "autograd/autograd.h"
#include "core/convert.h"
#include "core/numbers.h"
#include "nn/layers.h"
#include "offload/gemini/rank0_stream.h"
#include "train/data_parallel.h"

namespace mw::train {

namespace {

bool contains(const std::vector<size_t>& v, size_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<dist::Communicator> comm,
                           const std::vector<std::pair<std::string, Shape>>& layout,
                           int64_t bucket_bytes, Device device, LowGathers low)
    : comm_(std::move(comm)), zero_stage_(3), device_(device), low_(std::move(low)) {
  check_device(device);  // Note [Buckets on CUDA]: NCCL's device, or host memory for MPI
  MW_CHECK_T(InvalidArgument,
             (low_.dtype == DType::F32 || is_low_precision(low_.dtype)) &&
                 (low_.tensors.empty() || low_.tensors.size() == layout.size()) &&
                 (low_.dtype == DType::F32 || !low_.tensors.empty()),
             "ZeRO 3: 16-bit gathers need a bf16 or f16 dtype and a flag per tensor (",
             dtype_name(low_.dtype), ", ", low_.tensors.size(), " flags for ", layout.size(),
             " tensors)");
  for (const auto& [name, shape] : layout) {
    index_of_.emplace(name, names_.size());
    names_.push_back(name);
    shapes_.push_back(shape);
    numels_.push_back(shape_numel(shape));
  }
  build_buckets(bucket_bytes);
  for (Bucket& b : buckets_) {
    b.params_full = Storage::create(0, device_);
    b.params_full->resize_uninitialized(b.padded * 4);  // released: no bytes until built
  }
}

Tensor DataParallel::make_parameter(const std::string& name) {
  auto it = index_of_.find(name);
  MW_CHECK_T(InvalidArgument, it != index_of_.end(), "ZeRO 3: no parameter '", name,
             "' in the layout");
  Bucket& b = buckets_[bucket_of_[it->second]];
  if (b.params_full->is_released()) b.params_full->materialize();
  return Tensor::from_storage(b.params_full, b.members[member_of_[it->second]].offset,
                              shapes_[it->second], contiguous_strides(shapes_[it->second]),
                              DType::F32);
}

void DataParallel::parameter_ready(const std::string& name) {
  Bucket& b = buckets_[bucket_of_[index_of_.at(name)]];
  if (++b.ready < static_cast<int>(b.members.size())) return;
  Tensor full = Tensor::from_storage(b.params_full, 0, {b.padded}, {1}, DType::F32);
  if (b.padded > b.numel) full.narrow(0, b.numel, b.padded - b.numel).zero_();  // the padding
  comm_->broadcast(full, 0).wait();  // the same initial weights everywhere: rank 0's
  b.param_shard.copy_(full.narrow(0, comm_->rank() * b.piece, b.piece));
  b.params_full->release();
}

void DataParallel::adopt(nn::Module& model) {
  MW_CHECK(shards_parameters() && params_.empty(), "DataParallel::adopt: stage 3, once");
  auto named = model.named_parameters();
  MW_CHECK_T(InvalidArgument, named.size() == names_.size(), "ZeRO 3: the model has ", named.size(),
             " parameters, the layout ", names_.size());
  for (size_t i = 0; i < named.size(); ++i) {
    const Bucket& b = buckets_[bucket_of_[i]];
    MW_CHECK_T(InvalidArgument,
               named[i].first == names_[i] && named[i].second.storage() == b.params_full &&
                   b.ready == static_cast<int>(b.members.size()),
               "ZeRO 3: parameter ", i, " '", named[i].first,
               "' was not built in its bucket (expected '", names_[i], "' from make_parameter)");
    params_.push_back(named[i].second);
  }
  install_gradient_hooks();
  install_module_hooks(model);
}

void DataParallel::install_module_hooks(nn::Module& model) {
  std::unordered_map<const TensorImpl*, size_t> index;
  for (size_t i = 0; i < params_.size(); ++i) index[params_[i].impl()] = i;
  std::weak_ptr<char> alive = alive_;
  for (auto& [name, m] : model.named_modules()) {
    if (m->own_parameters().empty()) continue;
    ModuleUse use;
    use.needs_data_in_backward = dynamic_cast<nn::Embedding*>(m) == nullptr;
    for (auto& [pname, t] : m->own_parameters()) {
      auto it = index.find(t.impl());
      MW_CHECK(it != index.end(), "DataParallel: module '", name, "' owns '", pname,
               "', which is not among the parameters given");
      if (!contains(use.buckets, bucket_of_[it->second]))
        use.buckets.push_back(bucket_of_[it->second]);
    }
    uses_.emplace(m, std::move(use));
    m->add_forward_pre_hook([this, alive](nn::Module& mod, const Tensor&) {
      if (!alive.expired()) pre_op(mod, false);
    });
    m->add_forward_hook([this, alive](nn::Module& mod, const Tensor&, const Tensor&) {
      if (!alive.expired()) end_op(mod, false);
    });
    m->add_backward_pre_hook([this, alive](nn::Module& mod) {
      if (!alive.expired()) pre_op(mod, true);
    });
    m->add_backward_hook([this, alive](nn::Module& mod) {
      if (!alive.expired()) end_op(mod, true);
    });
  }
}

void DataParallel::start_gather(Bucket& b, DType dtype) {
  if (b.residency != Bucket::Residency::kReleased) return;
  b.gathered_dtype = dtype;
  b.params_full->resize_uninitialized(dtype == DType::F32 ? b.padded * 4 : size() * b.slot);
  b.params_full->materialize();  // receives the collective (16 bits: the slots, Note [16-bit ...])
  gathered_bytes_ += b.params_full->nbytes();
  if (uncounted_ == 0) {  // the steps' figures; gather_all holds every bucket by definition
    stats_.gathered_peak_bytes = std::max(stats_.gathered_peak_bytes, gathered_bytes_);
    ++stats_.parameter_gathers;
  }
  b.gather_work =
      dtype != DType::F32
          ? start_low_gather(b)
          : comm_->all_gather(b.param_shard,
                              Tensor::from_storage(b.params_full, 0, {b.padded}, {1}, DType::F32));
  b.residency = Bucket::Residency::kGathering;
}

void DataParallel::finish_gather(Bucket& b) {
  if (b.residency != Bucket::Residency::kGathering) return;
  const auto t0 = std::chrono::steady_clock::now();
  b.gather_work.wait();
  if (b.gathered_dtype != DType::F32) place_low_runs(b);
  if (uncounted_ == 0)
    stats_.parameter_wait_ms +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  b.residency = Bucket::Residency::kGathered;
}

void DataParallel::release(Bucket& b) {
  if (b.residency == Bucket::Residency::kReleased) return;
  finish_gather(b);  // the collective writes into the bytes until it completes
  if (b.gathered_dtype != DType::F32) retype(b, DType::F32);
  b.params_full->release();
  gathered_bytes_ -= b.params_full->nbytes();
  b.residency = Bucket::Residency::kReleased;
}

bool DataParallel::next_op_uses(int64_t op, size_t bucket) const {
  if (op < 0 || static_cast<size_t>(op) + 1 >= ops_.size()) return false;
  return contains(uses_.at(ops_[static_cast<size_t>(op) + 1].module).buckets, bucket);
}

void DataParallel::pre_op(nn::Module& m, bool backward) {
  ModuleUse& use = uses_.at(&m);
  if ((backward && !use.needs_data_in_backward)) return;
  use.op = -1;
  // A training iteration's op (backward runs without grad mode; a forward with it, recomputations
  // too): recorded, followed, or off the plan.
  if (backward || grad_enabled()) {
    const Op op{&m, backward, backward ? DType::F32 : autocast_dtype()};
    if (recording_)
      ops_.push_back(op);
    else if (on_plan_ && cursor_ < ops_.size() && ops_[cursor_] == op)
      use.op = static_cast<int64_t>(cursor_++);
    else
      on_plan_ = false;
  }
  if (use.op < 0)  // no plan: nothing gathered but what is in use
    for (size_t k = 0; k < buckets_.size(); ++k)
      if (buckets_[k].pins == 0 && !contains(use.buckets, k)) release(buckets_[k]);
  for (size_t k : use.buckets) {  // gathered in the dtype this op reads (a prefetch may differ)
    Bucket& b = buckets_[k];
    const DType dtype = gather_dtype(b, backward, autocast_dtype());
    if (b.residency != Bucket::Residency::kReleased && b.gathered_dtype != dtype) {
      MW_CHECK(b.pins == 0, "ZeRO 3: bucket ", k, " is in use in ", dtype_name(b.gathered_dtype),
               " by another op, and this one reads it in ", dtype_name(dtype));
      release(b);
    }
    if (!backward) b.forward_dtype = dtype;
    start_gather(b, dtype);
  }
  for (size_t k : use.buckets) {
    finish_gather(buckets_[k]);
    ++buckets_[k].pins;
  }
  if (use.op >= 0 && static_cast<size_t>(use.op) + 1 < ops_.size()) {  // prefetch the next op's
    const Op& next = ops_[static_cast<size_t>(use.op) + 1];
    for (size_t k : uses_.at(next.module).buckets)
      start_gather(buckets_[k], gather_dtype(buckets_[k], next.backward, next.autocast));
  }
}

void DataParallel::end_op(nn::Module& m, bool backward) {
  ModuleUse& use = uses_.at(&m);
  if ((backward && !use.needs_data_in_backward)) return;
  for (size_t k : use.buckets) {
    Bucket& b = buckets_[k];
    if (b.pins > 0) --b.pins;
    if (b.pins == 0 && !next_op_uses(use.op, k)) release(b);
  }
  use.op = -1;
}

void DataParallel::end_iteration() {
  for (Bucket& b : buckets_) {
    b.pins = 0;  // a use whose end hook never fired (none in GPT-2) ends here
    release(b);
  }
  if (recording_) {  // the report tells the recorded iteration's traffic apart
    stats_.recorded_gathers = stats_.parameter_gathers;
    stats_.recorded_comm = comm_->stats();
  }
  recording_ = false;
  on_plan_ = true;
  cursor_ = 0;
}

// Note [Streaming from rank 0] (offload/gemini/rank0_stream.h): rank 0's writer announces each
// bucket it needs; every rank gathers it.
void DataParallel::stream_parameters(const std::function<void(const Touch& touch)>& write) {
  MW_CHECK(shards_parameters() && !uses_.empty(), "stream_parameters: ZeRO 3 after adopt");
  UncountedScope uncounted(this);
  gemini::Rank0Stream s;
  s.root = comm_->rank() == 0;
  s.from_rank0 = [&](int64_t k) {  // in the communicator's memory (NCCL: the device)
    Tensor next = Tensor::full({1}, static_cast<double>(k), DType::I64).to(comm_device());
    comm_->broadcast(next, 0).wait();
    return next.to(Device::cpu()).data<int64_t>()[0];
  };
  s.gather = [&](int64_t k) {  // in f32: the masters' values
    Bucket& b = buckets_[static_cast<size_t>(k)];
    if (b.gathered_dtype != DType::F32) release(b);
    start_gather(b, DType::F32);
    finish_gather(b);
  };
  s.release = [&](int64_t k) { release(buckets_[static_cast<size_t>(k)]); };
  gemini::stream_from_rank0(s, [&](const std::function<void(int64_t)>& need) {
    write([&](const std::string& name) {
      need(static_cast<int64_t>(bucket_of_[index_of_.at(name)]));
    });
  });
}

}  // namespace mw::train
