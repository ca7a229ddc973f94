// Note [Chunk-size search] and first-fit packing (chunk_search.h).
#include "offload/gemini/chunk_search.h"

#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace mw::gemini {

std::string ChunkSearchResult::log_line() const {
  const double mega = 1024.0 * 1024.0;
  const double used = static_cast<double>(total_numel) / mega;
  const double wasted = static_cast<double>(wasted_numel) / mega;
  char line[256];
  std::snprintf(line, sizeof line,
                "searching chunk configuration is completed in %.2f s. used number: %.2f MB, "
                "wasted number: %.2f MB, total wasted percentage is %.2f%%",
                seconds, used, wasted, used + wasted > 0 ? 100.0 * wasted / (used + wasted) : 0.0);
  return line;
}

int64_t packing_waste(const std::vector<int64_t>& sizes, int64_t chunk_numel) {
  int64_t waste = 0, left = 0;
  for (int64_t s : sizes) {
    if (s > chunk_numel) continue;  // a chunk of its own, of its size (pack_chunks)
    if (s > left) {
      waste += left;
      left = chunk_numel;
    }
    left -= s;
  }
  return waste + left;
}

ChunkSearchResult search_chunk_size(const std::vector<int64_t>& sizes,
                                    const ChunkSearchOptions& options) {
  MW_CHECK_T(InvalidArgument, options.interval_numel > 0 && options.min_chunk_numel > 0,
             "chunk search: interval and minimum chunk size must be positive");
  const auto t0 = std::chrono::steady_clock::now();
  ChunkSearchResult r;
  r.outlier.assign(sizes.size(), false);
  for (int64_t s : sizes) r.total_numel += s;
  if (r.total_numel < options.min_chunk_numel) {  // step 1
    r.single_chunk = true;
    r.chunk_numel = r.total_numel;
  } else {
    std::vector<int64_t> kept;
    if (options.filter_outliers && !sizes.empty()) {  // step 2: population mean and std
      const double n = static_cast<double>(sizes.size());
      double mean = 0, var = 0;
      for (int64_t s : sizes) mean += static_cast<double>(s) / n;
      for (int64_t s : sizes)
        var += (static_cast<double>(s) - mean) * (static_cast<double>(s) - mean) / n;
      const double upper = mean + 3.0 * std::sqrt(var);
      for (size_t i = 0; i < sizes.size(); ++i)
        r.outlier[i] = static_cast<double>(sizes[i]) > upper;
    }
    int64_t largest = options.min_chunk_numel;
    for (size_t i = 0; i < sizes.size(); ++i)
      if (!r.outlier[i]) {
        kept.push_back(sizes[i]);
        largest = std::max(largest, sizes[i]);
      }
    const int64_t step = options.interval_numel;
    const int64_t start = (largest + step - 1) / step * step;  // step 3
    r.chunk_numel = start;
    r.wasted_numel = INT64_MAX;
    for (int64_t size = start; size <= start + options.search_range_numel; size += step) {
      const int64_t waste = packing_waste(kept, size);
      if (waste < r.wasted_numel) {  // step 4: the first of equals wins
        r.wasted_numel = waste;
        r.chunk_numel = size;
      }
    }
    if (kept.empty()) r.wasted_numel = 0;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::vector<int> pack_chunks(const std::vector<int64_t>& sizes, int64_t chunk_numel,
                             const std::vector<bool>& outlier) {
  std::vector<int> chunk_of(sizes.size(), -1);
  int current = -1;
  int64_t left = 0;
  int next = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const bool alone = (i < outlier.size() && outlier[i]) || sizes[i] > chunk_numel;
    if (alone) {
      chunk_of[i] = next++;
      continue;  // the open chunk stays open for the next tensors
    }
    if (current < 0 || sizes[i] > left) {
      current = next++;
      left = chunk_numel;
    }
    chunk_of[i] = current;
    left -= sizes[i];
  }
  return chunk_of;
}

}  // namespace mw::gemini
