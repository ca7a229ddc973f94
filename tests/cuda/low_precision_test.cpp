// bf16 and f16 products on CUDA (Note [Products in bf16 and f16 on CUDA]): cuBLAS multiplies the
// 16-bit operands as they are, sums in f32 and rounds once to the result's dtype. Checked against
// the exact (f64) product of the same 16-bit values, with the error bound of an f32 sum, for every
// transpose, with and without accumulation into C, and through linear and linear_backward with an
// f32 bias (autocast's case). Then the attention on 16-bit qkv (Note [Low-precision attention on
// CUDA]) against the exact attention of the same values, forward and backward. Skipped without a
// visible GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "../precision/exact_attention.h"
#include "autograd/autocast.h"
#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "core/convert.h"
#include "core/ops.h"
#include "cuda_test_util.h"

namespace mw {
namespace {

using test::gpu;
using test::random_tensor;

// Unit roundoff of the result's dtype (half its ulp, relative).
double unit_roundoff(DType t) {
  return t == DType::BF16  ? std::ldexp(1.0, -8)
         : t == DType::F16 ? std::ldexp(1.0, -11)
                           : std::ldexp(1.0, -24);
}

// |actual - exact| <= u_out |exact| + K 2^-23 (sum |a_i b_i| + |c|) for every element: one rounding
// to the result's dtype, after an f32 sum of K exact products (each product of two 16-bit values is
// exact in f32; tensor cores may truncate their partial sums, hence 2^-23 rather than 2^-24 per
// addition). `abs_terms` holds sum |a_i b_i| + |c| per element.
// `rounded` names the dtype the result was rounded to when it was widened after (a gradient that
// reaches an f32 master).
void expect_within_sum_bound(const std::string& what, const Tensor& actual, const Tensor& exact,
                             const Tensor& abs_terms, int64_t K,
                             std::optional<DType> rounded = std::nullopt) {
  const auto a = actual.to(Device::cpu()).to_vector<double>();
  const auto e = exact.to_vector<double>(), s = abs_terms.to_vector<double>();
  ASSERT_EQ(a.size(), e.size()) << what;
  const double u = unit_roundoff(rounded.value_or(actual.dtype())),
               g = static_cast<double>(K) * std::ldexp(1.0, -23);
  int bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double bound = u * std::abs(e[i]) + g * s[i];
    if (!(std::abs(a[i] - e[i]) <= bound) && bad++ < 3)
      ADD_FAILURE() << what << "[" << i << "]: " << a[i] << ", exact " << e[i] << ", bound "
                    << bound;
  }
}

Tensor f64(const Tensor& t) { return t.to(Device::cpu()).to(DType::F64); }

Tensor abs64(const Tensor& t) {
  std::vector<double> v = f64(t).contiguous().to_vector<double>();
  for (double& x : v) x = std::abs(x);
  return Tensor::from_vector(v, t.shape());
}

TEST(CudaLowPrecision, ProductsAreExactProductsSummedInF32AndRoundedOnce) {
  MW_SKIP_WITHOUT_GPU();
  const int64_t M = 67, N = 129, K = 300;  // ragged: no dimension a multiple of 8
  for (DType low : {DType::BF16, DType::F16}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        SCOPED_TRACE(testing::Message()
                     << dtype_name(low) << " trans_a " << ta << " trans_b " << tb);
        Tensor a = ta ? random_tensor({K, M}, 41, low) : random_tensor({M, K}, 41, low);
        Tensor b = tb ? random_tensor({N, K}, 42, low) : random_tensor({K, N}, 42, low);
        Tensor c0 = random_tensor({M, N}, 43, low);
        Tensor exact = Tensor::empty({M, N}, DType::F64), terms = Tensor::empty({M, N}, DType::F64);
        ops::gemm(f64(a), ta, f64(b), tb, exact, false);
        ops::gemm(abs64(a), ta, abs64(b), tb, terms, false);
        for (DType result : {low, DType::F32}) {
          Tensor c = Tensor::empty({M, N}, result, gpu());
          ops::gemm(a.to(gpu()), ta, b.to(gpu()), tb, c, false);
          ASSERT_EQ(c.dtype(), result);
          expect_within_sum_bound(str("C = AB into ", dtype_name(result)), c, exact, terms, K);
          // Accumulating: C = AB + C0, the sum in f32 and one rounding.
          Tensor acc = c0.to(result).to(gpu());
          ops::gemm(a.to(gpu()), ta, b.to(gpu()), tb, acc, true);
          Tensor exact_acc = ops::binary(ops::BinaryOp::Add, exact, f64(c0));
          Tensor terms_acc = ops::binary(ops::BinaryOp::Add, terms, abs64(c0));
          expect_within_sum_bound(str("C += AB into ", dtype_name(result)), acc, exact_acc,
                                  terms_acc, K + 1);
        }
      }
    }
  }
}

TEST(CudaLowPrecision, LinearAndItsBackwardWithAnF32Bias) {
  MW_SKIP_WITHOUT_GPU();
  const int64_t R = 40, K = 96, N = 72;
  for (DType low : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(low));
    Tensor x = random_tensor({4, R / 4, K}, 51, low), w = random_tensor({K, N}, 52, low, 0.1);
    Tensor bias = random_tensor({N}, 53);  // autocast keeps the bias an f32 master
    Tensor y = ops::linear(x.to(gpu()), w.to(gpu()), bias.to(gpu()));
    ASSERT_EQ(y.dtype(), low);
    ASSERT_EQ(y.shape(), (Shape{4, R / 4, N}));
    // Exact x w + bias; the bias joins the f32 sum before the one rounding.
    Tensor x2 = f64(x).reshape({R, K});
    Tensor exact = Tensor::empty({R, N}, DType::F64), terms = Tensor::empty({R, N}, DType::F64);
    ops::gemm(x2, false, f64(w), false, exact, false);
    ops::gemm(abs64(x2), false, abs64(w), false, terms, false);
    exact = ops::binary(ops::BinaryOp::Add, exact, f64(bias));
    terms = ops::binary(ops::BinaryOp::Add, terms, abs64(bias));
    expect_within_sum_bound("linear", y.reshape({R, N}), exact, terms, K + 1);

    Tensor dy = random_tensor({4, R / 4, N}, 54, low);
    auto g = ops::linear_backward(dy.to(gpu()), x.to(gpu()), w.to(gpu()), true, true, true);
    ASSERT_EQ(g.dx.dtype(), low);
    ASSERT_EQ(g.dw.dtype(), low);
    ASSERT_EQ(g.dbias.dtype(), DType::F32);  // as mixed::linear_backward's on the CPU
    Tensor dy2 = f64(dy).reshape({R, N});
    Tensor dx = Tensor::empty({R, K}, DType::F64), dx_terms = Tensor::empty({R, K}, DType::F64);
    ops::gemm(dy2, false, f64(w), true, dx, false);
    ops::gemm(abs64(dy2), false, abs64(w), true, dx_terms, false);
    expect_within_sum_bound("dx", g.dx.reshape({R, K}), dx, dx_terms, N);
    Tensor dw = Tensor::empty({K, N}, DType::F64), dw_terms = Tensor::empty({K, N}, DType::F64);
    ops::gemm(x2, true, dy2, false, dw, false);
    ops::gemm(abs64(x2), true, abs64(dy2), false, dw_terms, false);
    expect_within_sum_bound("dw", g.dw, dw, dw_terms, R);
    // dbias: column sums of R exact values in f32.
    expect_within_sum_bound("dbias", g.dbias, ops::sum_dim(dy2, 0, false),
                            ops::sum_dim(abs64(dy2), 0, false), R);
  }
}

// The LM head under autocast on an odd vocabulary (97: the padded path of Note [Padded vocabulary
// on CUDA]): logits [.., V] and both gradients within the product bound of the exact values.
TEST(CudaLowPrecision, LmHeadOnAnOddVocabularyUnderAutocast) {
  MW_SKIP_WITHOUT_GPU();
  const int64_t R = 10, C = 32, V = 97;
  Tensor x = random_tensor({2, R / 2, C}, 71).to(gpu()),
         table = random_tensor({V, C}, 72, DType::F32, 0.1).to(gpu());
  set_requires_grad(x);
  set_requires_grad(table);
  Tensor y;
  {
    AutocastGuard bf16(DType::BF16);
    y = lm_head(x, table);
  }
  ASSERT_EQ(y.dtype(), DType::BF16);
  ASSERT_EQ(y.shape(), (Shape{2, R / 2, V}));
  Tensor dy = random_tensor({2, R / 2, V}, 73, DType::BF16);
  backward(y, dy.to(gpu()));
  // The exact products of the bf16 values the products saw.
  Tensor xl = f64(x.to(DType::BF16)).reshape({R, C}), tl = f64(table.to(DType::BF16));
  Tensor dyl = f64(dy).reshape({R, V});
  Tensor logits = Tensor::empty({R, V}, DType::F64), terms = Tensor::empty({R, V}, DType::F64);
  ops::gemm(xl, false, tl, true, logits, false);
  ops::gemm(abs64(xl), false, abs64(tl), true, terms, false);
  expect_within_sum_bound("logits", y.reshape({R, V}), logits, terms, C);
  Tensor dx = Tensor::empty({R, C}, DType::F64), dx_terms = Tensor::empty({R, C}, DType::F64);
  ops::gemm(dyl, false, tl, false, dx, false);
  ops::gemm(abs64(dyl), false, abs64(tl), false, dx_terms, false);
  ASSERT_EQ(grad(x).dtype(), DType::F32);
  expect_within_sum_bound("dx", grad(x).reshape({R, C}), dx, dx_terms, V, DType::BF16);
  Tensor dt = Tensor::empty({V, C}, DType::F64), dt_terms = Tensor::empty({V, C}, DType::F64);
  ops::gemm(dyl, true, xl, false, dt, false);
  ops::gemm(abs64(dyl), true, abs64(xl), false, dt_terms, false);
  ASSERT_EQ(grad(table).dtype(), DType::F32);
  expect_within_sum_bound("dtable", grad(table), dt, dt_terms, R, DType::BF16);
}

TEST(CudaLowPrecision, AttentionOn16BitHeadsIsTheExactAttentionToTheirRoundings) {
  MW_SKIP_WITHOUT_GPU();
  const int64_t B = 2, T = 130, NH = 2, C = 32;  // two query blocks, the second of 2 rows
  for (DType low : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(low));
    Tensor qkv = random_tensor({B, T, 3 * C}, 61, low), dout = random_tensor({B, T, C}, 62, low);
    const test::ExactAttention e = test::exact_attention(qkv, dout, NH);
    auto r = ops::attention(qkv.to(gpu()), NH, 0.0, RngState{});
    ASSERT_EQ(r.out.dtype(), low);
    ASSERT_EQ(r.att.dtype(), DType::F32);  // the log-sum-exp stays f32
    test::expect_attention_bound("out", r.out, e.out, e.out_terms);
    Tensor dqkv =
        ops::attention_backward(dout.to(gpu()), qkv.to(gpu()), r.att, NH, 0.0, RngState{});
    ASSERT_EQ(dqkv.dtype(), low);
    test::expect_attention_bound("dqkv", dqkv, e.dqkv, e.dqkv_terms);
  }
}

}  // namespace
}  // namespace mw
