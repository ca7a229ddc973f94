// NvmeAdamStates (nvme_states.h), Note [Row-split update]: an embedding table stepped in two
// parts, all but the batch's rows during backward, those rows at its end, and the held pages that
// keep the newest m and v of those rows in RAM until the slice is next written in full.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "optim/nvme_states.h"

namespace mw::optim {

namespace {
// Calls f(lo, hi) for each pending element range of a row split, clipped to [offset, end).
template <typename F>
void for_each_pending(const std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t offset,
                      int64_t end, F f) {
  auto it = std::partition_point(ranges.begin(), ranges.end(),
                                 [&](const auto& r) { return r.second <= offset; });
  for (; it != ranges.end() && it->first < end; ++it)
    f(std::max(it->first, offset), std::min(it->second, end));
}
}  // namespace

std::vector<NvmeAdamStates::Pages> NvmeAdamStates::step_slice(int64_t id, const Job& job,
                                                              float* m) {
  const Slice& s = slices_[id];  // offset and numel never change
  const int64_t esize = dtype_size(job.grad_dtype);
  float* v = m + s.numel;
  // Element indices of the parameter, split where the decay changes (Note [Weight decay by
  // ranges]).
  auto step_range = [&](int64_t from, int64_t to) {
    std::atomic<bool> non_finite{false};
    for_each_decay_segment(
        no_decay_[job.k], from, to, job.scalars,
        [&](int64_t lo, int64_t hi, const AdamStepScalars& scalars) {
          if (serial_updates_) {  // Note [Serial updates beside busy cores]: the same bits
            adam_update(isa_, scalars, job.param + lo, job.grad + lo * esize, job.grad_dtype,
                        m + (lo - s.offset), v + (lo - s.offset), hi - lo);
            if (!all_finite(job.param + lo, hi - lo)) non_finite = true;
          } else {
            adam_update_parallel(isa_, scalars, job.param + lo, job.grad + lo * esize,
                                 job.grad_dtype, m + (lo - s.offset), v + (lo - s.offset), hi - lo,
                                 &non_finite);
          }
        });
    if (non_finite) note_non_finite(s.param);
  };
  const int64_t end = s.offset + s.numel;
  if (job.kind != Job::Kind::kExceptRows) {
    step_range(s.offset, end);
    return {};
  }
  // The ranges were fixed before the job was queued and change only after it ran.
  std::vector<std::pair<int64_t, int64_t>> spans;  // bytes of the blob holding pending m and v
  int64_t pos = s.offset;
  for_each_pending(splits_[job.k].ranges, s.offset, end, [&](int64_t lo, int64_t hi) {
    if (pos < lo) step_range(pos, lo);
    spans.emplace_back(4 * (lo - s.offset) / 4096 * 4096, round_up(4 * (hi - s.offset), 4096));
    spans.emplace_back(4 * (s.numel + lo - s.offset) / 4096 * 4096,
                       round_up(4 * (s.numel + hi - s.offset), 4096));
    pos = hi;
  });
  if (pos < end) step_range(pos, end);
  std::sort(spans.begin(), spans.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (auto [a, b] : spans) {
    if (!merged.empty() && a <= merged.back().second)
      merged.back().second = std::max(merged.back().second, b);
    else
      merged.emplace_back(a, b);
  }
  // Copied after the other rows were stepped: the pages then equal what the write-back puts on
  // disk, except in the pending rows.
  std::vector<Pages> pages;
  for (auto [a, b] : merged) {
    Pages pg;
    pg.offset = a;
    pg.bytes = AlignedBuffer(b - a);
    std::memcpy(pg.bytes.data(), reinterpret_cast<const char*>(m) + a, static_cast<size_t>(b - a));
    pages.push_back(std::move(pg));
  }
  return pages;
}

void NvmeAdamStates::finish_rows(const Job& job) {
  RowSplit& rs = splits_[job.k];  // only the updater touches it while the split is active
  std::vector<std::pair<int64_t, std::vector<Pages>>> set_aside;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // After a failure the pending rows stay one step behind (Note [NVMe failure guarantee]).
    if (window_->failed()) return;
    set_aside = std::move(rs.set_aside);
  }
  const int64_t esize = dtype_size(job.grad_dtype);
  for (auto& [id, pages] : set_aside) {
    const Slice& s = slices_[id];
    auto at = [&](int64_t byte) {
      for (Pages& pg : pages)
        if (byte >= pg.offset && byte < pg.offset + pg.bytes.size())
          return reinterpret_cast<float*>(static_cast<char*>(pg.bytes.data()) + byte - pg.offset);
      throw Error(str("NVMe row split: byte ", byte, " of slice ", id, " was not set aside"));
    };
    std::atomic<bool> non_finite{false};
    for_each_pending(rs.ranges, s.offset, s.offset + s.numel, [&](int64_t from, int64_t to) {
      for_each_decay_segment(  // Note [Weight decay by ranges]
          no_decay_[job.k], from, to, job.scalars,
          [&](int64_t lo, int64_t hi, const AdamStepScalars& scalars) {
            adam_update_parallel(isa_, scalars, job.param + lo, job.grad + lo * esize,
                                 job.grad_dtype, at(4 * (lo - s.offset)),
                                 at(4 * (s.numel + lo - s.offset)), hi - lo, &non_finite);
          });
    });
    if (non_finite) note_non_finite(s.param);
    std::lock_guard<std::mutex> lock(mutex_);
    slices_[id].step = job.scalars.step;
    for (const Pages& pg : pages) stats_.held_bytes += pg.bytes.size();
    stats_.held_bytes_max = std::max(stats_.held_bytes_max, stats_.held_bytes);
    held_[id] = std::move(pages);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  rs = RowSplit();
}

void NvmeAdamStates::overlay_held_locked(int64_t id, float* m) {
  auto it = held_.find(id);
  if (it == held_.end()) return;
  for (const Pages& pg : it->second)
    std::memcpy(reinterpret_cast<char*>(m) + pg.offset, pg.bytes.data(), pg.bytes.size());
}

void NvmeAdamStates::drop_held_locked(int64_t id) {
  auto it = held_.find(id);
  if (it == held_.end()) return;
  for (const Pages& pg : it->second) stats_.held_bytes -= pg.bytes.size();
  held_.erase(it);
}

void NvmeAdamStates::stepped_locked(int64_t id, const Job& job, std::vector<Pages> pages) {
  if (pages.empty())
    slices_[id].step = job.scalars.step;
  else  // its pending rows come later (finish_rows), which then counts the step
    splits_[job.k].set_aside.emplace_back(id, std::move(pages));
}

uint64_t NvmeAdamStates::update_except_rows(int k, const AdamStepScalars& scalars, float* param,
                                            const void* grad, DType grad_dtype, int64_t row_numel,
                                            std::vector<int64_t> pending_rows) {
  std::lock_guard<std::mutex> lock(mutex_);
  const bool shape_ok = k >= 0 && k < param_count() && row_numel > 0 && numels_[k] % row_numel == 0;
  if (window_->failed() ||
      !admit(shape_ok && !submitted_[k],
             str("row split of NVMe-offloaded parameter ", k, " (rows of ", row_numel,
                 " elements): out of range, not whole rows, or "
                 "updated twice")))
    return 0;
  const int64_t nrows = numels_[k] / row_numel;
  RowSplit& rs = splits_[k];
  rs = RowSplit();
  for (size_t i = 0; i < pending_rows.size(); ++i) {
    const int64_t r = pending_rows[i];
    if (!admit(r >= 0 && r < nrows && (i == 0 || r > pending_rows[i - 1]),
               str("row split of NVMe-offloaded parameter ", k,
                   ": pending row ids must be sorted, distinct and in [0, ", nrows, "); got ", r,
                   " at position ", i)))
      return 0;
    if (!rs.ranges.empty() && rs.ranges.back().second == r * row_numel)
      rs.ranges.back().second += row_numel;  // consecutive rows: one range
    else
      rs.ranges.emplace_back(r * row_numel, (r + 1) * row_numel);
  }
  rs.active = true;
  if (!split_param_[k]) {  // from now on its slices are a read stream of their own
    split_param_[k] = 1;
    std::vector<int64_t> ids;
    for (int64_t id = first_slice_[k]; id < first_slice_[k + 1]; ++id) ids.push_back(id);
    window_->set_stream(ids, 1);
  }
  stats_.split_rows = static_cast<int64_t>(pending_rows.size());
  submitted_[k] = 1;
  promote_locked(k);
  Job job = Job::of(Job::Kind::kExceptRows, k, scalars, param, grad, grad_dtype);
  job.ticket = next_ticket_++;
  const uint64_t ticket = job.ticket;
  split_work_.push_back({std::move(job), first_slice_[k]});
  cv_.notify_all();
  return ticket;
}

}  // namespace mw::optim
