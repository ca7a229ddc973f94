// The gradient norm's block partials (Note [Norm order], optim/grad_norm.h): their arithmetic
// against a float64 sum in another order, their independence of the thread count, and, on a GPU,
// the device kernel against the CPU bit for bit (the norm of a CUDA gradient is reduced where it
// lives; only the partials cross to the host).
#include "optim/grad_norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../cuda/cuda_test_util.h"
#include "autograd/autograd.h"
#include "core/parallel.h"
#include "core/random.h"
#include "core/tensor.h"
#include "optim/loss_scaler.h"

namespace mw::optim {
namespace {

// n values of spread magnitudes (normal x 2^k, k in [-20, 20]), the hard case for rounding.
std::vector<float> spread_values(int64_t n, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(n));
  fill_normal(v.data(), 0, v.size(), RngState{seed, 0}, 1.0);
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = static_cast<float>(std::ldexp(v[i], static_cast<int>(i * 7919 % 41) - 20));
  return out;
}

// Sizes around the block and lane boundaries: a tail block, a tail inside a warp, tiny tensors.
const std::vector<int64_t> kSizes = {1,
                                     31,
                                     33,
                                     kNormBlock - 1,
                                     kNormBlock,
                                     kNormBlock + 5,
                                     3 * kNormBlock + 1000,
                                     5 * kNormBlock + 31};

TEST(GradNorm, BlockPartialsAreTheSumsOfSquaresInEachBlock) {
  for (int64_t n : kSizes) {
    SCOPED_TRACE(n);
    const std::vector<float> x = spread_values(n, 11);
    std::vector<double> parts;
    append_block_squares(x.data(), n, parts);
    ASSERT_EQ(static_cast<int64_t>(parts.size()), (n + kNormBlock - 1) / kNormBlock);
    for (size_t b = 0; b < parts.size(); ++b) {
      long double want = 0;  // in another order and wider: the partial is within double rounding
      for (int64_t i = static_cast<int64_t>(b) * kNormBlock;
           i < std::min(n, static_cast<int64_t>(b + 1) * kNormBlock); ++i)
        want += static_cast<long double>(x[i]) * x[i];
      // 2^16 additions of positive terms in double: relative error below 2^16 x 2^-53 = 2^-37.
      EXPECT_NEAR(parts[b], static_cast<double>(want), std::ldexp(static_cast<double>(want), -37));
    }
  }
}

TEST(GradNorm, PartialsAreBitwiseTheSameForAnyThreadCountAndForTheTensorOverload) {
  const int64_t n = 5 * kNormBlock + 31;
  const std::vector<float> x = spread_values(n, 12);
  const int threads = num_threads();
  std::vector<double> one, many, tensor;
  set_num_threads(1);
  append_block_squares(x.data(), n, one);
  set_num_threads(4);
  append_block_squares(x.data(), n, many);
  set_num_threads(threads);
  append_block_squares(Tensor::from_vector(x, {n}), tensor);
  ASSERT_EQ(one.size(), many.size());
  EXPECT_EQ(std::memcmp(one.data(), many.data(), one.size() * sizeof(double)), 0);
  ASSERT_EQ(one.size(), tensor.size());
  EXPECT_EQ(std::memcmp(one.data(), tensor.data(), one.size() * sizeof(double)), 0);
}

TEST(GradNorm, TheTensorOverloadRefusesWhatItCannotRead) {
  std::vector<double> parts;
  EXPECT_THROW(append_block_squares(Tensor::zeros({4}, DType::F64), parts), InvalidArgument);
  EXPECT_THROW(append_block_squares(Tensor::zeros({4, 3}).transpose(0, 1), parts), InvalidArgument);
}

TEST(GradNormCuda, DevicePartialsAreTheCpusBitForBit) {
  MW_SKIP_WITHOUT_GPU();
  for (int64_t n : kSizes) {
    SCOPED_TRACE(n);
    std::vector<float> x = spread_values(n, 13);
    x[0] = std::numeric_limits<float>::max();                // its square is finite in double
    x[static_cast<size_t>(n - 1)] = std::ldexp(1.0f, -149);  // the smallest subnormal
    std::vector<double> cpu, gpu;
    append_block_squares(x.data(), n, cpu);
    append_block_squares(Tensor::from_vector(x, {n}).to(test::gpu()), gpu);
    ASSERT_EQ(cpu.size(), gpu.size());
    EXPECT_EQ(std::memcmp(cpu.data(), gpu.data(), cpu.size() * sizeof(double)), 0);
    x[static_cast<size_t>(n / 2)] = std::numeric_limits<float>::infinity();
    gpu.clear();
    append_block_squares(Tensor::from_vector(x, {n}).to(test::gpu()), gpu);
    EXPECT_TRUE(std::isinf(gpu[static_cast<size_t>(n / 2 / kNormBlock)])) << "an inf is found";
  }
}

// fp16's check and unscale on a CUDA gradient (the check reads block partials on the device): an
// inf or a NaN anywhere is found, and finite gradients are unscaled as on the CPU, bit for bit (a
// division by a power of two).
TEST(LossScalerCuda, AnInfOrNanOnTheDeviceIsFoundAndFiniteGradientsUnscaleAsOnTheCpu) {
  MW_SKIP_WITHOUT_GPU();
  const int64_t n = 3 * kNormBlock + 7;
  const std::vector<float> x = spread_values(n, 14);
  for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
    std::vector<float> y = x;
    y[static_cast<size_t>(n - 2)] = bad;
    Tensor p = Tensor::zeros({n}, DType::F32, test::gpu());
    set_requires_grad(p);
    set_grad(p, Tensor::from_vector(y, {n}).to(test::gpu()));
    DynamicLossScaler scaler;
    EXPECT_FALSE(scaler.unscale_and_check({p})) << bad;
  }
  Tensor p = Tensor::zeros({n}, DType::F32, test::gpu()), q = Tensor::zeros({n});
  set_requires_grad(p);
  set_requires_grad(q);
  set_grad(p, Tensor::from_vector(x, {n}).to(test::gpu()));
  set_grad(q, Tensor::from_vector(x, {n}));
  DynamicLossScaler scaler;
  ASSERT_TRUE(scaler.unscale_and_check({p}));
  ASSERT_TRUE(scaler.unscale_and_check({q}));
  const std::vector<float> got = grad(p).to_vector<float>(), want = grad(q).to_vector<float>();
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace mw::optim
