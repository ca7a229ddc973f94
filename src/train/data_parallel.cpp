// DataParallel: gradient buckets, their collectives, ZeRO pieces and the parameter all_gather
// (data_parallel.h, Note [Gradient buckets]).
#include "train/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <functional>

#include "autograd/autograd.h"
#include "core/numbers.h"
#include "core/ops.h"
#include "optim/grad_norm.h"

namespace mw::train {

namespace {

using clock = std::chrono::steady_clock;

double ms_since(clock::time_point t) {
  return std::chrono::duration<double, std::milli>(clock::now() - t).count();
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<dist::Communicator> comm, std::vector<Tensor> params,
                           int zero_stage, int64_t bucket_bytes)
    : comm_(std::move(comm)), params_(std::move(params)), zero_stage_(zero_stage) {
  MW_CHECK_T(InvalidArgument, zero_stage_ >= 0 && zero_stage_ <= 2, "--zero ", zero_stage_,
             ": expected 0, 1 or 2 here; stage 3 builds the model into its buckets (the layout "
             "constructor)");
  for (const Tensor& p : params_) {
    MW_CHECK_T(InvalidArgument, p.dtype() == DType::F32 && p.is_contiguous(),
               "data parallel training takes contiguous f32 parameters; found ", p.desc());
    check_device(p.device());
  }
  for (const Tensor& p : params_) numels_.push_back(p.numel());
  if (!params_.empty()) device_ = params_[0].device();
  build_buckets(bucket_bytes);
  install_gradient_hooks();
}

// Note [Buckets on CUDA]: the NCCL backend takes tensors on its rank's CUDA device only, so there
// the buckets, the gradient pieces and the all_gather buffers live beside the parameters, and
// scaling, zeroing and copying them are the device's ops, queued on the compute stream: a
// collective starts behind them (Note [NCCL stream order]) and a kernel queued after its wait()
// reads its result. On cpu and sim they are host memory, read by these loops, as the memory plan
// counts them. The embedding's split reduction reads rows on the host: over device memory its
// gradient takes the whole-gradient path (the rows-ready hook declines). ZeRO 3 keeps its pieces
// and gathers its buckets on the device too (zero3.cpp): a released bucket's memory returns to
// the caching allocator while kernels that read it may still be queued, and a later gather may
// get it; NCCL writes it only after everything queued on the compute stream (the same Note).
void DataParallel::check_device(const Device& d) const {
  const std::optional<Device> m = comm_->required_memory();
  MW_CHECK_T(InvalidArgument, m ? d == *m : !d.is_cuda(), "data parallel over the ",
             comm_->backend(), " backend takes ",
             m ? str("tensors on ", m->str(), m->is_cuda() ? " (this rank's NCCL device)" : "")
               : std::string("tensors in host memory (cpu or sim)"),
             "; found one on ", d.str(),
             d.is_cuda() ? " (on CUDA, pass --dist nccl)" : " (NCCL takes CUDA tensors)");
}

Tensor DataParallel::buffer(int64_t numel, bool zeroed) const {
  const Device d = comm_device();
  return zeroed ? Tensor::zeros({numel}, DType::F32, d) : Tensor::empty({numel}, DType::F32, d);
}

void DataParallel::install_gradient_hooks() {
  rows_grad_.resize(params_.size());
  std::weak_ptr<char> alive = alive_;
  for (size_t i = 0; i < params_.size(); ++i) {
    add_grad_ready_hook(params_[i], [this, alive, i](const Tensor&) {
      if (alive.lock()) on_grad_ready(i);
    });
    // Row ids travel as floats in the gather: exact below 2^24 rows.
    if (params_[i].dim() == 2 && params_[i].size(0) < (int64_t{1} << 24))
      add_grad_rows_ready_hook(params_[i], [this, alive, i](const Tensor&, const Tensor& partial,
                                                            const std::vector<int64_t>& rows) {
        if (alive.lock()) on_rows_ready(i, partial, rows);
        return std::function<void()>();
      });
  }
}

// Nothing to wait for: a collective still in flight holds its own references to the buffers it
// reads and writes (communicator.h), and waiting could block an exiting rank on a dead peer.
DataParallel::~DataParallel() = default;

Tensor DataParallel::flat_param(size_t param) const { return params_[param].detach().view({-1}); }

namespace {

// A parameter of `numel` elements opens a new bucket after one of `bucket_numel` elements.
bool opens_bucket(int64_t bucket_numel, int64_t numel, int64_t cap) {
  return bucket_numel > 0 && bucket_numel + numel > cap;
}

}  // namespace

std::vector<int64_t> bucket_numels(const std::vector<int64_t>& numels, int64_t bucket_bytes) {
  const int64_t cap = std::max<int64_t>(1, bucket_bytes / 4);
  std::vector<int64_t> out;
  for (size_t k = numels.size(); k-- > 0;) {  // reverse registration order
    if (out.empty() || opens_bucket(out.back(), numels[k], cap)) out.push_back(0);
    out.back() += numels[k];
  }
  return out;
}

void DataParallel::build_buckets(int64_t bucket_bytes) {
  const int64_t n = comm_->size(), r = comm_->rank();
  const int64_t cap = std::max<int64_t>(1, bucket_bytes / 4);
  bucket_of_.assign(numels_.size(), 0);
  member_of_.assign(numels_.size(), 0);
  for (size_t k = numels_.size(); k-- > 0;) {  // reverse registration order, as bucket_numels
    if (buckets_.empty() || opens_bucket(buckets_.back().numel, numels_[k], cap))
      buckets_.emplace_back();
    Bucket& b = buckets_.back();
    bucket_of_[k] = buckets_.size() - 1;
    member_of_[k] = b.members.size();
    b.members.push_back({k, b.numel, numels_[k]});
    b.numel += numels_[k];
  }
  for (Bucket& b : buckets_) {
    b.padded = (b.numel + n - 1) / n * n;
    b.piece = b.padded / n;
    if (!low_.tensors.empty()) put_f32_members_first(b);  // Note [16-bit parameter gathers]
    b.filled.assign(b.members.size(), 0);
    if (zero_stage_ == 0) {
      b.buffer = buffer(b.padded, true);
      continue;
    }
    if (zero_stage_ == 1) b.buffer = buffer(b.padded, true);
    b.shard_grad = buffer(b.piece, true);
    b.segments = segments_of(b, r);
    // Stage 3: filled by shard_parameters; zeros past the last member (the padding).
    if (zero_stage_ == 3) b.param_shard = Tensor::zeros({b.piece}, DType::F32, device_);
  }
  for (Bucket& b : buckets_) {
    if (zero_stage_ == 0) continue;
    for (const Segment& s : b.segments) {
      Tensor v = zero_stage_ == 3 ? b.param_shard.narrow(0, s.piece_offset, s.numel)
                                  : flat_param(s.param).narrow(0, s.param_offset, s.numel);
      set_requires_grad(v);
      optimizer_params_.push_back(v);
    }
  }
  if (zero_stage_ == 0) optimizer_params_ = params_;
}

std::vector<DataParallel::Segment> DataParallel::segments_of(const Bucket& b, int64_t rank) {
  std::vector<Segment> out;
  const int64_t lo = rank * b.piece, hi = lo + b.piece;
  for (const Member& m : b.members) {
    const int64_t a = std::max(lo, m.offset), e = std::min(hi, m.offset + m.numel);
    if (a < e) out.push_back({m.param, a - m.offset, e - a, a - lo});
  }
  return out;
}

std::vector<ShardPiece> DataParallel::pieces(int rank) const {
  MW_CHECK_T(InvalidArgument, zero_stage_ > 0 && rank >= 0 && rank < comm_->size(),
             "DataParallel::pieces: rank ", rank, " of ", comm_->size(), " at ZeRO stage ",
             zero_stage_, " (stages 1-2 shard the optimizer)");
  std::vector<ShardPiece> out;
  for (const Bucket& b : buckets_)
    for (const Segment& s : segments_of(b, rank)) out.push_back({s.param, s.param_offset, s.numel});
  return out;
}

int64_t DataParallel::shard_numel() const {
  int64_t s = 0;
  for (const Tensor& p : optimizer_params_) s += p.numel();
  return s;
}

std::string DataParallel::describe() const {
  int64_t total = 0;
  for (const Bucket& b : buckets_) total += b.numel;
  const char* what[] = {"all_reduce of gradient buckets",
                        "reduce_scatter of gradients, "
                        "optimizer states sharded, all_gather of parameters",
                        "reduce_scatter of gradients (gradients and optimizer states sharded), "
                        "all_gather of parameters",
                        "parameters, gradients and optimizer states sharded: all_gather of "
                        "parameters before each use, reduce_scatter of gradients"};
  return str("Data parallel: ", comm_->size(), comm_->size() == 1 ? " rank (" : " ranks (",
             comm_->backend(), "), ZeRO stage ", zero_stage_, ": ", what[zero_stage_], "; ",
             buckets_.size(), " buckets of ", format_thousands(total),
             " parameters; this rank steps ", format_thousands(shard_numel()),
             low_.dtype == DType::F32
                 ? ""
                 : str("; under autocast the weights only matmuls read are gathered in ",
                       dtype_name(low_.dtype), " (Note [16-bit parameter gathers])"));
}

void DataParallel::broadcast_parameters() {
  if (shards_parameters()) return;  // done bucket by bucket while the model was built
  std::vector<dist::Work> works;
  for (const Tensor& p : params_) works.push_back(comm_->broadcast(p.detach(), 0));
  for (auto& w : works) w.wait();
}

void DataParallel::on_rows_ready(size_t param, const Tensor& partial,
                                 const std::vector<int64_t>& rows) {
  // An earlier micro-batch accumulates in place; an unusual buffer takes the whole-gradient path,
  // as every buffer does over a communicator of device memory (NCCL: Note [Buckets on CUDA]).
  if (!armed_ || partial.dtype() != DType::F32 || !partial.is_contiguous() ||
      !partial.device().is_host_addressable() || partial.shape() != params_[param].shape() ||
      comm_->required_memory())
    return;
  Bucket& b = buckets_[bucket_of_[param]];
  const Member& m = b.members[member_of_[param]];
  if (!b.buffer.defined()) b.buffer = buffer(b.padded, true);  // stage 2: a fresh buffer
  b.buffer.narrow(0, m.offset, m.numel).view(partial.shape()).copy_(partial);
  const int64_t C = partial.size(1);
  float* p = partial.data<float>();
  for (int64_t r : rows) std::fill(p + r * C, p + (r + 1) * C, 0.f);
  rows_grad_[param].early = true;
  rows_grad_[param].rows = rows;
  b.filled[member_of_[param]] = 1;
  if (++b.pending == static_cast<int64_t>(b.members.size())) launch(b);
}

void DataParallel::on_grad_ready(size_t param) {
  // Note [16-bit parameter gathers]: a weight read in 16 bits got a 16-bit gradient, widened as
  // autocast's cast would have (exact); the next micro-batch's adds to it in f32.
  if (const Tensor g = grad(params_[param]); g.defined() && g.dtype() != DType::F32)
    set_grad(params_[param], g.to(DType::F32));
  if (!armed_) return;  // an earlier micro-batch: the gradient accumulates in place
  if (RowsGradient& rg = rows_grad_[param]; rg.early) {  // the embedding's rows alone
    const Tensor g = grad(params_[param]).contiguous();
    const int64_t C = g.size(1);
    const float* x = g.data<float>();
    rg.values.resize(rg.rows.size() * static_cast<size_t>(C));
    for (size_t k = 0; k < rg.rows.size(); ++k)
      std::copy(x + rg.rows[k] * C, x + (rg.rows[k] + 1) * C, rg.values.data() + k * C);
    set_grad(params_[param], Tensor());
    return;  // its bucket counted it at the rows-ready hook
  }
  Bucket& b = buckets_[bucket_of_[param]];
  const Member& m = b.members[member_of_[param]];
  if (!b.buffer.defined()) b.buffer = buffer(b.padded, true);  // stage 2: a fresh buffer
  const Tensor g = grad(params_[param]);
  b.buffer.narrow(0, m.offset, m.numel).view(g.shape()).copy_(g);
  set_grad(params_[param], Tensor());  // the bucket holds it now
  b.filled[member_of_[param]] = 1;
  if (++b.pending == static_cast<int64_t>(b.members.size())) launch(b);
}

void DataParallel::launch(Bucket& b) {
  if (zero_stage_ >= 2) throttle_reductions();
  b.launched = true;
  launch_order_.push_back(static_cast<size_t>(&b - buckets_.data()));
  if (zero_stage_ == 0) {
    b.work = comm_->all_reduce(b.buffer);
    return;
  }
  b.work = comm_->reduce_scatter(b.buffer, b.shard_grad);
  if (zero_stage_ >= 2) b.buffer = Tensor();  // freed when the reduce_scatter has completed
}

// Stages 2-3 (Note [Gradient buckets]): at most two reduce_scatters in flight, so the host holds
// at most three full-size buckets (two being reduced, one being filled: the plan's three largest)
// however slow the collectives are. Before a third starts, the oldest is waited for, in launch
// order (a timed-out collective is the one reported); the wait counts as exposed. Measured: a
// 5-block 512-wide model at 2 ranks, --zero 3, one thread each, held all 3 buckets with 2 of
// them in flight, 161 MiB of host against 144.3 planned for two.
void DataParallel::throttle_reductions() {
  int busy = 0;
  for (size_t i : launch_order_) busy += !buckets_[i].work.done();
  const auto t0 = clock::now();
  for (size_t k = 0; busy >= 2 && k < launch_order_.size(); ++k) {
    Bucket& oldest = buckets_[launch_order_[k]];
    if (oldest.work.done()) continue;
    oldest.work.wait();
    --busy;
  }
  stats_.backward_end_wait_ms += ms_since(t0);
}

void DataParallel::finish_gradients() {
  armed_ = false;
  if (shards_parameters()) end_iteration();  // Note [ZeRO stage 3]
  // Parameters that got no gradient count zero; their buckets start now, in bucket order.
  for (Bucket& b : buckets_) {
    if (b.launched) continue;
    if (!b.buffer.defined()) b.buffer = buffer(b.padded, true);
    for (size_t j = 0; j < b.members.size(); ++j)
      if (!b.filled[j]) b.buffer.narrow(0, b.members[j].offset, b.members[j].numel).zero_();
    launch(b);
  }
  const auto t0 = clock::now();
  // In launch order: a timed-out collective is the one reported, not a later one it broke.
  for (size_t i : launch_order_) buckets_[i].work.wait();
  launch_order_.clear();
  add_gathered_rows();
  stats_.backward_end_wait_ms += ms_since(t0);
  const float inv = 1.f / static_cast<float>(comm_->size());
  for (Bucket& b : buckets_) {
    b.launched = false, b.pending = 0;
    std::fill(b.filled.begin(), b.filled.end(), 0);
    if (zero_stage_ == 0) {
      if (comm_->size() > 1) ops::scale_(b.buffer, inv);  // on its device (Note [Buckets on CUDA])
      for (const Member& m : b.members)
        set_grad(params_[m.param],
                 b.buffer.narrow(0, m.offset, m.numel).view(params_[m.param].shape()));
    } else {
      if (comm_->size() > 1) ops::scale_(b.shard_grad, inv);
    }
  }
  if (zero_stage_ > 0) {
    size_t k = 0;
    for (Bucket& b : buckets_)
      for (const Segment& s : b.segments)
        set_grad(optimizer_params_[k++], b.shard_grad.narrow(0, s.piece_offset, s.numel));
  }
  ++stats_.steps;
}

// Note [Split embedding reduction]: after the buckets' collectives, every rank's embedding rows are
// added to the summed dense part, in rank order; before the division by N.
void DataParallel::add_gathered_rows() {
  const int64_t n = comm_->size(), rank = comm_->rank();
  for (size_t param = 0; param < params_.size(); ++param) {
    RowsGradient& rg = rows_grad_[param];
    if (!rg.early) continue;
    rg.early = false;
    ++stats_.split_reductions;
    Tensor count = Tensor::full({1}, static_cast<double>(rg.rows.size()));
    Tensor counts = Tensor::empty({n});
    comm_->all_gather(count, counts).wait();
    const float* cs = counts.data<float>();
    const auto K = static_cast<int64_t>(*std::max_element(cs, cs + n));
    const int64_t C = params_[param].size(1), per_rank = K * (C + 1);
    if (K == 0) continue;
    Tensor mine = Tensor::zeros({per_rank}), all = Tensor::empty({n * per_rank});
    float* out = mine.data<float>();
    for (size_t k = 0; k < rg.rows.size(); ++k) out[k] = static_cast<float>(rg.rows[k]);
    std::copy(rg.values.begin(), rg.values.end(), out + K);
    comm_->all_gather(mine, all).wait();
    const Bucket& b = buckets_[bucket_of_[param]];
    const int64_t base = b.members[member_of_[param]].offset;
    // Stage 0: the whole bucket; stages 1-2: elements [lo, lo + piece) of it, in shard_grad.
    const int64_t lo = zero_stage_ == 0 ? 0 : rank * b.piece;
    const int64_t hi = zero_stage_ == 0 ? b.padded : lo + b.piece;
    float* dst = (zero_stage_ == 0 ? b.buffer : b.shard_grad).data<float>();
    for (int64_t r = 0; r < n; ++r) {
      const float* src = all.data<float>() + r * per_rank;
      for (int64_t k = 0; k < static_cast<int64_t>(cs[r]); ++k) {
        const int64_t first = base + static_cast<int64_t>(src[k]) * C;
        const int64_t a = std::max(first, lo), e = std::min(first + C, hi);
        for (int64_t i = a; i < e; ++i) dst[i - lo] += src[K + k * C + (i - first)];
      }
    }
  }
}

void DataParallel::gather_parameters() {
  if (zero_stage_ == 0 || zero_stage_ == 3) return;
  const auto t0 = clock::now();
  // At most two buckets in flight: stage 2 then holds two full-size buffers, not all of them.
  struct InFlight {
    Bucket* bucket;
    Tensor full;
    dist::Work work;
  };
  std::deque<InFlight> flight;
  auto complete = [&](InFlight& f) {
    f.work.wait();
    for (const Member& m : f.bucket->members)
      flat_param(m.param).copy_(f.full.narrow(0, m.offset, m.numel));
  };
  const int64_t r = comm_->rank();
  for (Bucket& b : buckets_) {
    Tensor piece = buffer(b.piece, true);
    for (const Segment& s : b.segments)
      piece.narrow(0, s.piece_offset, s.numel)
          .copy_(flat_param(s.param).narrow(0, s.param_offset, s.numel));
    (void)r;
    Tensor full = zero_stage_ == 1 ? b.buffer : buffer(b.padded, false);
    flight.push_back({&b, full, comm_->all_gather(piece, full)});
    if (flight.size() > 2) {
      complete(flight.front());
      flight.pop_front();
    }
  }
  for (InFlight& f : flight) complete(f);
  stats_.gather_ms += ms_since(t0);
}

Device DataParallel::comm_device() const {
  return comm_->required_memory().value_or(Device::cpu());
}

double DataParallel::sum_over_ranks(double value) const {
  Tensor t = Tensor::full({1}, value, DType::F64, comm_device());
  comm_->all_reduce(t).wait();
  return t.item();
}

double DataParallel::mean_over_ranks(double value) {
  if (comm_->size() == 1) return value;
  return sum_over_ranks(value) / static_cast<double>(comm_->size());
}

// Each rank's gradients (its pieces under ZeRO 1-3) in the blocks of Note [Norm order], reduced in
// parallel (a CUDA gradient on its device), then the ranks' sums added. Pieces cut the blocks
// elsewhere than whole parameters, so a sharded norm is the unsharded one within rounding, not bit
// for bit (measured: 2.9082881156108313 at ZeRO 0, 2.90828811561103 at ZeRO 1 and 2; the clip
// factor, rounded to float, was the same). It was one serial loop over the elements.
double DataParallel::grad_norm() const {
  double sum_sq = 0;
  std::vector<double> parts;
  for (const Tensor& p : optimizer_params_) {
    const Tensor g = grad(p);
    if (!g.defined()) continue;
    parts.clear();
    optim::append_block_squares(g.contiguous(), parts);
    sum_sq = optim::add_in_order(sum_sq, parts);
  }
  if (zero_stage_ > 0 && comm_->size() > 1) sum_sq = sum_over_ranks(sum_sq);
  return std::sqrt(sum_sq);
}

void DataParallel::exclude_comm_since(const dist::CommStats& before) {
  const dist::CommStats now = comm_->stats();
  for (int k = 0; k < dist::kNumCollectives; ++k) {
    excluded_.calls[k] += now.calls[k] - before.calls[k];
    excluded_.payload_bytes[k] += now.payload_bytes[k] - before.payload_bytes[k];
    excluded_.wire_bytes[k] += now.wire_bytes[k] - before.wire_bytes[k];
  }
  excluded_.busy_ms += now.busy_ms - before.busy_ms;
  excluded_.wait_ms += now.wait_ms - before.wait_ms;
}

void DataParallel::begin_uncounted() {
  if (uncounted_++ == 0) uncounted_since_ = comm_->stats();
}

void DataParallel::end_uncounted() {
  if (uncounted_ > 0 && --uncounted_ == 0) exclude_comm_since(uncounted_since_);
}

DataParallelStats DataParallel::stats() const {
  DataParallelStats s = stats_;
  s.comm = comm_->stats();
  for (int k = 0; k < dist::kNumCollectives; ++k) {
    s.comm.calls[k] -= excluded_.calls[k];
    s.comm.payload_bytes[k] -= excluded_.payload_bytes[k];
    s.comm.wire_bytes[k] -= excluded_.wire_bytes[k];
  }
  s.comm.busy_ms -= excluded_.busy_ms;
  s.comm.wait_ms -= excluded_.wait_ms;
  s.gradient_buffer_bytes = 0;
  for (const Bucket& b : buckets_) {
    if (zero_stage_ < 2 && b.buffer.defined()) s.gradient_buffer_bytes += b.buffer.nbytes();
    if (b.shard_grad.defined()) s.gradient_buffer_bytes += b.shard_grad.nbytes();
    if (b.param_shard.defined()) s.parameter_shard_bytes += b.param_shard.nbytes();
  }
  return s;
}

}  // namespace mw::train
