// HybridAdam (hybrid_adam.h): placement-driven kernels, the NVMe-offloaded parameters, checkpoints.
//
// Note [Optimizer checkpoint format]: one file, little-endian, written front to back:
//   "MWADAMv1"                                  8 bytes
//   int64 step, int64 nparams
//   per parameter: int64 numel, int64 nsegments, then nsegments x (int64 offset, int64 numel,
//                  int64 step)                  a segment is a range of elements with one step
//                  count
//   data: per parameter, per segment: m (numel f32) then v (numel f32)
// In-memory parameters save one segment; offloaded ones one per slice (Note [NVMe slices]), so the
// per-slice step counters of a partially applied step survive (Note [NVMe failure guarantee]).
// Loading maps segments onto whatever placement the loading optimizer has.
#include "optim/hybrid_adam.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "autograd/autograd.h"
#include "data/file_io.h"
#include "optim/adam_cuda.h"

namespace mw::optim {

HybridAdam::HybridAdam(std::vector<Tensor> params, HybridAdamOptions options)
    : Optimizer(std::move(params)), options_(std::move(options)), isa_(best_isa()) {
  for (auto& p : params_)
    MW_CHECK_T(InvalidArgument, p.dtype() == DType::F32 && p.is_contiguous(),
               "HybridAdam: parameters must be contiguous f32 (fp32 master weights), got ",
               p.desc());
  exp_avg_.resize(params_.size());
  exp_avg_sq_.resize(params_.size());
  nvme_index_.assign(params_.size(), -1);
  updated_in_backward_.assign(params_.size(), 0);
  if (options_.nvme.fraction <= 0.0)
    select_nvme_offloaded({}, options_.nvme.fraction);  // validates
  if (options_.update_in_backward) {
    // Hooks of in-memory parameters (offloaded ones get theirs below). A hook is dropped with
    // nothing else than its parameter's metadata; `alive_` guards an optimizer that died first.
    std::weak_ptr<char> alive = alive_;
    for (size_t i = 0; i < params_.size(); ++i) {
      add_grad_ready_hook(params_[i], [this, alive, i](const Tensor&) {
        if (alive.expired() || nvme_index_[i] >= 0) return;
        update_in_memory(i, make_adam_step_scalars(options_.hyper, step_ + 1, options_.div_scale));
        updated_in_backward_[i] = 1;
        set_grad(params_[i], Tensor());  // spent: free it now (Note [Update in backward])
      });
    }
  }
  if (options_.nvme.fraction <= 0.0) return;
  // Only host parameters can be offloaded (ColossalAI: CPU parameters only).
  std::vector<int64_t> numels;
  for (auto& p : params_) numels.push_back(p.device().is_host_addressable() ? p.numel() : 0);
  std::vector<bool> chosen = select_nvme_offloaded(numels, options_.nvme.fraction);
  std::vector<int64_t> offloaded_numels;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!chosen[i] || numels[i] == 0) continue;
    nvme_index_[i] = static_cast<int>(nvme_params_.size());
    nvme_params_.push_back(i);
    offloaded_numels.push_back(numels[i]);
  }
  if (nvme_params_.empty()) return;
  nvme_ = std::make_shared<NvmeAdamStates>(offloaded_numels, options_.nvme, isa_);
  if (options_.nvme.overlap_backward) {
    std::weak_ptr<NvmeAdamStates> weak = nvme_;
    for (size_t i : nvme_params_) {
      add_grad_ready_hook(params_[i], [this, weak, i](const Tensor&) {
        if (auto alive = weak.lock()) update_offloaded(i, true);
      });
      // Note [Row-split update]: an embedding table (GPT-2's tied wte) is stepped, all but the
      // rows this batch looks up, as soon as the LM head's backward made the rest final.
      if (params_[i].dim() == 2)
        add_grad_rows_ready_hook(params_[i], [this, weak, i](const Tensor&, const Tensor& partial,
                                                             const std::vector<int64_t>& rows) {
          if (weak.expired()) return std::function<void()>();
          return update_offloaded_except_rows(i, partial, rows);
        });
    }
  }
}

std::function<void()> HybridAdam::update_offloaded_except_rows(size_t i, const Tensor& partial,
                                                               const std::vector<int64_t>& rows) {
  std::weak_ptr<NvmeAdamStates> weak = nvme_;
  if (!nvme_ || !partial.is_contiguous() || partial.offset() != 0 ||
      !partial.device().is_host_addressable() || partial.dtype() == DType::F64)
    return {};  // the whole parameter is then stepped by its grad-ready hook
  Tensor& p = params_[i];
  p.bump_version();
  const uint64_t ticket = nvme_->update_except_rows(
      nvme_index_[i], make_adam_step_scalars(options_.hyper, step_ + 1, options_.div_scale),
      p.data<float>(), partial.raw_data(), partial.dtype(), p.size(1), rows);
  return [weak, ticket] {
    if (auto alive = weak.lock()) alive->wait(ticket);
  };
}

HybridAdam::~HybridAdam() {
  alive_.reset();  // in-memory hooks see the optimizer gone and do nothing
  nvme_.reset();   // hooks see the states gone and do nothing
}

uint64_t HybridAdam::update_offloaded(size_t i, bool in_backward) {
  Tensor& p = params_[i];
  Tensor g = grad(p);
  if (!g.defined()) return 0;
  Tensor gc = g.contiguous();
  const AdamStepScalars s = make_adam_step_scalars(options_.hyper, step_ + 1, options_.div_scale);
  p.bump_version();
  // Note [Borrowed gradient slots]: inside backward the gradient is spent once submitted: release
  // it here, so that the job holds the only reference and can lend the buffer when done.
  if (in_backward) set_grad(p, Tensor());
  g = Tensor();
  return nvme_->update(nvme_index_[i], s, p.data<float>(), std::move(gc));
}

void HybridAdam::update_in_memory(size_t i, const AdamStepScalars& s) {
  Tensor& p = params_[i];
  Tensor g = grad(p);
  if (!g.defined()) return;
  if (!exp_avg_[i].defined()) {
    const Device states = !options_.state_devices.empty() ? options_.state_devices.at(i)
                          : options_.states_on_host && p.device().is_sim() ? Device::cpu()
                                                                           : p.device();
    exp_avg_[i] = Tensor::zeros(p.shape(), DType::F32, states);
    exp_avg_sq_[i] = Tensor::zeros(p.shape(), DType::F32, states);
  }
  Tensor gc = g.contiguous();
  p.bump_version();
  if (p.device().is_cuda())
    adam_update_cuda(s, p.data<float>(), gc.raw_data(), gc.dtype(), exp_avg_[i].data<float>(),
                     exp_avg_sq_[i].data<float>(), p.numel(), nullptr);
  else
    adam_update_parallel(isa_, s, p.data<float>(), gc.raw_data(), gc.dtype(),
                         exp_avg_[i].data<float>(), exp_avg_sq_[i].data<float>(), p.numel());
}

uint64_t HybridAdam::step_param(size_t i) {
  MW_CHECK_T(InvalidArgument, i < params_.size(), "HybridAdam::step_param: no parameter ", i);
  updated_in_backward_[i] = 1;
  if (nvme_index_[i] >= 0) return update_offloaded(i, true);  // the job holds the gradient
  update_in_memory(i, make_adam_step_scalars(options_.hyper, step_ + 1, options_.div_scale));
  set_grad(params_[i], Tensor());
  return 0;
}

void HybridAdam::step() {
  MW_CHECK_T(Error, !(nvme_ && nvme_->failed() && nvme_failure_reported_),
             "HybridAdam cannot step after the NVMe I/O error reported by an earlier step(); "
             "save_state() to a healthy disk, fix the offload directory, and resume from it");
  const AdamStepScalars s = make_adam_step_scalars(options_.hyper, step_ + 1, options_.div_scale);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (nvme_index_[i] >= 0) {
      if (nvme_->awaits_update(nvme_index_[i])) update_offloaded(i, false);
      continue;
    }
    if (updated_in_backward_[i]) continue;
    update_in_memory(i, s);
  }
  std::fill(updated_in_backward_.begin(), updated_in_backward_.end(), 0);
  ++step_;  // counted even when a failure below makes the step partial (per-slice steps tell)
  if (nvme_) {
    try {
      nvme_->finish_step();
    } catch (...) {
      nvme_failure_reported_ = true;
      throw;
    }
  }
}

int64_t HybridAdam::state_bytes_in_memory() const {
  int64_t n = 0;
  for (size_t i = 0; i < exp_avg_.size(); ++i)
    if (exp_avg_[i].defined()) n += exp_avg_[i].nbytes() + exp_avg_sq_[i].nbytes();
  if (nvme_) n += nvme_->stats().staging_bytes;
  return n;
}

int64_t HybridAdam::offloaded_numel() const {
  int64_t n = 0;
  for (size_t i : nvme_params_) n += params_[i].numel();
  return n;
}

std::pair<Tensor, Tensor> HybridAdam::state_copy(size_t i) {
  const Tensor& p = params_[i];
  if (nvme_index_[i] < 0) {
    if (!exp_avg_[i].defined())
      return {Tensor::zeros(p.shape(), DType::F32, p.device()),
              Tensor::zeros(p.shape(), DType::F32, p.device())};
    return {exp_avg_[i].clone(), exp_avg_sq_[i].clone()};
  }
  Tensor m = Tensor::zeros(p.shape(), DType::F32, Device::cpu());
  Tensor v = Tensor::zeros(p.shape(), DType::F32, Device::cpu());
  const int k = nvme_index_[i];
  for (int64_t j = 0; j < nvme_->slice_count(k); ++j) {
    const int64_t off = j * nvme_->slice_numel();
    nvme_->read_slice(k, j, m.data<float>() + off, v.data<float>() + off);
  }
  nvme_->resume_prefetch();
  return {m, v};
}

// ---- checkpoints (Note [Optimizer checkpoint format]) -----------------------------------------

namespace {

constexpr char kMagic[8] = {'M', 'W', 'A', 'D', 'A', 'M', 'v', '1'};

struct Segment {
  int64_t offset = 0, numel = 0, step = 0;
  int64_t data_pos = 0;  // file offset of its m (v follows)
};

// Streams the checkpoint into a temporary sibling (data/file_io.h, AtomicFileWriter), coalescing
// the small header fields into 1 MiB writes; close() renames it into place. Destroyed without
// close() (an error, a stop signal), the temporary file is removed and any earlier checkpoint is
// kept.
class CheckpointWriter {
 public:
  explicit CheckpointWriter(std::string path)
      : file_(std::move(path), "pass --save-optimizer a path in a writable directory",
              /*create_parents=*/true) {}
  void put(const void* data, int64_t nbytes) {
    const char* p = static_cast<const char*>(data);
    if (buffer_.size() + static_cast<size_t>(nbytes) > kBufferBytes) drain();
    if (static_cast<size_t>(nbytes) >= kBufferBytes)
      file_.append(p, nbytes);
    else
      buffer_.insert(buffer_.end(), p, p + nbytes);
  }
  void put_i64(int64_t x) { put(&x, 8); }
  void close() {
    drain();
    file_.commit();
  }

 private:
  static constexpr size_t kBufferBytes = size_t{1} << 20;
  void drain() {
    if (!buffer_.empty()) file_.append(buffer_.data(), static_cast<int64_t>(buffer_.size()));
    buffer_.clear();
  }
  data::AtomicFileWriter file_;
  std::vector<char> buffer_;
};

class CheckpointReader {
 public:
  explicit CheckpointReader(std::string path) : path_(std::move(path)) {
    int64_t size_bytes = 0;
    fd_ = data::open_regular_file(path_, "optimizer checkpoint",
                                  "pass --load-optimizer a file written by --save-optimizer",
                                  &size_bytes);
  }
  ~CheckpointReader() { ::close(fd_); }
  void get_at(int64_t pos, void* data, int64_t nbytes) {
    char* p = static_cast<char*>(data);
    while (nbytes > 0) {
      ssize_t n = ::pread(fd_, p, static_cast<size_t>(nbytes), pos);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        int err = errno;
        throw IoError(str("reading optimizer checkpoint '", path_, "' at offset ", pos, ": ",
                          errno_text(err)),
                      path_, pos, nbytes, err);
      }
      MW_CHECK_T(FormatError, n > 0, "optimizer checkpoint '", path_, "' is truncated at offset ",
                 pos, "; it was not completely written. Use another checkpoint");
      p += n;
      pos += n;
      nbytes -= n;
    }
  }
  int64_t get_i64() {
    int64_t x = 0;
    get_at(pos_, &x, 8);
    pos_ += 8;
    return x;
  }
  int64_t pos() const { return pos_; }
  void skip(int64_t n) { pos_ += n; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t pos_ = 0;
};

}  // namespace

void HybridAdam::flush() {
  if (nvme_) nvme_->flush();
}

void HybridAdam::save_state(const std::string& path) {
  CheckpointWriter w(path);
  w.put(kMagic, 8);
  w.put_i64(step_);
  w.put_i64(static_cast<int64_t>(params_.size()));
  for (size_t i = 0; i < params_.size(); ++i) {
    w.put_i64(params_[i].numel());
    const int k = nvme_index_[i];
    if (k >= 0) {
      w.put_i64(nvme_->slice_count(k));
      for (int64_t j = 0; j < nvme_->slice_count(k); ++j) {
        const int64_t off = j * nvme_->slice_numel();
        w.put_i64(off);
        w.put_i64(std::min(nvme_->slice_numel(), params_[i].numel() - off));
        w.put_i64(nvme_->slice_step(k, j));
      }
    } else if (exp_avg_[i].defined()) {
      w.put_i64(1);
      w.put_i64(0);
      w.put_i64(params_[i].numel());
      w.put_i64(step_);
    } else {
      w.put_i64(0);
    }
  }
  std::vector<float> m, v;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int k = nvme_index_[i];
    if (k >= 0) {  // streamed from disk one slice at a time
      m.resize(static_cast<size_t>(nvme_->slice_numel()));
      v.resize(m.size());
      for (int64_t j = 0; j < nvme_->slice_count(k); ++j) {
        const int64_t n =
            std::min(nvme_->slice_numel(), params_[i].numel() - j * nvme_->slice_numel());
        nvme_->read_slice(k, j, m.data(), v.data());
        w.put(m.data(), 4 * n);
        w.put(v.data(), 4 * n);
      }
    } else if (exp_avg_[i].defined()) {
      Tensor mc = exp_avg_[i].to(Device::cpu()), vc = exp_avg_sq_[i].to(Device::cpu());
      w.put(mc.raw_data(), mc.nbytes());
      w.put(vc.raw_data(), vc.nbytes());
    }
  }
  if (nvme_) nvme_->resume_prefetch();
  w.close();
}

namespace {
// Reads the header of a checkpoint (Note [Optimizer checkpoint format]) written for `params`:
// returns its step and, per parameter, its segments with their data positions.
std::vector<std::vector<Segment>> read_segments(CheckpointReader& r,
                                                const std::vector<Tensor>& params, int64_t& step) {
  const std::string& path = r.path();
  char magic[8];
  r.get_at(0, magic, 8);
  r.skip(8);
  MW_CHECK_T(FormatError, std::memcmp(magic, kMagic, 8) == 0, "'", path,
             "' is not a memwall optimizer checkpoint (bad magic); pass a file written by "
             "HybridAdam::save_state / --save-optimizer");
  step = r.get_i64();
  const int64_t nparams = r.get_i64();
  MW_CHECK_T(FormatError, nparams == static_cast<int64_t>(params.size()), "optimizer checkpoint '",
             path, "' has ", nparams, " parameters, this model has ", params.size(),
             "; load a checkpoint of the same model");
  std::vector<std::vector<Segment>> segs(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t numel = r.get_i64();
    MW_CHECK_T(FormatError, numel == params[i].numel(), "optimizer checkpoint '", path,
               "': parameter ", i, " has ", numel, " elements, the model's has ", params[i].numel(),
               "; load a checkpoint of the same model");
    const int64_t nseg = r.get_i64();
    MW_CHECK_T(FormatError, nseg >= 0 && nseg <= numel, "optimizer checkpoint '", path,
               "': bad segment count ", nseg, " for parameter ", i);
    int64_t expect = 0;
    for (int64_t j = 0; j < nseg; ++j) {
      Segment s;
      s.offset = r.get_i64();
      s.numel = r.get_i64();
      s.step = r.get_i64();
      // offset == expect <= numel here, so numel - offset cannot overflow (offset + numel could).
      MW_CHECK_T(FormatError, s.offset == expect && s.numel > 0 && s.numel <= numel - s.offset,
                 "optimizer checkpoint '", path, "': segments of parameter ", i,
                 " do not tile it (segment at ", s.offset, " of ", s.numel, ")");
      expect += s.numel;
      segs[i].push_back(s);
    }
  }
  int64_t pos = r.pos();
  for (auto& ps : segs)
    for (Segment& s : ps) {
      s.data_pos = pos;
      pos += 8 * s.numel;
    }
  return segs;
}
}  // namespace

void HybridAdam::load_state(const std::string& path) {
  CheckpointReader r(path);
  int64_t step = 0;
  const std::vector<std::vector<Segment>> segs = read_segments(r, params_, step);
  // Reads elements [off, off + n) of parameter i's m and v; returns their step (0: no state).
  auto read_range = [&](size_t i, int64_t off, int64_t n, float* m, float* v) -> int64_t {
    int64_t range_step = -1;
    std::fill(m, m + n, 0.f);
    std::fill(v, v + n, 0.f);
    for (const Segment& s : segs[i]) {
      const int64_t lo = std::max(off, s.offset), hi = std::min(off + n, s.offset + s.numel);
      if (lo >= hi) continue;
      MW_CHECK_T(FormatError, range_step < 0 || range_step == s.step, "optimizer checkpoint '",
                 path,
                 "' holds a partially applied step (Note [NVMe failure guarantee]) whose "
                 "slices do not match this optimizer's; load it with the same nvme slice size");
      range_step = s.step;
      r.get_at(s.data_pos + 4 * (lo - s.offset), m + (lo - off), 4 * (hi - lo));
      r.get_at(s.data_pos + 4 * (s.numel + lo - s.offset), v + (lo - off), 4 * (hi - lo));
    }
    return range_step < 0 ? 0 : range_step;
  };
  std::vector<float> m, v;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int k = nvme_index_[i];
    if (k >= 0) {
      m.resize(static_cast<size_t>(nvme_->slice_numel()));
      v.resize(m.size());
      for (int64_t j = 0; j < nvme_->slice_count(k); ++j) {
        const int64_t off = j * nvme_->slice_numel();
        const int64_t n = std::min(nvme_->slice_numel(), params_[i].numel() - off);
        const int64_t st = read_range(i, off, n, m.data(), v.data());
        nvme_->write_slice(k, j, m.data(), v.data(), st);
      }
    } else if (segs[i].empty()) {
      exp_avg_[i] = Tensor();
      exp_avg_sq_[i] = Tensor();
    } else {
      const Tensor& p = params_[i];
      Tensor mc = Tensor::zeros(p.shape(), DType::F32, Device::cpu());
      Tensor vc = Tensor::zeros(p.shape(), DType::F32, Device::cpu());
      read_range(i, 0, p.numel(), mc.data<float>(), vc.data<float>());
      exp_avg_[i] = mc.to(p.device());
      exp_avg_sq_[i] = vc.to(p.device());
    }
  }
  step_ = step;
  if (nvme_) nvme_->resume_prefetch();
}

}  // namespace mw::optim
