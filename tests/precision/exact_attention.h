// The exact (f64) causal attention of 16-bit qkv and its gradient, and the bound a 16-bit
// attention must meet against it: shared by the CUDA kernels' test (tests/cuda) and the host
// devices' (tests/precision).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mw::test {

// The exact causal attention of the 16-bit values in qkv [B, T, 3C] (n_head heads, no dropout)
// and its gradient for dout [B, T, C], in f64, with beside each output element the sum of the
// absolute terms it is made of (what roundings of those terms can move it by): out = sum_j p v_j
// with sum_j p |v_j|; dq = sum_j dS k_j with sum |dS| |k_j|; dk, dv likewise.
struct ExactAttention {
  std::vector<double> out, out_terms, dqkv, dqkv_terms;
};

inline ExactAttention exact_attention(const Tensor& qkv_t, const Tensor& dout_t, int64_t NH) {
  const int64_t B = qkv_t.size(0), T = qkv_t.size(1), C = qkv_t.size(2) / 3, hs = C / NH;
  const auto qkv = qkv_t.to(Device::cpu()).to(DType::F64).to_vector<double>(),
             dout = dout_t.to(Device::cpu()).to(DType::F64).to_vector<double>();
  ExactAttention e{std::vector<double>(B * T * C), std::vector<double>(B * T * C),
                   std::vector<double>(B * T * 3 * C), std::vector<double>(B * T * 3 * C)};
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  auto at = [&](int64_t b, int64_t t, int part, int64_t h) {
    return (b * T + t) * 3 * C + part * C + h * hs;
  };
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> p(t + 1), dp(t + 1);
        double m = -INFINITY, l = 0, D = 0;
        for (int64_t j = 0; j <= t; ++j) {
          double s = 0, g = 0;
          for (int64_t c = 0; c < hs; ++c) {
            s += qkv[at(b, t, 0, h) + c] * qkv[at(b, j, 1, h) + c];
            g += dout[(b * T + t) * C + h * hs + c] * qkv[at(b, j, 2, h) + c];
          }
          p[j] = s * scale;
          dp[j] = g;
          m = std::max(m, p[j]);
        }
        for (double& x : p) l += (x = std::exp(x - m));
        for (int64_t j = 0; j <= t; ++j) D += (p[j] /= l) * dp[j];
        for (int64_t j = 0; j <= t; ++j) {
          const double ds = p[j] * (dp[j] - D) * scale;
          for (int64_t c = 0; c < hs; ++c) {
            const int64_t o = (b * T + t) * C + h * hs + c;
            const double qc = qkv[at(b, t, 0, h) + c], kc = qkv[at(b, j, 1, h) + c],
                         vc = qkv[at(b, j, 2, h) + c], dc = dout[o];
            e.out[o] += p[j] * vc;
            e.out_terms[o] += p[j] * std::abs(vc);
            e.dqkv[at(b, t, 0, h) + c] += ds * kc;
            e.dqkv_terms[at(b, t, 0, h) + c] += std::abs(ds * kc);
            e.dqkv[at(b, j, 1, h) + c] += ds * qc;
            e.dqkv_terms[at(b, j, 1, h) + c] += std::abs(ds * qc);
            e.dqkv[at(b, j, 2, h) + c] += p[j] * dc;
            e.dqkv_terms[at(b, j, 2, h) + c] += p[j] * std::abs(dc);
          }
        }
      }
    }
  }
  return e;
}

// |actual - exact| <= 2u (|exact| + terms) + 2^-16 max |exact|: one rounding of each P~ or dS
// element (u times its term) and one of the result (u |exact|), with a factor 2 for the f32
// arithmetic around them; the absolute part covers f32's errors in the scores, exp and D_t (the
// row's sum of p dP), which can move a dS that nearly cancels by more than u |dS|.
inline void expect_attention_bound(const std::string& what, const Tensor& actual,
                                   const std::vector<double>& exact,
                                   const std::vector<double>& terms) {
  const auto a = actual.to(Device::cpu()).to_vector<double>();
  ASSERT_EQ(a.size(), exact.size()) << what;
  double largest = 0;
  for (double x : exact) largest = std::max(largest, std::abs(x));
  const double u = std::ldexp(1.0, actual.dtype() == DType::BF16 ? -8 : -11),
               atol = std::ldexp(largest, -16);
  int bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double bound = 2 * u * (std::abs(exact[i]) + terms[i]) + atol;
    if (!(std::abs(a[i] - exact[i]) <= bound) && bad++ < 3)
      ADD_FAILURE() << what << "[" << i << "]: " << a[i] << ", exact " << exact[i] << ", bound "
                    << bound;
  }
}

}  // namespace mw::test
