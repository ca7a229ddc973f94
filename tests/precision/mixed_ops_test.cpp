// The bf16/f16 variants of the ops (Note [Low-precision storage], core/mixed_ops.h) and the
// autocast policy (Note [Autocast policy], autograd/autocast.h): each low-precision result against
// the f32 result, within a bound written next to it, and the gradients of the autocast forms.
//
// The bounds come from the rounding steps: a bf16 value carries 8 significant bits (7 stored, one
// implicit), so rounding to it moves a value by at most half an ulp, u = 2^-8 of itself (f16: 11
// bits, u = 2^-11, within its normal range). An op that rounds its inputs to bf16, computes in f32
// and rounds its output once differs from the f32 op by at most (inputs' rounding, propagated) + u
// |result| + the f32 arithmetic's.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "../autograd/gradcheck.h"
#include "../recompute/recompute_test_util.h"
#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "core/convert.h"
#include "core/ops.h"
#include "nn/checkpoint.h"
#include "offload/activation/activation_offload.h"

namespace mw {
namespace {

double unit_roundoff(DType t) {
  return t == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}

Tensor randn(const Shape& shape, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.f, static_cast<float>(scale));
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(gen);
  return Tensor::from_vector(v, shape);
}

// |got - want| <= bound[i] for every element; reports the worst element.
void expect_within(const std::string& what, const Tensor& got, const Tensor& want,
                   const std::vector<double>& bound) {
  auto g = got.to(DType::F32).to_vector<float>(), w = want.to(DType::F32).to_vector<float>();
  ASSERT_EQ(g.size(), w.size()) << what;
  ASSERT_EQ(g.size(), bound.size()) << what;
  size_t worst = 0, bad = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double err = std::fabs(static_cast<double>(g[i]) - w[i]);
    const double ratio = bound[i] > 0 ? err / bound[i] : (err > 0 ? INFINITY : 0);
    if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
    if (!(err <= bound[i])) ++bad;
  }
  EXPECT_EQ(bad, 0u) << what << ": worst element " << worst << ": " << g[worst] << " vs "
                     << w[worst] << ", bound " << bound[worst];
  // A bound that is never approached would not catch a wrong rounding either: the worst element
  // must use a visible part of it.
  EXPECT_GT(worst_ratio, 0.01) << what << ": the bound is loose";
}

// Bound for y = a @ b computed from low-precision copies of a and b, rounded once: each product
// term moves by at most 2u|a||b| (+u^2), the result by u|y|; f32 accumulation adds K*2^-24 of the
// absolute sum.
std::vector<double> product_bound(const Tensor& a, const Tensor& b, DType low, bool round_out) {
  const double u = unit_roundoff(low);
  Tensor aa = a.to(DType::F64), ab = b.to(DType::F64);
  auto va = aa.to_vector<double>(), vb = ab.to_vector<double>();
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  std::vector<double> out(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double abs_sum = 0, sum = 0;
      for (int64_t k = 0; k < K; ++k) {
        abs_sum += std::fabs(va[i * K + k] * vb[k * N + j]);
        sum += va[i * K + k] * vb[k * N + j];
      }
      out[i * N + j] = (2 * u + u * u) * abs_sum * (round_out ? 1 + u : 1) +
                       (round_out ? u * (std::fabs(sum) + (2 * u + u * u) * abs_sum) : 0) +
                       static_cast<double>(K) * std::ldexp(1.0, -23) * abs_sum;
    }
  return out;
}

TEST(MixedOps, BlockedGemmMatchesF32WithinTheRoundingBound) {
  // K and N cross the 2048 block, so both the K accumulation and the N cut are exercised.
  const int64_t M = 5, K = 2100, N = 2060;
  Tensor a = randn({M, K}, 1), b = randn({K, N}, 2);
  Tensor ref = Tensor::empty({M, N});
  ops::gemm(a, false, b, false, ref, false);
  for (DType low : {DType::BF16, DType::F16}) {
    Tensor out = Tensor::empty({M, N}, low);
    ops::gemm(a.to(low), false, b.to(low), false, out, false);
    expect_within(str("gemm ", dtype_name(low)), out, ref, product_bound(a, b, low, true));
    // Transposed views give the same bits as their row-major copies.
    Tensor out_t = Tensor::empty({M, N}, low);
    Tensor bt = b.transpose(0, 1).contiguous().to(low);
    ops::gemm(a.to(low), false, bt, true, out_t, false);
    EXPECT_EQ(out.to(DType::F32).to_vector<float>(), out_t.to(DType::F32).to_vector<float>());
    // An f32 output with low inputs: the rounding of the result is the only term gone.
    Tensor out32 = Tensor::empty({M, N});
    ops::gemm(a.to(low), false, b.to(low), false, out32, false);
    expect_within(str("gemm ", dtype_name(low), " -> f32"), out32, ref,
                  product_bound(a, b, low, false));
  }
}

TEST(MixedOps, LinearGeluAttentionAndLossTrackF32) {
  const DType low = DType::BF16;
  const double u = unit_roundoff(low);
  Tensor x = randn({2, 8, 16}, 3), w = randn({16, 48}, 4, 0.25), bias = randn({48}, 5);
  // linear: the product bound plus the bias term (exact in f32).
  Tensor y32 = ops::linear(x, w, bias), y = ops::linear(x.to(low), w.to(low), bias);
  EXPECT_EQ(y.dtype(), low);
  auto pb = product_bound(x.reshape({16, 16}), w, low, false);
  auto yv = y32.to_vector<float>();
  for (size_t i = 0; i < pb.size(); ++i) pb[i] += u * (std::fabs(yv[i]) + pb[i]);
  expect_within("linear", y, y32, pb);
  // GELU: |gelu'| <= 1.13, so the input's rounding moves the output by <= 1.13 u|x|; then the
  // output's own rounding u|y|, and the tanh approximation's f32 error (1e-6 absolute).
  Tensor g32 = ops::gelu(y32.to(low).to(DType::F32)), g = ops::gelu(y32.to(low));
  std::vector<double> gb;
  for (float v : g32.to_vector<float>()) gb.push_back(u * std::fabs(v) + 1e-6);
  expect_within("gelu", g, g32, gb);
  // Attention on bf16 qkv: f32 inside, the output rounded once (u|out|, plus the f32 softmax's
  // 1e-6 absolute). Backward keeps each row's softmax statistics in f32, not the probabilities
  // (Note [Row statistics instead of probabilities]; tests/precision/host_attention_test.cpp).
  Tensor qkv = y32.to(low);
  auto a32 = ops::attention(qkv.to(DType::F32), 4, 0.0, {});
  auto a = ops::attention(qkv, 4, 0.0, {});
  EXPECT_EQ(a.out.dtype(), low);
  EXPECT_EQ(a.att.dtype(), DType::F32);
  std::vector<double> ab;
  for (float v : a32.out.to_vector<float>()) ab.push_back(u * std::fabs(v) + 1e-6);
  expect_within("attention", a.out, a32.out, ab);
  // The loss of bf16 logits is f32 and equals the f32 loss of the same (widened) values up to the
  // f32 arithmetic (1e-6 relative: the sum of exps is in double, one log).
  Tensor logits = randn({2, 8, 97}, 6, 3.0).to(low);
  std::vector<int32_t> idv(16);
  for (int i = 0; i < 16; ++i) idv[i] = (i * 37) % 97;
  Tensor ids = Tensor::from_vector(idv, {2, 8});
  auto [loss, lse] = ops::shifted_cross_entropy(logits, ids);
  auto [loss32, lse32] = ops::shifted_cross_entropy(logits.to(DType::F32), ids);
  EXPECT_EQ(loss.dtype(), DType::F32);
  EXPECT_NEAR(loss.item(), loss32.item(), 1e-6 * std::fabs(loss32.item()));
  // Its gradient is the f32 gradient rounded once (reusing the bf16 buffer): within u|d|.
  Tensor d =
      ops::shifted_cross_entropy_backward(Tensor::full({}, 1.0), logits.clone(), lse, ids, true);
  Tensor d32 = ops::shifted_cross_entropy_backward(Tensor::full({}, 1.0), logits.to(DType::F32),
                                                   lse32, ids, false);
  EXPECT_EQ(d.dtype(), low);
  std::vector<double> db;
  for (float v : d32.to_vector<float>()) db.push_back(u * std::fabs(v) + 1e-9);
  expect_within("cross-entropy backward", d, d32, db);
}

TEST(Autocast, CastIsDifferentiableAndItsGradientIsTheCastBack) {
  Tensor x = randn({5}, 7);
  set_requires_grad(x);
  Tensor y = cast(x, DType::BF16);
  EXPECT_EQ(y.dtype(), DType::BF16);
  Tensor seed = randn({5}, 8).to(DType::BF16);
  backward(y, seed);
  EXPECT_EQ(grad(x).dtype(), DType::F32);
  EXPECT_EQ(grad(x).to_vector<float>(), seed.to(DType::F32).to_vector<float>());
  EXPECT_THROW(AutocastGuard guard{DType::F64}, InvalidArgument);
  EXPECT_THROW(parse_precision("fp8"), InvalidArgument);
}

// The ops autocast reroutes keep their double path under an active bf16 autocast, and it passes
// the finite-difference gradient check (tests/autograd/gradcheck.h, tolerance reasoned there). The
// low-precision variants themselves compute in f32 and have no double path; their gradients are
// checked against the f32 formulas below.
TEST(Autocast, DoubleIsNeverCastSoGradcheckRunsUnchanged) {
  using Ts = std::vector<Tensor>;
  AutocastGuard bf16(DType::BF16);
  Tensor x = testing::random_tensor({3, 4}, 9), w = testing::random_tensor({4, 5}, 10);
  EXPECT_EQ(linear(x, w, Tensor()).dtype(), DType::F64);
  EXPECT_EQ(matmul(x, w).dtype(), DType::F64);
  testing::gradcheck([](const Ts& t) { return linear(t[0], t[1], t[2]); },
                     {x, w, testing::random_tensor({5}, 11)});
  testing::gradcheck([](const Ts& t) { return matmul(t[0], t[1]); },  // fresh leaves: no old .grad
                     {testing::random_tensor({3, 4}, 9), testing::random_tensor({4, 5}, 10)});
  testing::gradcheck([](const Ts& t) { return lm_head(t[0], t[1]); },
                     {testing::random_tensor({2, 3, 4}, 12), testing::random_tensor({6, 4}, 13)});
  Generator gen(3);
  testing::gradcheck([&gen](const Ts& t) { return causal_self_attention(t[0], 2, 0.0, gen); },
                     {testing::random_tensor({2, 5, 12}, 14)});
}

// The autocast linear's gradients against the f32 op's, analytically (the low variants have no
// double path to run finite differences on; the f32 formulas they reuse have theirs in
// tests/autograd). dx = dy @ w^T and dw = x^T @ dy from bf16 copies: the product bound.
TEST(Autocast, LinearGradientsFlowToTheF32MastersWithinTheBound) {
  Tensor x = randn({6, 16}, 11), w = randn({16, 12}, 12, 0.25), bias = randn({12}, 13);
  Tensor dy = randn({6, 12}, 14);
  for (Tensor* t : {&x, &w, &bias}) set_requires_grad(*t);
  Tensor y;
  {
    AutocastGuard bf16(DType::BF16);
    y = linear(x, w, bias);
  }
  EXPECT_EQ(y.dtype(), DType::BF16);
  backward(y, dy.to(DType::BF16));
  Tensor gx = grad(x), gw = grad(w), gb = grad(bias);
  EXPECT_EQ(gx.dtype(), DType::F32);
  EXPECT_EQ(gw.dtype(), DType::F32);
  EXPECT_EQ(gb.dtype(), DType::F32);
  const DType low = DType::BF16;
  Tensor dyl = dy.to(low).to(DType::F32);  // the gradient arrived in bf16: that rounding is given
  auto ref = ops::linear_backward(dyl, x, w, true, true, true);
  // Both round their output once (u|result|).
  auto bx = product_bound(dyl, w.transpose(0, 1).contiguous(), low, true);
  auto bw = product_bound(x.transpose(0, 1).contiguous(), dyl, low, true);
  expect_within("dx", gx, ref.dx, bx);
  expect_within("dw", gw, ref.dw, bw);
  // dbias: the f32 kernel's column sums of the same bf16 gradient: identical bits.
  EXPECT_EQ(gb.to_vector<float>(), ref.dbias.to_vector<float>());
}

// product_bound of each batch's a[i] @ b[i], in order.
std::vector<double> batched_product_bound(const Tensor& a, const Tensor& b, DType low) {
  std::vector<double> out;
  for (int64_t i = 0; i < a.size(0); ++i) {
    auto part = product_bound(a.narrow(0, i, 1).reshape({a.size(1), a.size(2)}),
                              b.narrow(0, i, 1).reshape({b.size(1), b.size(2)}), low, true);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

// The autocast matmul's backward (MatmulBackward on the bf16 copies, then CastBackward) against
// the f32 formulas da = dy @ b^T and db = a^T @ dy, with the product bound: each of da, db is a
// product of bf16 copies rounded once to bf16. Folded (b 2-D: one gemm) and batched (b 3-D).
TEST(Autocast, MatmulGradientsAreTheF32ProductsWithinTheBound) {
  const DType low = DType::BF16;
  for (bool batched : {false, true}) {
    SCOPED_TRACE(batched ? "batched" : "folded");
    Tensor a = randn({2, 3, 16}, 21), b = batched ? randn({2, 16, 12}, 22) : randn({16, 12}, 22);
    Tensor dyl = randn({2, 3, 12}, 23).to(low).to(DType::F32);  // the gradient arrives in bf16
    for (Tensor* t : {&a, &b}) set_requires_grad(*t);
    Tensor y;
    {
      AutocastGuard bf16(low);
      y = matmul(a, b);
    }
    EXPECT_EQ(y.dtype(), low);
    backward(y, dyl.to(low));
    EXPECT_EQ(grad(a).dtype(), DType::F32);
    EXPECT_EQ(grad(b).dtype(), DType::F32);
    Tensor bt = b.detach().transpose(-1, -2).contiguous(), at = a.detach().transpose(-1, -2);
    if (batched) {
      expect_within("da", grad(a), ops::matmul(dyl, bt), batched_product_bound(dyl, bt, low));
      expect_within("db", grad(b), ops::matmul(at, dyl),
                    batched_product_bound(at.contiguous(), dyl, low));
    } else {
      Tensor dy2 = dyl.reshape({6, 12}), a2t = a.detach().reshape({6, 16}).transpose(0, 1);
      expect_within("da", grad(a), ops::matmul(dy2, bt), product_bound(dy2, bt, low, true));
      expect_within("db", grad(b), ops::matmul(a2t, dy2),
                    product_bound(a2t.contiguous(), dy2, low, true));
    }
  }
}

// The autocast LM head's backward against the f32 formulas dx = dy @ table and dtable = dy^T @ x:
// products of bf16 copies rounded once to bf16 (the table's then widened to its f32 master).
TEST(Autocast, LmHeadGradientsAreTheF32ProductsWithinTheBound) {
  const DType low = DType::BF16;
  Tensor x = randn({2, 3, 16}, 31), table = randn({20, 16}, 32, 0.5);
  Tensor dyl = randn({6, 20}, 33).to(low).to(DType::F32);
  for (Tensor* t : {&x, &table}) set_requires_grad(*t);
  Tensor y;
  {
    AutocastGuard bf16(low);
    y = lm_head(x, table);
  }
  EXPECT_EQ(y.dtype(), low);
  backward(y, dyl.reshape({2, 3, 20}).to(low));
  EXPECT_EQ(grad(x).dtype(), DType::F32);
  EXPECT_EQ(grad(table).dtype(), DType::F32);
  Tensor t = table.detach(), dyt = dyl.transpose(0, 1).contiguous(),
         x2 = x.detach().reshape({6, 16});
  expect_within("dx", grad(x), ops::matmul(dyl, t), product_bound(dyl, t, low, true));
  expect_within("dtable", grad(table), ops::matmul(dyt, x2), product_bound(dyt, x2, low, true));
}

// Under bf16 autocast each subset of inputs requiring grad gets, bit for bit, the gradients it
// gets when all do (each gradient is its own product), and the other inputs none: a backward that
// only works when every input needs a gradient (a placeholder of the wrong shape) fails here.
void expect_every_mask_gives_the_same_gradients(
    const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Tensor>& inputs,
    const Tensor& dy) {
  const uint32_t n = static_cast<uint32_t>(inputs.size()), all = (1u << n) - 1;
  auto gradients = [&](uint32_t mask) {
    std::vector<Tensor> leaves;
    for (uint32_t k = 0; k < n; ++k) {
      leaves.push_back(inputs[k].detach());
      if ((mask >> k) & 1u) set_requires_grad(leaves.back());
    }
    Tensor y;
    {
      AutocastGuard bf16(DType::BF16);
      y = f(leaves);
    }
    backward(y, dy);
    std::vector<Tensor> g;
    for (const Tensor& leaf : leaves) g.push_back(grad(leaf));
    return g;
  };
  const std::vector<Tensor> want = gradients(all);
  for (uint32_t mask = 1; mask < all; ++mask) {
    const std::vector<Tensor> got = gradients(mask);
    for (uint32_t k = 0; k < n; ++k) {
      SCOPED_TRACE(::testing::Message() << "mask " << mask << " input " << k);
      if (!((mask >> k) & 1u)) {
        EXPECT_FALSE(got[k].defined());
      } else {
        ASSERT_TRUE(got[k].defined());
        EXPECT_EQ(got[k].to_vector<float>(), want[k].to_vector<float>());
      }
    }
  }
}

TEST(Autocast, EachSubsetOfInputsRequiringGradGetsTheSameGradients) {
  using Ts = std::vector<Tensor>;
  Tensor x = randn({2, 3, 16}, 41), dy = randn({2, 3, 12}, 42).to(DType::BF16);
  expect_every_mask_gives_the_same_gradients([](const Ts& t) { return linear(t[0], t[1], t[2]); },
                                             {x, randn({16, 12}, 43, 0.25), randn({12}, 44)}, dy);
  expect_every_mask_gives_the_same_gradients([](const Ts& t) { return matmul(t[0], t[1]); },
                                             {x, randn({16, 12}, 45)}, dy);
  expect_every_mask_gives_the_same_gradients([](const Ts& t) { return lm_head(t[0], t[1]); },
                                             {x, randn({12, 16}, 46)}, dy);
}

// add, sub, mul and div of a bf16 and an f32 tensor are f32 (Note [Autocast policy]); each input
// gets its gradient in its own dtype.
TEST(Autocast, BinaryOpsGiveEachInputAGradientInItsDtype) {
  for (int op = 0; op < 4; ++op) {
    SCOPED_TRACE(op);
    Tensor a = randn({3}, 51).to(DType::BF16), b = ops::affine_scalar(randn({3}, 52), 0.3, 2.0);
    for (Tensor* t : {&a, &b}) set_requires_grad(*t);
    Tensor y = op == 0 ? add(a, b) : op == 1 ? sub(a, b) : op == 2 ? mul(a, b) : div(a, b);
    EXPECT_EQ(y.dtype(), DType::F32);
    backward(sum(y));
    EXPECT_EQ(grad(a).dtype(), DType::BF16);
    EXPECT_EQ(grad(b).dtype(), DType::F32);
  }
}

// A tiny GPT-2 step in bf16 against fp32: the policy's dtypes, the saved activations' bytes, and a
// loss that agrees; checkpointing under autocast reproduces the plain autocast step bit for bit.
TEST(Autocast, Gpt2StepKeepsLowPrecisionActivationsAndCheckpointsExactly) {
  auto config = test::small_config(2);
  gpt2::GPT2 model(config, 5);
  Tensor ids = test::token_batch(config, 2, 16, Device::cpu());
  auto saved_bytes = [&](DType precision) {
    int64_t bytes = 0;
    nn::zero_grad(model);
    default_generator().manual_seed(11);
    SavedTensorHooksGuard count(
        [&](const Tensor& t) -> std::shared_ptr<void> {
          if (!(t.dim() == 2 && t.numel() >= 32 * 32 && requires_grad(t))) bytes += t.nbytes();
          return std::make_shared<Tensor>(t);
        },
        [](const std::shared_ptr<void>& p) { return *static_cast<Tensor*>(p.get()); });
    AutocastGuard guard(precision);
    Tensor logits = model(ids);
    EXPECT_EQ(logits.dtype(), precision);
    return bytes;
  };
  const int64_t fp32_bytes = saved_bytes(DType::F32), bf16_bytes = saved_bytes(DType::BF16);
  // Everything saved but the f32 residual stream (layernorm inputs), the layernorm statistics and
  // the loss's log-sum-exp is bf16: well under 3/4 of the f32 bytes.
  EXPECT_LT(bf16_bytes * 4, fp32_bytes * 3) << bf16_bytes << " vs " << fp32_bytes;

  auto in_bf16 = [](const std::function<void()>& fwd) {
    AutocastGuard guard(DType::BF16);
    fwd();
  };
  auto fp32 = test::run_step(model, ids);
  auto bf16 = test::run_step(model, ids, in_bf16);
  // The loss (~4.6 = log 97) is a mean of f32 log-sum-exps of bf16 logits; each logit is off by a
  // few bf16 roundings (u = 2^-8 relative) of values of size ~0.1-1: 1e-2 absolute is generous yet
  // ten times below the loss's change in one training step.
  EXPECT_NEAR(bf16.loss[0], fp32.loss[0], 1e-2);
  EXPECT_NE(bf16.loss[0], fp32.loss[0]) << "autocast changed nothing";
  for (size_t i = 0; i < fp32.grads.size(); ++i) {
    ASSERT_EQ(bf16.grads[i].size(), fp32.grads[i].size()) << fp32.names[i];
    double num = 0, den = 0;
    for (size_t j = 0; j < fp32.grads[i].size(); ++j) {
      num += std::pow(bf16.grads[i][j] - fp32.grads[i][j], 2);
      den += std::pow(fp32.grads[i][j], 2);
    }
    // Relative L2 error of each gradient: bf16 activations and weight copies (2^-8 per rounding,
    // a few dozen roundings deep) give about 1e-2; 5e-2 leaves room and still fails on a wrong
    // formula (which gives O(1)).
    EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 5e-2) << fp32.names[i];
  }
  // Checkpointing recomputes under the same autocast dtype (nn/checkpoint.cpp): bitwise equal.
  model.run_block = [](nn::Block& b, int64_t, const Tensor& x) {
    return nn::checkpoint([&b](const Tensor& in) { return b(in); }, x);
  };
  auto ckpt = test::run_step(model, ids, in_bf16);
  test::expect_same_step(bf16, ckpt, "bf16 with checkpointing");
}

// Activation offload on the simulated accelerator moves bf16 saved tensors like any others: the
// bf16 step's loss and gradients are bitwise those without offload.
TEST(Autocast, ActivationOffloadOfBf16TensorsIsBitwiseExact) {
  set_sim_capacity(5, 0);
  auto config = test::small_config(2);
  gpt2::GPT2 model(config, 3, DType::F32, Device::sim(5));
  Tensor ids = test::token_batch(config, 2, 16, Device::sim(5));
  auto in_bf16 = [](const std::function<void()>& fwd) {
    AutocastGuard guard(DType::BF16);
    fwd();
  };
  auto plain = test::run_step(model, ids, in_bf16);
  offload::ActivationOffloadOptions opts;
  opts.background = false;
  offload::ActivationOffloader off(opts);
  auto r = test::run_step(model, ids, [&](const std::function<void()>& fwd) {
    offload::OffloadScope scope(off);
    in_bf16(fwd);
  });
  test::expect_same_step(plain, r, "bf16 with activation offload");
  EXPECT_GT(off.stats().offloaded, 0);
}

}  // namespace
}  // namespace mw
