// A softmax row's maximum and normaliser, shared by the cross-entropy (over the vocabulary) and
// the host attention (over a causal row). The order of every sum is fixed, the same at any vector
// width (Note [Wider versions of f32 loops], fast_math.h): callers build versions of a wrapper.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/cpu/fast_math.h"

namespace mw::ops {

constexpr int64_t kSoftmaxChunk = 512, kSoftmaxLanes = 8;

// The helpers below are forced inline (MW_F32_BODY): a wide version (MW_F32_VERSIONS) that calls
// one is compiled for its own target only if the helper's body is inlined into it; otherwise every
// version calls the one baseline (SSE2) copy. Until session 30 row_max_and_sum was such a call:
// the AVX2 clone of the cross-entropy's forward was a jump to the SSE2 code (21.4 ms per GPT-2
// small B4 T128 step; F32Versions.EveryWideVersionRunsItsOwnCode now finds such a call).

// The maximum of row[0, n) in eight independent lanes combined in a fixed order: vectorisable
// without reassociating a single running value, and deterministic.
template <typename Tp>
MW_F32_BODY Tp row_max(const Tp* row, int64_t n) {
  Tp lane[kSoftmaxLanes];
  for (int64_t k = 0; k < kSoftmaxLanes; ++k) lane[k] = row[0];
  const int64_t nmain = n / kSoftmaxLanes * kSoftmaxLanes;
  for (int64_t j = 0; j < nmain; j += kSoftmaxLanes)
    for (int64_t k = 0; k < kSoftmaxLanes; ++k)
      lane[k] = row[j + k] > lane[k] ? row[j + k] : lane[k];
  Tp mx = lane[0];
  for (int64_t k = 1; k < kSoftmaxLanes; ++k) mx = std::max(mx, lane[k]);
  for (int64_t j = nmain; j < n; ++j) mx = std::max(mx, row[j]);
  return mx;
}

// The sum of x[0, n) in eight lanes of Acc, combined in a fixed order in double (Note
// [Reductions accumulate in double], layers.cpp). With Acc = Tp (f32) each lane sums at most 64
// terms of a chunk (the cross-entropy's normaliser); with Acc = double every term is added in
// double, as one running double sum would, without its chain of dependent additions (the
// attention's normaliser, where f32 lanes measurably cost accuracy: tools/accuracy_gpt2.py's
// geometric-mean worst 1.08 -> 1.18).
template <typename Acc, typename Tp>
MW_F32_BODY double lane_sum(const Tp* x, int64_t n) {
  Acc lane[kSoftmaxLanes] = {};
  const int64_t nmain = n / kSoftmaxLanes * kSoftmaxLanes;
  for (int64_t j = 0; j < nmain; j += kSoftmaxLanes)
    for (int64_t k = 0; k < kSoftmaxLanes; ++k) lane[k] += static_cast<Acc>(x[j + k]);
  double sum = 0;
  for (int64_t k = 0; k < kSoftmaxLanes; ++k) sum += static_cast<double>(lane[k]);
  for (int64_t j = nmain; j < n; ++j) sum += static_cast<double>(x[j]);
  return sum;
}

// A row's maximum (into mx) and its normaliser, sum_j e^(row[j] - mx), in double: chunk by chunk,
// the exps into a buffer (a loop the compiler vectorises), then each chunk's sum, added in double.
template <typename Tp>
MW_F32_BODY double row_max_and_sum(const Tp* row, int64_t V, Tp& mx) {
  Tp chunk[kSoftmaxChunk];
  mx = row_max(row, V);
  double sum = 0;
  for (int64_t j0 = 0; j0 < V; j0 += kSoftmaxChunk) {
    const int64_t n = std::min(kSoftmaxChunk, V - j0);
    for (int64_t j = 0; j < n; ++j) chunk[j] = fast::exp_t(row[j0 + j] - mx);
    sum += lane_sum<Tp>(chunk, n);  // n <= kSoftmaxChunk: 64 terms per f32 lane
  }
  return sum;
}

}  // namespace mw::ops
