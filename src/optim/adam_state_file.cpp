// Reading Adam's state files (adam_state_file.h, Note [Optimizer checkpoint format]).
#include "optim/adam_state_file.h"

#include <algorithm>
#include <cstring>

namespace mw::optim {

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
  char magic[8];
  r.get_at(0, magic, 8);
  r.skip(8);
  MW_CHECK_T(FormatError, std::memcmp(magic, kAdamStateMagic, 8) == 0, "'", path,
             "' is not a memwall optimizer checkpoint (bad magic); pass a file written by "
             "HybridAdam::save_state / --save-optimizer");
  step = r.get_i64();
  const int64_t nparams = r.get_i64();
  MW_CHECK_T(FormatError, nparams == static_cast<int64_t>(params.size()), "optimizer checkpoint '",
             path, "' has ", nparams, " parameters, this model has ", params.size(),
             "; load a checkpoint of the same model");
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
      expect += s.numel;
      segs[i].push_back(s);
    }
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
  }
  return range_step < 0 ? 0 : range_step;
}

StateFileRanges::StateFileRanges(const std::string& path, const std::vector<Tensor>& params,
                                 const StateFileMap* map)
    : reader_(path) {
  if (!map) {
    segments_ = read_segments(reader_, params, step_);
    for (size_t i = 0; i < params.size(); ++i) param_.push_back(i);
    offset_.assign(params.size(), 0);
    return;
  }
  MW_CHECK_T(InvalidArgument,
             map->param.size() == params.size() && map->offset.size() == params.size(),
             "StateFileMap: ", map->param.size(), " pieces for ", params.size(), " parameters");
  for (size_t i = 0; i < params.size(); ++i)
    MW_CHECK_T(InvalidArgument,
               map->param[i] < map->file_numels.size() && map->offset[i] >= 0 &&
                   map->offset[i] + params[i].numel() <= map->file_numels[map->param[i]],
               "StateFileMap: piece ", i, " (", params[i].numel(), " elements at ", map->offset[i],
               " of parameter ", map->param[i], ") lies outside the file's parameters");
  segments_ = read_segments(reader_, map->file_numels, step_);
  param_ = map->param;
  offset_ = map->offset;
}

}  // namespace mw::optim
