// Every differentiable op against central finite differences, in double precision (gradcheck.h).
#include "gradcheck.h"

#include <gtest/gtest-spi.h>

#include "autograd/node.h"

namespace mw {
namespace {

using testing::gradcheck;
using testing::gradcheck_every_mask;
using testing::random_tensor;
using Ts = std::vector<Tensor>;

TEST(Gradcheck, Matmul2D) {
  gradcheck_every_mask([](const Ts& x) { return matmul(x[0], x[1]); },
                       {random_tensor({3, 4}, 1), random_tensor({4, 5}, 2)});
}

TEST(Gradcheck, MatmulFoldedLeadingDims) {
  gradcheck_every_mask([](const Ts& x) { return matmul(x[0], x[1]); },
                       {random_tensor({2, 3, 4}, 1), random_tensor({4, 5}, 2)});
}

TEST(Gradcheck, MatmulBatched) {
  gradcheck_every_mask([](const Ts& x) { return matmul(x[0], x[1]); },
                       {random_tensor({2, 3, 4}, 1), random_tensor({2, 4, 2}, 2)});
}

TEST(Gradcheck, MatmulTransposedView) {  // the LM head: x @ wte^T with wte^T a strided view
  gradcheck_every_mask([](const Ts& x) { return matmul(x[0], transpose(x[1], 0, 1)); },
                       {random_tensor({3, 4}, 1), random_tensor({6, 4}, 2)});
}

TEST(Gradcheck, LmHead) {
  gradcheck_every_mask([](const Ts& x) { return lm_head(x[0], x[1]); },
                       {random_tensor({2, 3, 4}, 1), random_tensor({7, 4}, 2)});
}

TEST(Gradcheck, Linear) {
  gradcheck_every_mask(
      [](const Ts& x) { return linear(x[0], x[1], x[2]); },
      {random_tensor({2, 3, 4}, 1), random_tensor({4, 5}, 2), random_tensor({5}, 3)});
  gradcheck_every_mask([](const Ts& x) { return linear(x[0], x[1], Tensor()); },
                       {random_tensor({3, 4}, 4), random_tensor({4, 2}, 5)});
}

TEST(Gradcheck, BinaryOpsWithBroadcasting) {
  for (int op = 0; op < 4; ++op) {
    SCOPED_TRACE(op);
    auto f = [op](const Ts& x) {
      switch (op) {
        case 0: return add(x[0], x[1]);
        case 1: return sub(x[0], x[1]);
        case 2: return mul(x[0], x[1]);
        default: return div(x[0], x[1]);
      }
    };
    // Divisor kept away from zero: 2 + N(0, 0.3).
    Tensor b = ops::affine_scalar(random_tensor({3, 1}, 2, 0.3), 1.0, 2.0);
    gradcheck_every_mask(f, {random_tensor({2, 3, 4}, 1), b});
    gradcheck_every_mask(
        f, {random_tensor({4}, 3), ops::affine_scalar(random_tensor({2, 3, 4}, 4, 0.3), 1.0, 2.0)});
  }
}

TEST(Gradcheck, ScalarOps) {
  gradcheck([](const Ts& x) { return affine(x[0], -1.5, 0.25); }, {random_tensor({2, 5}, 1)});
  gradcheck([](const Ts& x) { return add_scalar(mul_scalar(x[0], 3.0), 1.0); },
            {random_tensor({7}, 2)});
}

TEST(Gradcheck, SumAndMean) {
  gradcheck([](const Ts& x) { return sum(x[0]); }, {random_tensor({3, 4}, 1)});
  gradcheck([](const Ts& x) { return mean(x[0]); }, {random_tensor({3, 4}, 1)});
  gradcheck([](const Ts& x) { return sum(x[0], 1, false); }, {random_tensor({2, 3, 4}, 1)});
  gradcheck([](const Ts& x) { return mean(x[0], -1, true); }, {random_tensor({2, 3, 4}, 1)});
  gradcheck([](const Ts& x) { return sum(x[0], 0, true); }, {random_tensor({2, 3, 4}, 1)});
}

TEST(Gradcheck, Views) {
  gradcheck_every_mask(
      [](const Ts& x) {
        return mul(view(x[0], {4, 6}), x[1]);
      },
      {random_tensor({2, 3, 4}, 1), random_tensor({4, 6}, 2)});
  gradcheck_every_mask([](const Ts& x) { return mul(reshape(transpose(x[0], 0, 2), {-1}), x[1]); },
                       {random_tensor({2, 3, 4}, 1), random_tensor({24}, 2)});
  gradcheck(
      [](const Ts& x) {
        return contiguous(permute(x[0], {2, 0, 1}));
      },
      {random_tensor({2, 3, 4}, 1)});
  gradcheck_every_mask(
      [](const Ts& x) {
        return matmul(permute(x[0], {0, 2, 1}), x[1]);
      },
      {random_tensor({2, 3, 4}, 1), random_tensor({2, 3, 5}, 2)});
}

TEST(Gradcheck, Embedding) {
  Tensor ids = Tensor::from_vector<int32_t>({1, 4, 1, 0, 3, 4}, {2, 3});  // repeated ids accumulate
  gradcheck([&](const Ts& x) { return embedding(x[0], ids); }, {random_tensor({5, 3}, 1)});
}

TEST(Gradcheck, TiedEmbeddingAndHead) {  // the embedding adds into the head's pending gradient
  Tensor ids = Tensor::from_vector<int32_t>({1, 4, 1, 0, 3, 2}, {2, 3});
  gradcheck([&](const Ts& x) { return lm_head(embedding(x[0], ids), x[0]); },
            {random_tensor({5, 3}, 1)});
}

TEST(Gradcheck, LayerNorm) {
  gradcheck_every_mask([](const Ts& x) { return layernorm(x[0], x[1], x[2], 1e-5); },
                       {random_tensor({2, 3, 8}, 1), random_tensor({8}, 2), random_tensor({8}, 3)});
}

TEST(Gradcheck, Gelu) {
  gradcheck([](const Ts& x) { return gelu(x[0]); }, {random_tensor({3, 7}, 1, 2.0)});
}

TEST(Gradcheck, Softmax) {
  gradcheck([](const Ts& x) { return softmax(x[0]); }, {random_tensor({3, 6}, 1, 2.0)});
}

TEST(Gradcheck, DropoutIsDeterministicGivenTheGenerator) {
  Generator gen(7);
  gradcheck(
      [&](const Ts& x) {
        gen.set_state({7, 0});  // every evaluation draws the same mask
        return dropout(x[0], 0.3, gen);
      },
      {random_tensor({4, 9}, 1)});
}

// B=2, T=5, C=4 (two heads of size 2) sits inside one causal block of the host attention (Note
// [Causal products by blocks], core/cpu/attention.cpp: 64 rows); T=130 is two full blocks and a
// block of two rows, so every product meets a block below the diagonal, the diagonal blocks and
// the short last one (a causal_ltx that kept only the diagonal block passed T=5 alone).
TEST(Gradcheck, CausalSelfAttention) {
  Generator gen(3);
  for (const Shape& shape : {Shape{2, 5, 12}, Shape{1, 130, 12}})
    for (double p : {0.0, 0.25}) {
      SCOPED_TRACE(shape_str(shape) + " p " + std::to_string(p));
      gradcheck(
          [&](const Ts& x) {
            gen.set_state({3, 0});
            return causal_self_attention(x[0], 2, p, gen);
          },
          {random_tensor(shape, 1)});
    }
}

TEST(Gradcheck, ShiftedCrossEntropy) {
  Tensor ids = Tensor::from_vector<int64_t>({1, 4, 2, 0, 3, 4, 4, 1}, {2, 4});
  gradcheck([&](const Ts& x) { return shifted_cross_entropy(x[0], ids); },
            {random_tensor({2, 4, 5}, 1, 2.0)});
}

TEST(Gradcheck, ComposedBlockLikeGpt2) {  // ln -> linear -> attention -> linear, plus residual
  Generator gen(0);
  gradcheck(
      [&](const Ts& x) {
        Tensor h = layernorm(x[0], x[1], x[2], 1e-5);
        Tensor qkv = linear(h, x[3], Tensor());
        Tensor a = causal_self_attention(qkv, 2, 0.0, gen);
        return add(x[0], gelu(a));
      },
      {random_tensor({1, 3, 4}, 1), random_tensor({4}, 2), random_tensor({4}, 3),
       random_tensor({4, 12}, 4, 0.5)});
}

}  // namespace
}  // namespace mw

namespace mw {
namespace {

// The checker itself must be able to fail. x^2 with the backward g -> dx(g, x), and the number of
// failures gradcheck reports for it.
using SquareBackward = std::function<Tensor(const Tensor& g, const Tensor& x)>;

Tensor square(const Tensor& x, const SquareBackward& dx) {
  Tensor out = ops::binary(ops::BinaryOp::Mul, x, x);
  return record("SquareBackward", out, {x}, [&](const std::vector<bool>&) -> BackwardFn {
    Tensor saved = x.detach();
    return [saved, dx](const std::vector<Tensor>& g) -> std::vector<Tensor> {
      return {dx(g[0], saved)};
    };
  });
}

int failures_of(const SquareBackward& dx, const Tensor& x) {
  ::testing::TestPartResultArray failures;
  {
    ::testing::ScopedFakeTestPartResultReporter intercept(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    testing::gradcheck([&](const Ts& t) { return square(t[0], dx); }, {x});
  }
  return failures.size();
}

// g * factor * x: d(x^2)/dx = 2x when factor is 2.
SquareBackward times_x(double factor) {
  return [factor](const Tensor& g, const Tensor& x) {
    return ops::binary(ops::BinaryOp::Mul, g, ops::affine_scalar(x, factor, 0.0));
  };
}

TEST(Gradcheck, DetectsAWrongBackward) {
  const Tensor x = random_tensor({4}, 1);
  EXPECT_EQ(failures_of(times_x(2.0), x), 0) << "gradcheck rejected the right backward";
  EXPECT_GE(failures_of(times_x(2.02), x), 1) << "gradcheck accepted a gradient that is 1% wrong";
}

// The right formula computed in f32 has a relative error of up to 2^-24 = 6e-8 per element (under
// the old tolerance of 1e-7 it passed with 2.7e-8): widened back to f64 the tolerance rejects it
// (Note [Gradcheck tolerance]); left in f32 the dtype check does.
TEST(Gradcheck, DetectsAGradientComputedInF32) {
  const Tensor x = random_tensor({64}, 1);
  const SquareBackward in_f32 = [](const Tensor& g, const Tensor& x) {
    return times_x(2.0)(g.to(DType::F32), x.to(DType::F32));
  };
  EXPECT_GE(
      failures_of([&](const Tensor& g, const Tensor& x) { return in_f32(g, x).to(x.dtype()); }, x),
      1)
      << "gradcheck accepted an f64 gradient rounded to f32";
  EXPECT_GE(failures_of(in_f32, x), 1) << "gradcheck accepted an f32 gradient of an f64 input";
}

// A NaN gradient compared false with every tolerance and left the largest ratio as it was: an
// all-NaN backward passed every gradcheck.
TEST(Gradcheck, DetectsANaNGradient) {
  const Tensor x = random_tensor({4}, 1);
  EXPECT_GE(failures_of(times_x(NAN), x), 1) << "gradcheck accepted NaN gradients";
}

TEST(Gradcheck, RejectsANonContiguousInput) {  // element i is not at data + i
  EXPECT_GE(failures_of(times_x(2.0), random_tensor({3, 4}, 1).transpose(0, 1)), 1);
}

}  // namespace
}  // namespace mw
