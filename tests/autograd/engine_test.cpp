// The backward engine: accumulation, hooks, version checks, graph release, iterative teardown.
#include <gtest/gtest.h>

#include "autograd/node.h"
#include "autograd/saved_tensor.h"
#include "gradcheck.h"

namespace mw {
namespace {

TEST(Engine, LeafGradientsAccumulateAcrossBackwards) {
  Tensor x = Tensor::from_vector<double>({1, 2, 3}, {3});
  set_requires_grad(x);
  backward(sum(mul_scalar(x, 2.0)));
  backward(sum(mul_scalar(x, 3.0)));
  EXPECT_EQ(grad(x).to_vector<double>(), (std::vector<double>{5, 5, 5}));
}

TEST(Engine, DiamondSumsBothPaths) {
  Tensor x = Tensor::from_vector<double>({2}, {1});
  set_requires_grad(x);
  Tensor y = mul(x, x);  // y = x^2, then z = y + y*x = x^2 + x^3
  backward(sum(add(y, mul(y, x))));
  EXPECT_DOUBLE_EQ(grad(x).item(), 2 * 2.0 + 3 * 4.0);
}

TEST(Engine, GradReadyHookSeesFinalGradientOncePerBackward) {
  Tensor x = Tensor::from_vector<double>({1, 1}, {2});
  set_requires_grad(x);
  int calls = 0;
  double seen = 0;
  add_grad_ready_hook(x, [&](const Tensor& leaf) {
    ++calls;
    seen = grad(leaf).to_vector<double>()[0];
  });
  backward(sum(add(mul_scalar(x, 2.0), mul_scalar(x, 5.0))));  // two uses, one final gradient
  EXPECT_EQ(calls, 1);
  EXPECT_DOUBLE_EQ(seen, 7.0);
}

TEST(Engine, InPlaceChangeOfSavedTensorIsReported) {
  Tensor x = Tensor::from_vector<double>({1, 2}, {2});
  set_requires_grad(x);
  Tensor y = mul_scalar(x, 1.0);
  Tensor z = gelu(y);  // saves y
  y.fill_(0.0);        // modifies it in place
  EXPECT_THROW(backward(sum(z)), AutogradError);
}

TEST(Engine, SecondBackwardWithoutRetainGraphIsAnError) {
  Tensor x = Tensor::from_vector<double>({1, 2}, {2});
  set_requires_grad(x);
  Tensor loss = sum(gelu(x));
  backward(loss);
  EXPECT_THROW(backward(loss), AutogradError);
  Tensor loss2 = sum(gelu(x));
  backward(loss2, Tensor(), /*retain_graph=*/true);
  EXPECT_NO_THROW(backward(loss2));
}

TEST(Engine, NoGradRecordsNothing) {
  Tensor x = Tensor::from_vector<double>({1, 2}, {2});
  set_requires_grad(x);
  NoGradGuard guard;
  Tensor y = gelu(x);
  EXPECT_FALSE(requires_grad(y));
}

TEST(Engine, SavedTensorHooksPackAndUnpack) {
  Tensor x = Tensor::from_vector<double>({0.5, -1.0, 2.0}, {3});
  set_requires_grad(x);
  int packed = 0, unpacked = 0;
  Tensor y;
  {
    SavedTensorHooksGuard hooks(
        [&](const Tensor& t) -> std::shared_ptr<void> {
          ++packed;
          return std::make_shared<Tensor>(t.clone());  // a copy, as an offload would make
        },
        [&](const std::shared_ptr<void>& p) {
          ++unpacked;
          return *static_cast<Tensor*>(p.get());
        });
    y = gelu(x);
  }
  backward(sum(y));
  EXPECT_EQ(packed, 1);
  EXPECT_EQ(unpacked, 1);
  Tensor expected = ops::gelu_backward(Tensor::ones({3}, DType::F64), x);
  EXPECT_EQ(grad(x).to_vector<double>(), expected.to_vector<double>());
}

TEST(Engine, DeepChainBuildsAndTearsDownWithoutRecursion) {
  Tensor x = Tensor::from_vector<double>({1}, {1});
  set_requires_grad(x);
  Tensor y = x;
  for (int i = 0; i < 200000; ++i) y = add_scalar(y, 1e-6);  // deep enough to overflow a recursion
  backward(sum(y));
  EXPECT_DOUBLE_EQ(grad(x).item(), 1.0);
  y = Tensor();  // iterative teardown of the remaining graph
}

TEST(Engine, BackwardHookRunsWhenGradientPasses) {
  Tensor x = Tensor::from_vector<double>({1, 2}, {2});
  set_requires_grad(x);
  bool fired = false;
  Tensor y = identity_with_backward_hook(mul_scalar(x, 2.0), [&] { fired = true; });
  EXPECT_FALSE(fired);
  backward(sum(y));
  EXPECT_TRUE(fired);
  EXPECT_EQ(grad(x).to_vector<double>(), (std::vector<double>{2, 2}));
}

}  // namespace
}  // namespace mw
