// Finite-difference gradient checking in double precision.
//
// gradcheck(f, inputs) reduces f's output to a scalar L = sum(w * f(inputs)) with fixed random
// weights w (so every output element matters), computes analytic gradients with backward, and
// compares them with central differences (L(x+h) - L(x-h)) / 2h for every element of every input
// that requires grad. `needs_grad` says which inputs do (default: all); those that do not must get
// no gradient. gradcheck_every_mask runs f over every non-empty subset, so a backward that only
// works when all its inputs need gradients (a placeholder of the wrong shape, say) fails.
//
// Note [Gradcheck tolerance]: with h = 1e-6 in double the truncation error is h^2 |L'''| / 6 ~
// 1e-13. The rounding error is that of the two evaluations of L, each about eps * S with eps =
// 2^-52 and S = sum |w_i f_i| the magnitude of the terms L adds up, divided by 2h: about eps S / h
// (1.1e-10 S; the tests here have S from 0.1 to 650). Measured over these tests, the worst error
// is 1.2 eps S / h, in the cross-entropy at V = 517, whose log-sum-exps are larger than the loss
// S sees. So an element passes when |analytic - numeric| <= 4 eps S / h + 1e-9 (1 + |numeric|):
// the first term 3.5 times the worst rounding seen, the second a floor for S ~ 0, ten thousand
// times the truncation error. A wrong term (an O(1) change) fails it everywhere. A gradient
// computed in f32 and widened back is off by up to 2^-24 = 6e-8 of itself and fails it wherever a
// gradient element exceeds about S / 70 (for x^2 over 64 elements, by a factor of 6:
// Gradcheck.DetectsAGradientComputedInF32); one left in f32 fails the dtype check.
// MW_GRADCHECK_PRINT=1 prints each input's worst error against eps S / h (how these were measured).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "core/ops.h"
#include "core/random.h"

namespace mw::testing {

using GradcheckFn = std::function<Tensor(const std::vector<Tensor>&)>;

inline Tensor random_tensor(const Shape& shape, uint64_t seed, double scale = 1.0,
                            DType dtype = DType::F64) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * random_normal({seed, 0}, i);
  return Tensor::from_vector(v, shape).to(dtype);
}

// The finite-difference error allowed on an element whose numeric derivative is `numeric`, for a
// loss whose terms add up to S in magnitude (Note [Gradcheck tolerance]).
inline constexpr double kGradcheckEps = 0x1p-52;  // double's machine epsilon

inline double gradcheck_tolerance(double numeric, double S, double h) {
  return 4 * kGradcheckEps * S / h + 1e-9 * (1 + std::abs(numeric));
}

// One input's analytic gradient against central differences; the other inputs stay fixed.
inline void compare_with_finite_differences(const std::function<double()>& loss, Tensor x,
                                            const std::vector<double>& analytic, size_t k, double S,
                                            double h) {
  double* px = x.data<double>();  // contiguous (checked by gradcheck): element i is px[i]
  int reported = 0;
  double max_ratio = 0, max_err = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double saved = px[i];
    px[i] = saved + h;
    const double lp = loss();
    px[i] = saved - h;
    const double lm = loss();
    px[i] = saved;
    const double numeric = (lp - lm) / (2 * h);
    const double err = std::abs(analytic[i] - numeric), tol = gradcheck_tolerance(numeric, S, h);
    // Written so that a NaN fails: NaN > tol is false, and std::max keeps its first argument.
    const bool bad = !(err <= tol);
    max_ratio = std::max(max_ratio, std::isnan(err) ? INFINITY : err / tol);
    max_err = std::max(max_err, err);
    if (bad && reported++ < 5)
      ADD_FAILURE() << "input " << k << " element " << i << ": analytic " << analytic[i]
                    << " numeric " << numeric << " (error " << err << ", tolerance " << tol << ")";
  }
  if (std::getenv("MW_GRADCHECK_PRINT"))
    std::printf("GC input %zu %s S %.3g max_err %.3e eps*S/h %.3e ratio %.3f\n", k,
                x.desc().c_str(), S, max_err, kGradcheckEps * S / h, max_ratio);
  EXPECT_LE(max_ratio, 1.0) << "input " << k << " (" << x.desc() << "): largest error / tolerance";
}

// `needs_grad[k]`: whether input k requires grad (empty: every input). The inputs must be f64 and
// contiguous; gradcheck runs on fresh leaves sharing their data, so an earlier backward's .grad
// on them does not count.
inline void gradcheck(const GradcheckFn& f, const std::vector<Tensor>& given,
                      std::vector<bool> needs_grad = {}, double h = 1e-6) {
  if (needs_grad.empty()) needs_grad.assign(given.size(), true);
  ASSERT_EQ(needs_grad.size(), given.size());
  std::vector<Tensor> inputs;
  for (size_t k = 0; k < given.size(); ++k) {
    ASSERT_EQ(given[k].dtype(), DType::F64) << "input " << k << ": gradcheck runs in double";
    ASSERT_TRUE(given[k].is_contiguous())
        << "input " << k << " (" << given[k].desc()
        << "): finite differences perturb element i at data + i; pass a contiguous tensor";
    inputs.push_back(given[k].detach());
    if (needs_grad[k]) set_requires_grad(inputs.back());
  }
  Tensor out = f(inputs);
  ASSERT_TRUE(requires_grad(out)) << "the output does not depend on any input requiring grad";
  Tensor w = random_tensor(out.shape(), 12345);
  auto loss = [&] {
    NoGradGuard no_grad;
    return ops::sum_all(ops::binary(ops::BinaryOp::Mul, f(inputs), w)).item();
  };
  double S = 0;  // sum |w_i f_i|: the magnitude of L's terms
  {
    const std::vector<double> vo = out.to_vector<double>(), vw = w.to_vector<double>();
    for (size_t i = 0; i < vo.size(); ++i) S += std::abs(vo[i] * vw[i]);
  }
  backward(sum(mul(out, w)));
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    Tensor analytic = grad(x);
    if (!needs_grad[k]) {
      EXPECT_FALSE(analytic.defined()) << "input " << k << " does not require grad but got one";
      continue;
    }
    ASSERT_TRUE(analytic.defined()) << "input " << k << " got no gradient";
    ASSERT_EQ(analytic.dtype(), x.dtype()) << "input " << k << ": its gradient is "
                                           << analytic.desc() << ", computed in another dtype";
    ASSERT_EQ(analytic.shape(), x.shape()) << "input " << k << ": gradient " << analytic.desc();
    compare_with_finite_differences(loss, x, analytic.to_vector<double>(), k, S, h);
  }
}

// gradcheck over every non-empty subset of the inputs requiring grad.
inline void gradcheck_every_mask(const GradcheckFn& f, const std::vector<Tensor>& inputs,
                                 double h = 1e-6) {
  const size_t n = inputs.size();
  for (uint32_t mask = 1; mask < (1u << n); ++mask) {
    std::vector<bool> needs_grad(n);
    std::string which;
    for (size_t k = 0; k < n; ++k) {
      needs_grad[k] = (mask >> k) & 1u;
      which += needs_grad[k] ? '1' : '0';
    }
    SCOPED_TRACE("inputs requiring grad: " + which);
    gradcheck(f, inputs, needs_grad, h);
  }
}

}  // namespace mw::testing
