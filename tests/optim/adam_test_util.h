// Shared helpers for the Adam tests: random optimizer states and gradients, and a comparison that
// prints the first mismatches and the largest relative difference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace mw::optim::test {

// One Adam problem: fp32 param/m/v and the gradient stored as grad_dtype (raw bytes).
struct AdamProblem {
  std::vector<float> param, exp_avg, exp_avg_sq;
  std::vector<uint8_t> grad_bytes;
  DType grad_dtype = DType::F32;
  int64_t numel = 0;
  const void* grad() const { return grad_bytes.data(); }
};

// p ~ U[-1, 1], m ~ U[-0.1, 0.1], v ~ U[0, 0.01] (a state some steps in), g ~ U[-1, 1] * grad_scale
// then rounded to grad_dtype.
inline AdamProblem make_problem(int64_t numel, DType grad_dtype, float grad_scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.f, 1.f), pos(0.f, 1.f);
  AdamProblem pr;
  pr.numel = numel;
  pr.grad_dtype = grad_dtype;
  pr.param.resize(numel);
  pr.exp_avg.resize(numel);
  pr.exp_avg_sq.resize(numel);
  pr.grad_bytes.resize(numel * dtype_size(grad_dtype));
  for (int64_t i = 0; i < numel; ++i) {
    pr.param[i] = unit(rng);
    pr.exp_avg[i] = 0.1f * unit(rng);
    pr.exp_avg_sq[i] = 0.01f * pos(rng);
    const float g = grad_scale * unit(rng);
    if (grad_dtype == DType::F32) {
      std::memcpy(pr.grad_bytes.data() + 4 * i, &g, 4);
    } else {
      const uint16_t h = grad_dtype == DType::F16 ? float_to_half(g) : float_to_bf16(g);
      std::memcpy(pr.grad_bytes.data() + 2 * i, &h, 2);
    }
  }
  return pr;
}

// Counts elements of `got` farther than rel_tol * |want| from `want` (NaN counts as a mismatch),
// prints the first few and the largest relative difference, and returns the count. Also reports
// how many elements are not bitwise equal, which for the Adam kernels is expected to be 0.
inline int64_t compare_rel(const char* what, const std::vector<float>& got,
                           const std::vector<float>& want, double rel_tol) {
  int64_t bad = 0, not_bitwise = 0, worst_i = -1;
  double worst_rel = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], 4) != 0) ++not_bitwise;
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double rel = diff / std::max(std::fabs(static_cast<double>(want[i])), 1e-30);
    if (!(rel <= rel_tol)) {
      if (bad < 5) {
        std::printf("  %s[%zu]: got %.9g want %.9g (rel %.3g)\n", what, i, got[i], want[i], rel);
      }
      ++bad;
    }
    if (rel > worst_rel || std::isnan(rel)) {
      worst_rel = rel;
      worst_i = static_cast<int64_t>(i);
    }
  }
  if (bad > 0 || not_bitwise > 0) {
    std::printf(
        "  %s: %lld of %zu outside rel %.1g, %lld not bitwise equal, worst rel %.3g at %lld\n",
        what, static_cast<long long>(bad), want.size(), rel_tol,
        static_cast<long long>(not_bitwise), worst_rel, static_cast<long long>(worst_i));
  }
  return bad;
}

}  // namespace mw::optim::test
