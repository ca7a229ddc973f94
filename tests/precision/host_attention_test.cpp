// The host devices' attention on bf16/f16 qkv (Note [Row statistics instead of probabilities],
// core/cpu/attention.cpp): against the exact attention of the same 16-bit values, and its backward
// against the f32 backward it stands for, bitwise.
#include <gtest/gtest.h>

#include <random>

#include "core/convert.h"
#include "core/ops.h"
#include "exact_attention.h"

namespace mw {
namespace {

Tensor randn(const Shape& shape, uint64_t seed, DType dtype) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(gen);
  return Tensor::from_vector(v, shape).to(dtype);
}

// The bound the CUDA kernels meet (tests/cuda/low_precision_test.cpp). Before the row statistics
// the host devices kept bf16 probabilities and took each row's D_t = sum_j p dP from them, an
// error of u sum_j p |dP| in every dS of the row, outside this bound where dP_j - D_t cancels.
TEST(HostLowPrecision, AttentionOn16BitHeadsIsTheExactAttentionToTheirRoundings) {
  const int64_t B = 2, T = 67, NH = 2, C = 32;
  for (Device dev : {Device::cpu(), Device::sim(3)})
    for (DType low : {DType::BF16, DType::F16}) {
      SCOPED_TRACE(dev.str() + " " + dtype_name(low));
      Tensor qkv = randn({B, T, 3 * C}, 61, low), dout = randn({B, T, C}, 62, low);
      const test::ExactAttention e = test::exact_attention(qkv, dout, NH);
      auto r = ops::attention(qkv.to(dev), NH, 0.0, RngState{});
      ASSERT_EQ(r.out.dtype(), low);
      // What backward keeps: each row's softmax max and 1/sum, f32 [B, NH, T, 2].
      ASSERT_EQ(r.att.dtype(), DType::F32);
      ASSERT_EQ(r.att.shape(), (Shape{B, NH, T, 2}));
      test::expect_attention_bound("out", r.out, e.out, e.out_terms);
      Tensor dqkv = ops::attention_backward(dout.to(dev), qkv.to(dev), r.att, NH, 0.0, RngState{});
      ASSERT_EQ(dqkv.dtype(), low);
      test::expect_attention_bound("dqkv", dqkv, e.dqkv, e.dqkv_terms);
    }
}

// The probabilities backward recomputes from the row statistics are the forward's, bit for bit,
// so the 16-bit backward is the f32 backward (which keeps the probabilities) of the widened
// values, rounded once; with dropout, whose mask both regenerate from the same RngState.
TEST(HostLowPrecision, BackwardIsTheF32BackwardOfTheWidenedValuesRoundedOnce) {
  const int64_t B = 2, T = 45, NH = 3, C = 48;
  const RngState rng{1234, 7};
  for (double p : {0.0, 0.25}) {
    SCOPED_TRACE(p);
    Tensor qkv = randn({B, T, 3 * C}, 71, DType::BF16), dout = randn({B, T, C}, 72, DType::BF16);
    Tensor qkv32 = qkv.to(DType::F32), dout32 = dout.to(DType::F32);
    auto r32 = ops::attention(qkv32, NH, p, rng);
    auto r = ops::attention(qkv, NH, p, rng);
    EXPECT_EQ(r.out.to_vector<float>(), r32.out.to(DType::BF16).to_vector<float>());
    Tensor want = ops::attention_backward(dout32, qkv32, r32.att, NH, p, rng).to(DType::BF16);
    Tensor got = ops::attention_backward(dout, qkv, r.att, NH, p, rng);
    EXPECT_EQ(got.to_vector<float>(), want.to_vector<float>());
  }
}

TEST(HostLowPrecision, RowStatisticsOfAnotherShapeAreRefused) {
  Tensor qkv = randn({1, 8, 48}, 81, DType::BF16), dout = randn({1, 8, 16}, 82, DType::BF16);
  Tensor wrong = Tensor::zeros({1, 2, 8, 8}, DType::F32, Device::cpu());
  EXPECT_THROW(ops::attention_backward(dout, qkv, wrong, 2, 0.0, RngState{}), ShapeError);
}

}  // namespace
}  // namespace mw
