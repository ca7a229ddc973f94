// ZeRO checkpoints: Note [ZeRO checkpoints] (zero_state_file.h).
#include "train/zero_state_file.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <limits>

#include "core/error.h"
#include "optim/adam_state_file.h"
#include "optim/hybrid_adam.h"

namespace mw::train {

namespace {

constexpr int64_t kChunkNumel = int64_t{1} << 20;  // 4 MiB of f32 per broadcast

// A rank's run of a file tensor's elements: [offset, offset + numel) of the tensor are elements
// [at, at + numel) of that rank's piece `piece`.
struct Run {
  int rank = 0;
  size_t piece = 0;
  int64_t offset = 0, numel = 0, at = 0;
};

// One segment of the one-process file: elements [offset, offset + numel) of parameter `param`.
struct FileSegment {
  size_t param = 0;
  int64_t offset = 0, numel = 0;
};

// Per file tensor, every rank's runs of it, by offset; they tile the tensor. File tensor t is
// elements [offset, offset + numel) of the layout's parameter tensors[t].param.
std::vector<std::vector<Run>> runs_by_tensor(const ShardLayout& shards,
                                             const std::vector<FileTensor>& tensors) {
  std::vector<std::vector<std::pair<int, size_t>>> holders(shards.numels.size());  // (rank, piece)
  for (int r = 0; r < static_cast<int>(shards.pieces.size()); ++r)
    for (size_t k = 0; k < shards.pieces[static_cast<size_t>(r)].size(); ++k)
      holders[shards.pieces[static_cast<size_t>(r)][k].param].push_back({r, k});
  std::vector<std::vector<Run>> runs(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    const FileTensor& range = tensors[t];
    for (const auto& [r, k] : holders[range.param]) {
      const ShardPiece& piece = shards.pieces[static_cast<size_t>(r)][k];
      const int64_t a = std::max(range.offset, piece.offset);
      const int64_t e = std::min(range.offset + range.numel, piece.offset + piece.numel);
      if (a < e) runs[t].push_back({r, k, a - range.offset, e - a, a - piece.offset});
    }
    std::sort(runs[t].begin(), runs[t].end(),
              [](const Run& x, const Run& y) { return x.offset < y.offset; });
    int64_t next = 0;
    for (const Run& run : runs[t]) {
      MW_CHECK_T(Error, run.offset == next, "ZeRO pieces of file tensor ", t,
                 " do not tile it (a gap or overlap at element ", next, ")");
      next += run.numel;
    }
    MW_CHECK_T(Error, next == range.numel, "ZeRO pieces of file tensor ", t, " cover ", next,
               " of its ", range.numel, " elements");
  }
  return runs;
}

std::vector<FileSegment> file_segments(const OneProcessLayout& layout) {
  std::vector<FileSegment> out;
  for (size_t p = 0; p < layout.numels.size(); ++p) {
    const int64_t slice = layout.slice_numel[p] > 0 ? layout.slice_numel[p] : layout.numels[p];
    for (int64_t off = 0; off < layout.numels[p]; off += slice)
      out.push_back({p, off, std::min(slice, layout.numels[p] - off)});
  }
  return out;
}

// This rank's states, read by ranges of its pieces: HybridAdam's in memory or on NVMe (two
// slices cached, so that the v pass over a segment finds what the m pass read), or AdamW's.
class ShardStates {
 public:
  explicit ShardStates(optim::Optimizer& opt)
      : hybrid_(dynamic_cast<optim::HybridAdam*>(&opt)),
        adamw_(dynamic_cast<optim::AdamW*>(&opt)),
        step_(opt.step_count()) {
    MW_CHECK_T(InvalidArgument, hybrid_ || adamw_,
               "ZeRO checkpoints save HybridAdam or AdamW, not ", opt.name());
    int next = 0;
    for (size_t i = 0; i < opt.params().size(); ++i)
      nvme_index_.push_back(hybrid_ && hybrid_->offloaded(i) ? next++ : -1);
  }
  // Lowest and highest step count over elements [off, off + n) of piece k (0: no state yet).
  std::pair<int64_t, int64_t> steps(size_t k, int64_t off, int64_t n) const {
    if (nvme_index_[k] < 0) {
      const int64_t s = memory_state(k, 0).defined() ? step_ : 0;
      return {s, s};
    }
    optim::NvmeAdamStates& nvme = *hybrid_->nvme();
    const int64_t slice = nvme.slice_numel();
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
    for (int64_t j = off / slice; j * slice < off + n; ++j) {
      lo = std::min(lo, nvme.slice_step(nvme_index_[k], j));
      hi = std::max(hi, nvme.slice_step(nvme_index_[k], j));
    }
    return {lo, hi};
  }
  // m (which 0) or v (1) of elements [off, off + n) of piece k (zeros without a state).
  void read(size_t k, int64_t off, int64_t n, int which, float* out) {
    if (nvme_index_[k] < 0) {
      const Tensor& t = memory_state(k, which);
      if (!t.defined())
        std::fill(out, out + n, 0.f);
      else if (t.device().is_cuda())  // Note [Buckets on CUDA]: ZeRO 1-2 over NCCL
        std::memcpy(out, t.view({-1}).narrow(0, off, n).to(Device::cpu()).raw_data(), 4 * n);
      else
        std::memcpy(out, static_cast<const float*>(t.raw_data()) + off, 4 * n);
      return;
    }
    const int64_t slice = hybrid_->nvme()->slice_numel();
    for (int64_t done = 0; done < n;) {
      const int64_t j = (off + done) / slice, at = (off + done) - j * slice;
      const int64_t take = std::min(n - done, slice - at);
      const Cached& c = slice_of(nvme_index_[k], j);
      std::memcpy(out + done, (which == 0 ? c.m : c.v).data() + at, 4 * take);
      done += take;
    }
  }
  // Read-ahead of the NVMe pipeline again (read_slice stopped it); also where a failed save
  // leaves before finish() (optim::PrefetchPaused).
  ~ShardStates() { finish(); }
  ShardStates(const ShardStates&) = delete;
  ShardStates& operator=(const ShardStates&) = delete;
  void finish() {
    if (used_nvme_) hybrid_->nvme()->resume_prefetch();
    used_nvme_ = false;
  }

 private:
  struct Cached {
    int k = -1;
    int64_t j = -1;
    std::vector<float> m, v;
  };
  const Tensor& memory_state(size_t k, int which) const {
    if (hybrid_) return which == 0 ? hybrid_->exp_avg(k) : hybrid_->exp_avg_sq(k);
    return which == 0 ? adamw_->exp_avg(k) : adamw_->exp_avg_sq(k);
  }
  const Cached& slice_of(int k, int64_t j) {
    for (const Cached& c : cache_)
      if (c.k == k && c.j == j) return c;
    optim::NvmeAdamStates& nvme = *hybrid_->nvme();
    Cached& c = cache_[next_victim_];
    next_victim_ ^= 1;
    c.m.resize(static_cast<size_t>(nvme.slice_numel()));
    c.v.resize(c.m.size());
    nvme.read_slice(k, j, c.m.data(), c.v.data());
    c.k = k, c.j = j;
    used_nvme_ = true;
    return c;
  }
  optim::HybridAdam* hybrid_;
  optim::AdamW* adamw_;
  int64_t step_;
  std::vector<int> nvme_index_;  // per piece: its parameter in the NVMe store, or -1
  Cached cache_[2];
  int next_victim_ = 0;
  bool used_nvme_ = false;
};

// Step 2 of Note [ZeRO checkpoints]: each segment's step count, agreed by all ranks.
std::vector<int64_t> agreed_steps(DataParallel& dp, const std::vector<FileSegment>& segments,
                                  const std::vector<std::vector<Run>>& runs,
                                  const ShardStates& states) {
  const int64_t count = static_cast<int64_t>(segments.size());
  constexpr int64_t kNone = -1;
  Tensor mine = Tensor::full({2 * count}, static_cast<double>(kNone), DType::I64);
  int64_t* lohi = mine.data<int64_t>();
  for (int64_t s = 0; s < count; ++s) {
    const FileSegment& seg = segments[static_cast<size_t>(s)];
    for (const Run& run : runs[seg.param]) {
      const int64_t a = std::max(seg.offset, run.offset);
      const int64_t e = std::min(seg.offset + seg.numel, run.offset + run.numel);
      if (run.rank != dp.rank() || a >= e) continue;
      const auto [lo, hi] = states.steps(run.piece, run.at + (a - run.offset), e - a);
      lohi[2 * s] = lohi[2 * s] == kNone ? lo : std::min(lohi[2 * s], lo);
      lohi[2 * s + 1] = std::max(lohi[2 * s + 1], hi);
    }
  }
  Tensor all = Tensor::empty({dp.size() * 2 * count}, DType::I64, dp.comm_device());
  dp.comm().all_gather(mine.to(dp.comm_device()), all).wait();
  all = all.to(Device::cpu());
  const int64_t* every = all.data<int64_t>();
  std::vector<int64_t> steps(segments.size());
  for (int64_t s = 0; s < count; ++s) {
    int64_t lo = kNone, hi = kNone;
    for (int r = 0; r < dp.size(); ++r) {
      const int64_t l = every[r * 2 * count + 2 * s], h = every[r * 2 * count + 2 * s + 1];
      if (l == kNone) continue;
      lo = lo == kNone ? l : std::min(lo, l);
      hi = std::max(hi, h);
    }
    const FileSegment& seg = segments[static_cast<size_t>(s)];
    MW_CHECK_T(Error, lo == hi, "cannot save the ZeRO optimizer states: elements ", seg.offset,
               "..", seg.offset + seg.numel, " of parameter ", seg.param, " are at steps ", lo,
               " to ", hi,
               " on the ranks (a partially applied step after an NVMe failure, Note [NVMe "
               "failure guarantee]); resume from the last checkpoint instead");
    steps[static_cast<size_t>(s)] = lo;
  }
  return steps;
}

// Step 3: rank 0 appends each run of m or v in file order; its owner broadcasts it.
class OrderedSink {
 public:
  OrderedSink(DataParallel& dp, ShardStates& states, optim::AdamStateWriter* writer)
      : dp_(dp), states_(states), writer_(writer) {}
  void send(const Run& run, int64_t off, int64_t n, int which) {  // off: in the run's piece
    for (int64_t done = 0; done < n; done += kChunkNumel) {
      const int64_t take = std::min(kChunkNumel, n - done);
      if (run.rank == 0) {  // no collective: rank 0 reads and writes it itself
        if (dp_.rank() != 0) continue;
        drain(0);
        std::vector<float> buf(static_cast<size_t>(take));
        states_.read(run.piece, off + done, take, which, buf.data());
        writer_->put(buf.data(), 4 * take);
        continue;
      }
      Tensor buf = Tensor::empty({take});
      if (dp_.rank() == run.rank)
        states_.read(run.piece, off + done, take, which, buf.data<float>());
      buf = buf.to(dp_.comm_device());  // NCCL's on CUDA (Note [Buckets on CUDA])
      flight_.push_back({buf, dp_.comm().broadcast(buf, run.rank)});
      drain(2);
    }
  }
  void drain(size_t keep) {  // until at most `keep` broadcasts are in flight
    while (flight_.size() > keep) {
      flight_.front().second.wait();
      const Tensor buf = flight_.front().first.to(Device::cpu());
      if (writer_) writer_->put(buf.raw_data(), buf.nbytes());
      flight_.pop_front();
    }
  }

 private:
  DataParallel& dp_;
  ShardStates& states_;
  optim::AdamStateWriter* writer_;  // rank 0's; null elsewhere
  std::deque<std::pair<Tensor, dist::Work>> flight_;
};

void write_header(optim::AdamStateWriter& w, int64_t step, const OneProcessLayout& layout,
                  const std::vector<FileSegment>& segments, const std::vector<int64_t>& steps,
                  const std::vector<bool>& written) {
  w.put(optim::kAdamStateMagic, 8);
  w.put_i64(step);
  w.put_i64(static_cast<int64_t>(layout.numels.size()));
  size_t s = 0;
  for (size_t p = 0; p < layout.numels.size(); ++p) {
    w.put_i64(layout.numels[p]);
    size_t end = s;
    int64_t nseg = 0;
    for (; end < segments.size() && segments[end].param == p; ++end) nseg += written[end] ? 1 : 0;
    w.put_i64(nseg);
    for (; s < end; ++s) {
      if (!written[s]) continue;
      w.put_i64(segments[s].offset);
      w.put_i64(segments[s].numel);
      w.put_i64(steps[s]);
    }
  }
}

}  // namespace

OneProcessLayout one_process_layout(const std::vector<Tensor>& params,
                                    const optim::NvmeOffloadOptions& nvme, bool hybrid) {
  OneProcessLayout layout;
  std::vector<int64_t> host;  // HybridAdam offloads host parameters only
  for (const Tensor& p : params) {
    layout.numels.push_back(p.numel());
    host.push_back(p.device().is_host_addressable() ? p.numel() : 0);
  }
  layout.slice_numel.assign(params.size(), 0);
  if (!hybrid || nvme.fraction <= 0.0) return layout;
  const std::vector<bool> chosen = optim::select_nvme_offloaded(host, nvme.fraction);
  for (size_t i = 0; i < params.size(); ++i)
    if (chosen[i] && host[i] > 0) layout.slice_numel[i] = nvme.slice_numel;
  return layout;
}

ShardLayout shard_layout(const DataParallel& dp) {
  ShardLayout shards;
  for (const Tensor& p : dp.params()) shards.numels.push_back(p.numel());
  for (int r = 0; r < dp.size(); ++r) shards.pieces.push_back(dp.pieces(r));
  return shards;
}

void save_zero_state(DataParallel& dp, optim::Optimizer& opt, const OneProcessLayout& layout,
                     const std::string& path) {
  save_zero_state(dp, shard_layout(dp), opt, layout, path);
}

void save_zero_state(DataParallel& dp, const ShardLayout& shards, optim::Optimizer& opt,
                     const OneProcessLayout& layout, const std::string& path,
                     const std::vector<FileTensor>* tensors) {
  MW_CHECK_T(InvalidArgument,
             static_cast<int>(shards.pieces.size()) == dp.size() &&
                 shards.pieces[static_cast<size_t>(dp.rank())].size() == opt.params().size(),
             "save_zero_state: the layout has ", shards.pieces.size(), " ranks and this rank ",
             shards.pieces.empty() ? 0 : shards.pieces[0].size(), " pieces; expected ", dp.size(),
             " ranks and the optimizer's ", opt.params().size(), " parameters");
  std::vector<FileTensor> whole;  // without `tensors`: the file's tensors are the parameters
  for (size_t p = 0; p < shards.numels.size() && !tensors; ++p)
    whole.push_back({p, 0, shards.numels[p]});
  const std::vector<FileTensor>& file_tensors = tensors ? *tensors : whole;
  MW_CHECK_T(InvalidArgument, file_tensors.size() == layout.numels.size(),
             "save_zero_state: ", file_tensors.size(), " file tensors, but the file layout has ",
             layout.numels.size());
  const dist::CommStats before = dp.comm().stats();
  ShardStates states(opt);
  const std::vector<std::vector<Run>> runs = runs_by_tensor(shards, file_tensors);
  const std::vector<FileSegment> segments = file_segments(layout);
  const std::vector<int64_t> steps = agreed_steps(dp, segments, runs, states);
  // One process writes a segment per stepped parameter (in memory), or every slice (on NVMe).
  std::vector<bool> written(segments.size());
  for (size_t s = 0; s < segments.size(); ++s)
    written[s] = layout.slice_numel[segments[s].param] > 0 || steps[s] > 0;
  std::unique_ptr<optim::AdamStateWriter> writer;
  if (dp.rank() == 0) {
    writer = std::make_unique<optim::AdamStateWriter>(path);
    write_header(*writer, opt.step_count(), layout, segments, steps, written);
  }
  OrderedSink sink(dp, states, writer.get());
  for (size_t s = 0; s < segments.size(); ++s) {
    if (!written[s]) continue;
    const FileSegment& seg = segments[s];
    for (int which = 0; which < 2; ++which)  // m, then v
      for (const Run& run : runs[seg.param]) {
        const int64_t a = std::max(seg.offset, run.offset);
        const int64_t e = std::min(seg.offset + seg.numel, run.offset + run.numel);
        if (a < e) sink.send(run, run.at + (a - run.offset), e - a, which);
      }
  }
  sink.drain(0);
  states.finish();
  if (writer) writer->close();
  dp.exclude_comm_since(before);
}

void load_zero_state(DataParallel& dp, optim::Optimizer& opt, const std::string& path) {
  load_zero_state(shard_layout(dp), dp.rank(), opt, path);
}

void load_zero_state(const ShardLayout& shards, int rank, optim::Optimizer& opt,
                     const std::string& path) {
  optim::StateFileMap map;
  map.file_numels = shards.numels;
  for (const ShardPiece& piece : shards.pieces[static_cast<size_t>(rank)]) {
    map.param.push_back(piece.param);
    map.offset.push_back(piece.offset);
  }
  if (auto* hybrid = dynamic_cast<optim::HybridAdam*>(&opt))
    hybrid->load_state(path, &map);
  else if (auto* adamw = dynamic_cast<optim::AdamW*>(&opt))
    adamw->load_state(path, &map);
  else
    throw InvalidArgument(str("ZeRO checkpoints load into HybridAdam or AdamW, not ", opt.name()));
}

}  // namespace mw::train
