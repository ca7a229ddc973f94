// ops::scale_ (core/ops.h): a buffer multiplied in place on its own device, as the data-parallel
// buckets and Gemini's gradient chunks are scaled to the mean. The CUDA path is checked against
// this one in tests/cuda/ops_test.cpp (CudaOps.AffineAxpyAndReductions).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "core/error.h"
#include "core/ops.h"

namespace mw {
namespace {

TEST(Scale, IsOneRoundedProductPerElementAndKeepsTheSignOfZero) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  const std::vector<float> v = {1.f,  -0.f,  0.f,    3.f,  -7.25f,    1e-38f,
                                tiny, 3e38f, -3e38f, 0.1f, 12345.678f};
  // The bucket's mean over 3 ranks: 1/3 is not a power of two, so every product rounds.
  const float factor = 1.f / 3.f;
  std::vector<float> big(100003);  // over one parallel grain: the split changes no bit
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.37f - 9000.f;
  for (const std::vector<float>& values : {v, big}) {
    Tensor x = Tensor::from_vector(values, {static_cast<int64_t>(values.size())});
    ops::scale_(x, factor);
    const float* p = x.data<float>();
    for (size_t i = 0; i < values.size(); ++i) {
      const float want = values[i] * factor;  // what the loops it replaced computed
      ASSERT_EQ(std::memcmp(&p[i], &want, sizeof(float)), 0)
          << i << ": " << values[i] << " x " << factor << " gave " << p[i] << ", expected " << want;
    }
  }
  Tensor d = Tensor::from_vector<double>({-0.0, 2.0, 1e-300}, {3});
  ops::scale_(d, 0.5);
  EXPECT_TRUE(std::signbit(d.data<double>()[0]));
  EXPECT_EQ(d.data<double>()[1], 1.0);
  EXPECT_EQ(d.data<double>()[2], 0.5e-300);
}

TEST(Scale, AViewScalesOnlyItsOwnElements) {
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5}, {5});
  Tensor mid = x.narrow(0, 1, 3);
  ops::scale_(mid, 2.0);
  const float* p = x.data<float>();
  EXPECT_EQ(std::vector<float>(p, p + 5), (std::vector<float>{1, 4, 6, 8, 5}));
}

TEST(Scale, ASavedTensorScaledInPlaceIsReportedAndAStridedOneRefused) {
  Tensor x = Tensor::from_vector<double>({1, 2}, {2});
  set_requires_grad(x);
  Tensor y = mul_scalar(x, 1.0);
  Tensor z = gelu(y);  // saves y
  ops::scale_(y, 0.5);
  EXPECT_THROW(backward(sum(z)), AutogradError);
  Tensor m = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2}).transpose(0, 1);
  EXPECT_THROW(ops::scale_(m, 2.0), ShapeError);
  Tensor ids = Tensor::from_vector<int32_t>({1, 2}, {2});
  EXPECT_THROW(ops::scale_(ids, 2.0), Error);  // float dtypes only
}

}  // namespace
}  // namespace mw
