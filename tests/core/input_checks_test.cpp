// The kernels' input checks and strided inputs (a review of src/core, session 41): each case was
// a crash, a silent read or write out of bounds, or a wrong result, and is now a ShapeError or
// InvalidArgument naming the shapes, or the right result.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace mw {
namespace {

Tensor ramp(const Shape& shape, double scale) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(std::sin(scale * (i + 1)));
  return t;
}

// A strided weight and bias: their contiguous copies were temporaries whose data the kernel read
// after they were freed (the bias's copy took the weight's block): errors up to 2.7.
TEST(InputChecks, LayernormOfStridedWeightAndBiasIsTheContiguousOnes) {
  const Tensor x = ramp({3, 8}, 0.7);
  const Tensor wb = ramp({8, 2}, 1.3);  // columns: the weight, the bias
  const Tensor w = wb.transpose(0, 1).narrow(0, 0, 1).reshape({8});
  const Tensor b = wb.transpose(0, 1).narrow(0, 1, 1).reshape({8});
  const Tensor ws = wb.transpose(0, 1).narrow(0, 0, 1), bs = wb.transpose(0, 1).narrow(0, 1, 1);
  ASSERT_FALSE(ws.is_contiguous());
  const ops::LayerNormOut strided = ops::layernorm(x, ws, bs, 1e-5);
  const ops::LayerNormOut dense = ops::layernorm(x, w.contiguous(), b.contiguous(), 1e-5);
  EXPECT_EQ(strided.out.to_vector<float>(), dense.out.to_vector<float>());
  const Tensor dout = ramp({3, 8}, 0.3);
  const ops::LayerNormGrads gs = ops::layernorm_backward(dout, x, ws, dense.mean, dense.rstd);
  const ops::LayerNormGrads gd =
      ops::layernorm_backward(dout, x, w.contiguous(), dense.mean, dense.rstd);
  EXPECT_EQ(gs.dx.to_vector<float>(), gd.dx.to_vector<float>());
}

TEST(InputChecks, ShapeMismatchesAreShapeErrorsNotOutOfBoundsAccess) {
  // x [2, 0]: C = 0 divided the mean (SIGFPE)
  EXPECT_THROW(ops::layernorm(Tensor::empty({2, 0}), Tensor::empty({0}), Tensor::empty({0}), 1e-5),
               ShapeError);
  // a shape that does not broadcast to the gradient's: written past the sums (heap corruption)
  EXPECT_THROW(ops::sum_to_shape(Tensor::zeros({64, 16}), {8}), ShapeError);
  EXPECT_EQ(ops::sum_to_shape(Tensor::full({4, 3}, 1.0), {1, 3}).to_vector<float>(),
            (std::vector<float>{4, 4, 4}));
  // a shorter dout than x: read past its end
  EXPECT_THROW(ops::gelu_backward(Tensor::zeros({4}), Tensor::zeros({4096})), ShapeError);
  EXPECT_THROW(ops::layernorm_backward(Tensor::zeros({2, 4}), Tensor::zeros({3, 4}),
                                       Tensor::zeros({4}), Tensor::zeros({3}), Tensor::zeros({3})),
               ShapeError);
  // an id past the table: the forward refused it, the backward wrote outside the table
  Tensor dtable = Tensor::zeros({4, 8});
  const Tensor far = Tensor::from_vector<int32_t>({1, 1000000}, {2}, Device::cpu());
  EXPECT_THROW(ops::embedding_backward_into(dtable, Tensor::zeros({2, 8}), far), InvalidArgument);
  const Tensor three = Tensor::from_vector<int32_t>({0, 1, 2}, {3}, Device::cpu());
  EXPECT_THROW(ops::embedding_backward_into(dtable, Tensor::zeros({2, 8}), three), ShapeError);
}

// {2^32, 2^32} counted 0 elements and made a tensor of that shape with no bytes; a negative size
// passed view().
TEST(InputChecks, ShapesTooLargeOrNegativeAreRefused) {
  const int64_t big = int64_t{1} << 32;
  EXPECT_THROW(Tensor::empty({big, big}), ShapeError);
  EXPECT_THROW(Tensor::zeros({4}).view({-2, -2}), ShapeError);
  EXPECT_EQ(Tensor::empty({0, big}).numel(), 0);  // an empty tensor of any width is fine
}

}  // namespace
}  // namespace mw
