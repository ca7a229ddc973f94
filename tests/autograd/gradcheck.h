// Finite-difference gradient checking in double precision.
//
// gradcheck(f, inputs) reduces f's output to a scalar with fixed random weights w (so every output
// element matters), computes analytic gradients with backward, and compares them with central
// differences (L(x+h) - L(x-h)) / 2h for every element of every input.
//
// Tolerance: with h = 1e-6 in double, the truncation error is O(h^2 * |L'''|) ~ 1e-12 and the
// rounding error O(eps * |L| / h) ~ 1e-10, so |analytic - numeric| <= 1e-7 * (1 + |numeric|) is far
// above both and far below any real bug (a wrong term changes a gradient by O(1)).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "core/ops.h"
#include "core/random.h"

namespace mw::testing {

inline Tensor random_tensor(const Shape& shape, uint64_t seed, double scale = 1.0,
                            DType dtype = DType::F64) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * random_normal({seed, 0}, i);
  return Tensor::from_vector(v, shape).to(dtype);
}

inline void gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                      std::vector<Tensor> inputs, double h = 1e-6, double tol = 1e-7) {
  for (auto& t : inputs) set_requires_grad(t);
  Tensor out = f(inputs);
  Tensor w = random_tensor(out.shape(), 12345);
  auto loss_of = [&](const std::vector<Tensor>& xs) {
    NoGradGuard no_grad;
    Tensor o = f(xs);
    return ops::sum_all(ops::binary(ops::BinaryOp::Mul, o, w)).item();
  };
  backward(sum(mul(out, w)));
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor x = inputs[k];
    Tensor analytic = grad(x);
    ASSERT_TRUE(analytic.defined()) << "input " << k << " got no gradient";
    std::vector<double> a = analytic.to_vector<double>();
    double* px = x.data<double>();
    int reported = 0;
    double max_err = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      double saved = px[i];
      px[i] = saved + h;
      double lp = loss_of(inputs);
      px[i] = saved - h;
      double lm = loss_of(inputs);
      px[i] = saved;
      double numeric = (lp - lm) / (2 * h);
      double err = std::abs(a[i] - numeric);
      max_err = std::max(max_err, err / (1 + std::abs(numeric)));
      if (err > tol * (1 + std::abs(numeric)) && reported++ < 5)
        ADD_FAILURE() << "input " << k << " element " << i << ": analytic " << a[i] << " numeric "
                      << numeric;
    }
    EXPECT_LE(max_err, tol) << "input " << k << " (" << x.desc() << ") largest relative error";
  }
}

}  // namespace mw::testing
