// Reading Adam's state files (adam_state_file.h, Note [Optimizer checkpoint format]).
#include "optim/adam_state_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace mw::optim {

void check_magic(AdamStateReader& r) {
  char magic[8];
  r.get_at(0, magic, 8);
  MW_CHECK_T(FormatError, std::memcmp(magic, kAdamStateMagic, 8) == 0, "'", r.path(),
             "' is not a memwall optimizer checkpoint (bad magic); pass a file written by "
             "HybridAdam::save_state / --save-optimizer");
}

std::vector<std::vector<StateSegment>> read_segments(AdamStateReader& r,
                                                     const std::vector<Tensor>& params,
                                                     int64_t& step) {
  std::vector<int64_t> numels;
  for (const Tensor& p : params) numels.push_back(p.numel());
  return read_segments(r, numels, step);
}

std::vector<std::vector<StateSegment>> read_segments(AdamStateReader& r,
                                                     const std::vector<int64_t>& params,
                                                     int64_t& step) {
  const std::string& path = r.path();
  check_magic(r);
  r.skip(8);
  step = r.get_i64();
  // Note [Checked optimizer values]: the format has no checksum, so what a damaged file would
  // turn into silently is checked: a step past kMaxStep (INT64_MAX trained zero steps and
  // overflowed the schedule), a negative one, and below non-finite moments or a negative v.
  MW_CHECK_T(FormatError, step >= 0 && step <= kMaxStep, "optimizer checkpoint '", path,
             "' is at step ", step, ", outside [0, 2^40]: the file is damaged; load another");
  const int64_t nparams = r.get_i64();
  MW_CHECK_T(FormatError, nparams == static_cast<int64_t>(params.size()), "optimizer checkpoint '",
             path, "' has ", nparams, " parameter tensors, this optimizer steps ", params.size(),
             "; load a checkpoint of the same model and optimizer layout (Gemini steps its chunks: "
             "--resume maps a checkpoint onto any layout, --load-optimizer a file of the model's "
             "parameters, which --save-optimizer writes)");
  std::vector<std::vector<StateSegment>> segs(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t numel = r.get_i64();
    MW_CHECK_T(FormatError, numel == params[i], "optimizer checkpoint '", path, "': parameter ", i,
               " has ", numel, " elements, the model's has ", params[i],
               "; load a checkpoint of the same model");
    const int64_t nseg = r.get_i64();
    MW_CHECK_T(FormatError, nseg >= 0 && nseg <= numel, "optimizer checkpoint '", path,
               "': bad segment count ", nseg, " for parameter ", i);
    int64_t expect = 0;
    for (int64_t j = 0; j < nseg; ++j) {
      StateSegment s;
      s.offset = r.get_i64();
      s.numel = r.get_i64();
      s.step = r.get_i64();
      // offset == expect <= numel here, so numel - offset cannot overflow (offset + numel could).
      MW_CHECK_T(FormatError, s.offset == expect && s.numel > 0 && s.numel <= numel - s.offset,
                 "optimizer checkpoint '", path, "': segments of parameter ", i,
                 " do not tile it (segment at ", s.offset, " of ", s.numel, ")");
      MW_CHECK_T(FormatError, s.step >= 0 && s.step <= kMaxStep, "optimizer checkpoint '", path,
                 "': a segment of parameter ", i, " is at step ", s.step,
                 ", outside [0, 2^40]: the file is damaged; load another");
      expect += s.numel;
      segs[i].push_back(s);
    }
    // Segments that stop short would leave the rest of the parameter's moments at 0 and shift
    // every later parameter's data.
    MW_CHECK_T(FormatError, nseg == 0 || expect == numel, "optimizer checkpoint '", path,
               "': the segments of parameter ", i, " cover ", expect, " of its ", numel,
               " elements: the file is damaged; load another");
  }
  int64_t pos = r.pos();
  for (auto& ps : segs)
    for (StateSegment& s : ps) {
      s.data_pos = pos;
      pos += 8 * s.numel;
    }
  return segs;
}

int64_t read_state_range(AdamStateReader& r, const std::vector<StateSegment>& segments, int64_t off,
                         int64_t n, float* m, float* v) {
  int64_t range_step = -1;
  std::fill(m, m + n, 0.f);
  std::fill(v, v + n, 0.f);
  for (const StateSegment& s : segments) {
    const int64_t lo = std::max(off, s.offset), hi = std::min(off + n, s.offset + s.numel);
    if (lo >= hi) continue;
    MW_CHECK_T(FormatError, range_step < 0 || range_step == s.step, "optimizer checkpoint '",
               r.path(),
               "' holds a partially applied step (Note [NVMe failure guarantee]) whose "
               "slices do not match this optimizer's; load it with the same nvme slice size");
    range_step = s.step;
    r.get_at(s.data_pos + 4 * (lo - s.offset), m + (lo - off), 4 * (hi - lo));
    r.get_at(s.data_pos + 4 * (s.numel + lo - s.offset), v + (lo - off), 4 * (hi - lo));
    for (int64_t k = lo - off; k < hi - off; ++k)  // Note [Checked optimizer values]
      MW_CHECK_T(FormatError, std::isfinite(m[k]) && std::isfinite(v[k]) && v[k] >= 0.f,
                 "optimizer checkpoint '", r.path(), "' holds m = ", m[k], ", v = ", v[k],
                 " at element ", off + k,
                 " of a parameter (v must be finite and >= 0, m finite): the file is damaged; "
                 "load another");
  }
  return range_step < 0 ? 0 : range_step;
}

StateFileRanges::StateFileRanges(const std::string& path, const std::vector<Tensor>& params,
                                 const StateFileMap* map)
    : reader_(path) {
  if (!map) {
    segments_ = read_segments(reader_, params, step_);
    for (size_t i = 0; i < params.size(); ++i) runs_.push_back({{0, i, 0, params[i].numel()}});
    return;
  }
  if (map->runs.empty()) {
    MW_CHECK_T(InvalidArgument,
               map->param.size() == params.size() && map->offset.size() == params.size(),
               "StateFileMap: ", map->param.size(), " pieces for ", params.size(), " parameters");
    for (size_t i = 0; i < params.size(); ++i)
      runs_.push_back({{0, map->param[i], map->offset[i], params[i].numel()}});
  } else {
    MW_CHECK_T(InvalidArgument, map->runs.size() == params.size(), "StateFileMap: runs for ",
               map->runs.size(), " pieces, the optimizer has ", params.size(), " parameters");
    runs_ = map->runs;
  }
  for (size_t i = 0; i < params.size(); ++i)
    for (const StateRun& r : runs_[i])
      MW_CHECK_T(InvalidArgument,
                 r.param < map->file_numels.size() && r.offset >= 0 && r.numel >= 0 &&
                     r.offset + r.numel <= map->file_numels[r.param] && r.at >= 0 &&
                     r.at + r.numel <= params[i].numel(),
                 "StateFileMap: piece ", i, " (", r.numel, " elements at ", r.offset,
                 " of parameter ", r.param, ") lies outside the file's parameters");
  segments_ = read_segments(reader_, map->file_numels, step_);
}

bool StateFileRanges::has_state(size_t i) const {
  for (const StateRun& r : runs_[i])
    if (!segments_[r.param].empty()) return true;
  return false;
}

int64_t StateFileRanges::read(size_t i, int64_t off, int64_t n, float* m, float* v) {
  std::fill(m, m + n, 0.f);
  std::fill(v, v + n, 0.f);
  int64_t step = 0;
  for (const StateRun& r : runs_[i]) {
    const int64_t lo = std::max(off, r.at), hi = std::min(off + n, r.at + r.numel);
    if (lo >= hi || segments_[r.param].empty()) continue;  // padding, or never stepped
    const int64_t st = read_state_range(reader_, segments_[r.param], r.offset + (lo - r.at),
                                        hi - lo, m + (lo - off), v + (lo - off));
    MW_CHECK_T(FormatError, step == 0 || st == step, "optimizer checkpoint '", reader_.path(),
               "' holds parameters at different steps (", step, " and ", st,
               ", a partially applied step) that this optimizer steps together; resume it with "
               "the layout it was written with");
    step = st;
  }
  return step;
}

StateFileMap remap_state_file(const StateFileMap& saved, const StateFileMap& now,
                              const std::vector<int64_t>& model_numels,
                              const std::vector<size_t>& piece_param,
                              const std::vector<int64_t>& piece_offset,
                              const std::vector<int64_t>& piece_numel) {
  const size_t np = model_numels.size();
  MW_CHECK_T(FormatError, saved.param.size() == np && saved.offset.size() == np,
             "the optimizer checkpoint's layout lists ", saved.param.size(),
             " model parameters, this model has ", np, "; resume a checkpoint of the same model");
  for (size_t p = 0; p < np; ++p)
    MW_CHECK_T(FormatError,
               saved.param[p] < saved.file_numels.size() && saved.offset[p] >= 0 &&
                   saved.offset[p] + model_numels[p] <= saved.file_numels[saved.param[p]],
               "the optimizer checkpoint's layout puts model parameter ", p, " (", model_numels[p],
               " elements) outside its file's parameters; resume a checkpoint of the same model");
  StateFileMap map;
  map.file_numels = saved.file_numels;
  map.runs.resize(piece_param.size());
  for (size_t i = 0; i < piece_param.size(); ++i) {
    const int64_t o = piece_offset[i], e = o + piece_numel[i];
    for (size_t p = 0; p < np; ++p) {
      if (now.param[p] != piece_param[i]) continue;
      const int64_t a = std::max(o, now.offset[p]),
                    b = std::min(e, now.offset[p] + model_numels[p]);
      if (a < b)
        map.runs[i].push_back(
            {a - o, saved.param[p], saved.offset[p] + (a - now.offset[p]), b - a});
    }
  }
  return map;
}

}  // namespace mw::optim
