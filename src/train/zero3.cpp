// ZeRO stage 3 for DataParallel: the parameters sharded by bucket, gathered around each op that
// uses them (data_parallel.h).
//
// Note [ZeRO stage 3]: after the initial broadcast, rank r keeps piece r of each bucket's
// parameters (param_shard, which its optimizer steps in place: m and v of the same elements, on
// NVMe too) and every member parameter is re-pointed into the bucket's full storage (Note
// [Parameters in chunks], offload/gemini/chunk.h: the layers and the saved tensors of the graph
// follow), which is released: a rank holds Psi/N of parameters between uses. Every parameter use is
// a module call (Note [Every parameter use is a module call], nn/module.h), and hooks make each
// use an *op*: its forward pre-hook, or its backward pre-hook (except an embedding's, whose
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
// Evaluation, sampling and saving happen between steps with every bucket gathered (FullParameters,
// collective), so they cost Psi of memory for their duration. Every rank runs the same ops in the
// same order, hence the same collectives in the same order (MPI's rule); a rank whose hooks see a
// different sequence would mismatch its collectives and fail on the communicator's timeout.
// The model is built whole on every rank before it is sharded (no lazy initialisation): the peak
// at start-up is Psi of parameters.
#include <algorithm>
#include <chrono>

#include "autograd/autograd.h"
#include "core/numbers.h"
#include "nn/layers.h"
#include "train/data_parallel.h"

namespace mw::train {

namespace {

bool contains(const std::vector<size_t>& v, size_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

void DataParallel::attach_model(nn::Module& model) {
  MW_CHECK(shards_parameters() && uses_.empty(), "DataParallel::attach_model: stage 3, once");
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
      if (!contains(use.buckets, bucket_of_[it->second])) use.buckets.push_back(bucket_of_[it->second]);
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

void DataParallel::shard_parameters() {
  MW_CHECK(!uses_.empty(), "DataParallel: stage 3 needs attach_model before broadcast_parameters");
  const Device device = params_[0].device();
  for (Bucket& b : buckets_) {
    for (const Segment& s : b.segments)
      b.param_shard.narrow(0, s.piece_offset, s.numel)
          .copy_(flat_param(s.param).narrow(0, s.param_offset, s.numel));
    b.params_full = Storage::create(0, device);
    b.params_full->resize_uninitialized(b.padded * 4);  // released: no bytes until gathered
    for (const Member& m : b.members) {  // the old storage goes with its last view
      params_[m.param].impl()->storage = b.params_full;
      params_[m.param].impl()->offset = m.offset;
    }
  }
}

void DataParallel::start_gather(Bucket& b) {
  if (b.residency != Bucket::Residency::kReleased) return;
  b.params_full->materialize();
  gathered_bytes_ += b.params_full->nbytes();
  if (full_depth_ == 0) {  // the steps' figures; gather_all holds every bucket by definition
    stats_.gathered_peak_bytes = std::max(stats_.gathered_peak_bytes, gathered_bytes_);
    ++stats_.parameter_gathers;
  }
  b.gather_work = comm_->all_gather(
      b.param_shard, Tensor::from_storage(b.params_full, 0, {b.padded}, {1}, DType::F32));
  b.residency = Bucket::Residency::kGathering;
}

void DataParallel::finish_gather(Bucket& b) {
  if (b.residency != Bucket::Residency::kGathering) return;
  const auto t0 = std::chrono::steady_clock::now();
  b.gather_work.wait();
  if (full_depth_ == 0)
    stats_.parameter_wait_ms +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  b.residency = Bucket::Residency::kGathered;
}

void DataParallel::release(Bucket& b) {
  if (b.residency == Bucket::Residency::kReleased) return;
  finish_gather(b);  // the collective writes into the bytes until it completes
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
  if (full_depth_ > 0 || (backward && !use.needs_data_in_backward)) return;
  use.op = -1;
  // A training iteration's op (backward runs without grad mode; a forward with it, recomputations
  // too): recorded, followed, or off the plan.
  if (backward || grad_enabled()) {
    const Op op{&m, backward};
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
  for (size_t k : use.buckets) start_gather(buckets_[k]);
  for (size_t k : use.buckets) {
    finish_gather(buckets_[k]);
    ++buckets_[k].pins;
  }
  if (use.op >= 0 && static_cast<size_t>(use.op) + 1 < ops_.size())  // prefetch the next op's
    for (size_t k : uses_.at(ops_[static_cast<size_t>(use.op) + 1].module).buckets)
      start_gather(buckets_[k]);
}

void DataParallel::end_op(nn::Module& m, bool backward) {
  ModuleUse& use = uses_.at(&m);
  if (full_depth_ > 0 || (backward && !use.needs_data_in_backward)) return;
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

void DataParallel::gather_all() {
  if (!shards_parameters()) return;
  if (full_depth_++ > 0) return;
  try {
    const dist::CommStats before = comm_->stats();
    for (Bucket& b : buckets_) start_gather(b);
    for (Bucket& b : buckets_) finish_gather(b);
    exclude_comm_since(before);  // between steps: not the training steps' communication
  } catch (...) {
    --full_depth_;
    throw;
  }
}

void DataParallel::release_all() {
  if (!shards_parameters() || full_depth_ == 0 || --full_depth_ > 0) return;
  for (Bucket& b : buckets_)
    if (b.pins == 0) release(b);
}

}  // namespace mw::train
