// Each CPU op's f32 forward and backward against its own f64 version on the same (f32-exact)
// inputs. The error is normwise, in units of f32 epsilon: max |y32 - y64| / (max |y64| * 2^-24).
// Each bound is written next to its reason; the sizes are large enough (thousands of rows, wide
// rows) that a running f32 sum, whose error grows with its length, fails the bounds of the sums
// (Note [Reductions accumulate in double], src/core/cpu/layers.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "core/ops.h"
#include "core/random.h"

namespace mw {
namespace {

constexpr double kEps = 5.9604644775390625e-8;  // 2^-24, half an f32 ulp of 1

// Normal(mean, stddev) values rounded to f32, returned as an f64 tensor (exact in both types).
Tensor random_f64(const Shape& shape, uint64_t seed, double mean = 0, double stddev = 1) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(mean + stddev * random_normal({seed, 0}, static_cast<uint64_t>(i)));
  return Tensor::from_vector(v, shape);
}

Tensor f32(const Tensor& t) { return t.to(DType::F32); }

// Normwise error of an f32 result against the f64 one, in f32 epsilons.
double eps_error(const std::string& what, const Tensor& got32, const Tensor& want64) {
  EXPECT_EQ(got32.dtype(), DType::F32) << what;
  auto a = got32.to_vector<double>(), e = want64.to_vector<double>();
  EXPECT_EQ(a.size(), e.size()) << what;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < std::min(a.size(), e.size()); ++i) {
    diff = std::max(diff, std::abs(a[i] - e[i]));
    scale = std::max(scale, std::abs(e[i]));
  }
  const double err = diff / (scale * kEps);
  std::printf("  %-28s %8.2f eps\n", what.c_str(), err);
  return err;
}

TEST(OpsAccuracy, LinearBiasGradientIsOneRounding) {
  // 8192 rows with mean 1: a running f32 sum reaches 8192 and loses ~sqrt(8192) half-ulps (the
  // code before measured 47 eps).
  Tensor x = random_f64({8192, 16}, 1), w = random_f64({16, 64}, 2),
         dy = random_f64({8192, 64}, 3, 1.0);
  auto g64 = ops::linear_backward(dy, x, w, true, true, true);
  auto g32 = ops::linear_backward(f32(dy), f32(x), f32(w), true, true, true);
  // A sum accumulated in double and rounded once is within half an ulp: at most 1 eps normwise.
  EXPECT_LE(eps_error("linear dbias", g32.dbias, g64.dbias), 1.0);
  // dx and dw are OpenBLAS sgemm (K = 64 and 8192 terms, blocked sums): the same kernels PyTorch
  // uses; their bound only guards the call (a wrong transpose or leading dimension is ~1e7 eps).
  EXPECT_LE(eps_error("linear dx (sgemm)", g32.dx, g64.dx), 64.0);
  EXPECT_LE(eps_error("linear dw (sgemm)", g32.dw, g64.dw), 256.0);
  Tensor b = random_f64({64}, 4);
  // Forward: sgemm over K = 16 plus the bias, a few roundings of terms of size ~4.
  EXPECT_LE(eps_error("linear forward", ops::linear(f32(x), f32(w), f32(b)), ops::linear(x, w, b)),
            16.0);
}

TEST(OpsAccuracy, LayerNormForwardAndBackward) {
  // Rows of 768 (GPT-2 small's width) centred at 3, so the mean's rounding matters; 4096 rows for
  // the column sums of dweight and dbias; dout with mean 1 so those sums grow. With f32 running
  // sums these measured 14 (forward), 41 (dx), 8.2 (dbias) and 17 (dweight) eps.
  const int64_t N = 4096, C = 768;
  Tensor x = random_f64({N, C}, 5, 3.0), w = random_f64({C}, 6, 1.0, 0.2), b = random_f64({C}, 7);
  Tensor dy = random_f64({N, C}, 8, 1.0);
  auto f64 = ops::layernorm(x, w, b, 1e-5);
  auto f32r = ops::layernorm(f32(x), f32(w), f32(b), 1e-5);
  // out = (x - mean) * rstd * w + b: mean and rstd rounded once (double moments), then four f32
  // roundings of values up to ~4 |out|: at most ~8 eps normwise.
  EXPECT_LE(eps_error("layernorm forward", f32r.out, f64.out), 8.0);
  auto g64 = ops::layernorm_backward(dy, x, w, f64.mean, f64.rstd);
  auto g32 = ops::layernorm_backward(f32(dy), f32(x), f32(w), f32r.mean, f32r.rstd);
  // dx: the row means in double, then (w d - mean - norm * mean2) * rstd in f32: a few roundings
  // of terms as large as the result, and norm's own ~4 eps: 16 eps.
  EXPECT_LE(eps_error("layernorm dx", g32.dx, g64.dx), 16.0);
  // dbias: a pure column sum of f32 inputs in double, rounded once: 1 eps.
  EXPECT_LE(eps_error("layernorm dbias", g32.dbias, g64.dbias), 1.0);
  // dweight: the sum of d * norm, where each f32 norm carries ~4 eps of independent rounding that
  // averages out over 4096 rows; summed in double: 2 eps.
  EXPECT_LE(eps_error("layernorm dweight", g32.dweight, g64.dweight), 2.0);
}

TEST(OpsAccuracy, GeluForwardAndBackward) {
  // Inputs over GELU's whole working range, x ~ N(0, 3).
  Tensor x = random_f64({1 << 16}, 9, 0.0, 3.0), dy = random_f64({1 << 16}, 10);
  // x / (1 + exp(-2u)) (Note [GELU as a sigmoid]): fast::exp within 1.5 ulp plus ~6 roundings of
  // u and the quotient: 8 eps.
  EXPECT_LE(eps_error("gelu forward", ops::gelu(f32(x)), ops::gelu(x)), 8.0);
  // sigma + 2 x sigma (e sigma) s (1 + 3 k x^2): one exp and ~8 roundings of terms no larger than
  // the result's scale (measured 1.9; the tanh form with 1 - tanh^2 measured 6.6): 4 eps.
  EXPECT_LE(
      eps_error("gelu backward", ops::gelu_backward(f32(dy), f32(x)), ops::gelu_backward(dy, x)),
      4.0);
}

TEST(OpsAccuracy, SoftmaxForwardAndBackward) {
  // 64 rows of 4096 (a long attention row or a small vocabulary). With f32 running sums these
  // measured 19 eps forward and 49 backward.
  Tensor x = random_f64({64, 4096}, 11, 0.0, 2.0), dy = random_f64({64, 4096}, 12, 1.0);
  Tensor y64 = ops::softmax(x), y32 = ops::softmax(f32(x));
  // expf (libm, < 1 ulp) times 1/sum with the sum in double: 3 roundings, 4 eps.
  EXPECT_LE(eps_error("softmax forward", y32, y64), 4.0);
  // y (d - dot): the dot in double; d - dot cancels (dot ~ 1 = mean of d), so the error is relative
  // to |d| + |dot| ~ 4 rather than to the result: 16 eps.
  EXPECT_LE(eps_error("softmax backward", ops::softmax_backward(f32(dy), y32),
                      ops::softmax_backward(dy, y64)),
            16.0);
}

TEST(OpsAccuracy, AttentionForwardAndBackward) {
  // B 2, T 256, C 128, 4 heads of 32: scores from sgemm over 32, causal rows up to 256 long.
  Tensor qkv = random_f64({2, 256, 384}, 13), dout = random_f64({2, 256, 128}, 14);
  auto f64 = ops::attention(qkv, 4, 0.0, {});
  auto f32r = ops::attention(f32(qkv), 4, 0.0, {});
  // Scores from 32-term sgemm dot products carry a few eps of absolute error, which exp turns into
  // relative error of the probabilities; p @ v then sums up to 256 terms (measured 3.6): 8 eps.
  EXPECT_LE(eps_error("attention forward", f32r.out, f64.out), 8.0);
  Tensor d64 = ops::attention_backward(dout, qkv, f64.att, 4, 0.0, {});
  Tensor d32 = ops::attention_backward(f32(dout), f32(qkv), f32r.att, 4, 0.0, {});
  // Four sgemms and the softmax backward (dot in double) on probabilities already a few eps off
  // (measured 8.1): 16 eps.
  EXPECT_LE(eps_error("attention backward", d32, d64), 16.0);
}

TEST(OpsAccuracy, CrossEntropyForwardAndBackward) {
  // GPT-2's vocabulary: 50257 logits per row, 16 rows; logits ~ N(0, 2).
  const int64_t B = 2, T = 9, V = 50257;
  Tensor logits = random_f64({B, T, V}, 15, 0.0, 2.0);
  std::vector<int64_t> id(B * T);
  for (int64_t i = 0; i < B * T; ++i) id[i] = (i * 7919) % V;
  Tensor ids = Tensor::from_vector(id, {B, T});
  auto [loss64, lse64] = ops::shifted_cross_entropy(logits, ids);
  auto [loss32, lse32] = ops::shifted_cross_entropy(f32(logits), ids);
  // lse = max + log(sum of 50257 exps): fast::exp's (< 1 ulp) errors average out in the double
  // sum, and max + log(sum) is rounded to f32 once: 1 eps (eight f32 lanes of 6282 terms each,
  // the code before, measured 1.5).
  EXPECT_LE(eps_error("cross-entropy lse", lse32, lse64), 1.0);
  // The mean of 16 row losses, summed in double: 1 eps.
  EXPECT_LE(eps_error("cross-entropy loss", loss32, loss64), 1.0);
  Tensor one64 = Tensor::ones({}, DType::F64), one32 = Tensor::ones({}, DType::F32);
  Tensor d64 = ops::shifted_cross_entropy_backward(one64, logits, lse64, ids, false);
  Tensor d32 = ops::shifted_cross_entropy_backward(one32, f32(logits), lse32, ids, false);
  // exp(logit - lse) * scale: lse's ~4 eps absolute error (|lse| ~ 12, so ~50 eps relative to 1)
  // becomes a relative error of every probability; the target's -scale dominates the normwise
  // scale: 64 eps.
  EXPECT_LE(eps_error("cross-entropy dlogits", d32, d64), 64.0);
}

TEST(OpsAccuracy, SumsAndEmbeddingBackward) {
  // The autograd's reductions: a broadcast add's gradient (sum_to_shape over 4096 rows), sum_dim
  // down 4096 rows, sum_all of 2^20 values; values with mean 1, so running f32 sums would lose
  // ~sqrt(n) half-ulps (sum_dim and sum_to_shape with f32 running sums measured 49 eps each).
  Tensor g = random_f64({4096, 64}, 16, 1.0);
  // Each is summed in double and rounded once: 1 eps.
  EXPECT_LE(
      eps_error("sum_to_shape", ops::sum_to_shape(f32(g), {1, 64}), ops::sum_to_shape(g, {1, 64})),
      1.0);
  EXPECT_LE(eps_error("sum_dim", ops::sum_dim(f32(g), 0, false), ops::sum_dim(g, 0, false)), 1.0);
  Tensor big = random_f64({1 << 20}, 17, 1.0);
  EXPECT_LE(eps_error("sum_all", ops::sum_all(f32(big)), ops::sum_all(big)), 1.0);
  // Embedding backward adds each position's row into its token's row, in order, in f32 (a double
  // copy of a 50257-row table would cost more than the table): 2048 positions over 16 tokens, 128
  // terms per row with mean 1, measured 6.7 eps; the bound is a running f32 sum's ~sqrt(128) half-
  // ulps: 12 eps. Rows of a real vocabulary get a handful of terms each; wpe's get B.
  Tensor dout = random_f64({2048, 32}, 18, 1.0);
  std::vector<int64_t> id(2048);
  for (int64_t i = 0; i < 2048; ++i) id[i] = (i * 7) % 16;
  Tensor ids = Tensor::from_vector(id, {2048});
  EXPECT_LE(eps_error("embedding backward", ops::embedding_backward(f32(dout), ids, 16),
                      ops::embedding_backward(dout, ids, 16)),
            12.0);
}

}  // namespace
}  // namespace mw
