// The AVX512-BF16 product kernel (Note [bf16 products on AVX512-BF16], core/cpu/gemm_bf16.cpp)
// against a double product of the same bf16 values: every shape edge (M and N past a block, odd
// K, K past a cache block), whole panels (the packing's fast paths), every transpose, accumulation
// into C, and any thread count giving the same bits. Skipped on CPUs without AVX512-BF16. Then
// ops::gemm, linear and linear_backward on bf16 operands with each kernel the CPU has
// (set_bf16_gemm_kernel): the widened path is tested on AVX512-BF16 CPUs too.
#include "core/cpu/gemm_bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "core/tensor.h"

namespace mw {
namespace {

std::vector<uint16_t> random_bf16(int64_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = float_to_bf16(dist(gen));
  return v;
}

struct Case {
  int64_t M, N, K;
  bool ta, tb, accumulate;
};

// C = (accumulate ? C0 : 0) + op(A) op(B) by the kernel, with the stored layouts of op(A) [M, K]
// (A^T stored [K, M] when ta) and op(B) [K, N].
std::vector<float> run(const Case& c, const std::vector<uint16_t>& A,
                       const std::vector<uint16_t>& B, const std::vector<float>& C0) {
  std::vector<float> C = C0;
  ops::gemm_bf16_avx512(c.ta, c.tb, c.M, c.N, c.K, A.data(), c.ta ? c.M : c.K, B.data(),
                        c.tb ? c.K : c.N, C.data(), c.N, c.accumulate);
  return C;
}

TEST(Bf16Gemm, ProductsAreTheDoubleProductWithinF32Accumulation) {
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  set_num_threads(2);
  for (const Case c :
       {Case{1, 1, 1, false, false, false}, Case{7, 33, 5, false, true, false},
        Case{8, 32, 2, true, false, true}, Case{13, 70, 513, true, true, false},
        Case{64, 300, 129, false, false, true}, Case{300, 17, 1030, true, false, false},
        Case{9, 2100, 64, false, true, true},
        // even K and whole 8 x 32 panels: the packing's fast paths, in both layouts
        Case{40, 96, 256, true, false, false}, Case{16, 64, 1024, false, false, true},
        Case{24, 128, 600, true, true, true}}) {
    SCOPED_TRACE(testing::Message() << c.M << "x" << c.N << "x" << c.K << " ta " << c.ta << " tb "
                                    << c.tb << " accumulate " << c.accumulate);
    const std::vector<uint16_t> A = random_bf16(c.M * c.K, 1), B = random_bf16(c.K * c.N, 2);
    std::vector<float> C0(static_cast<size_t>(c.M * c.N));
    std::mt19937 gen(3);
    for (float& x : C0) x = std::uniform_real_distribution<float>(-4.f, 4.f)(gen);
    const std::vector<float> got = run(c, A, B, C0);
    auto a = [&](int64_t m, int64_t k) {
      return bf16_to_float(A[c.ta ? k * c.M + m : m * c.K + k]);
    };
    auto b = [&](int64_t k, int64_t n) {
      return bf16_to_float(B[c.tb ? n * c.K + k : k * c.N + n]);
    };
    double worst = 0;
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t n = 0; n < c.N; ++n) {
        const double c0 = c.accumulate ? C0[m * c.N + n] : 0.0;
        double sum = c0, abs_sum = std::fabs(c0);
        for (int64_t k = 0; k < c.K; ++k) {
          const double p = static_cast<double>(a(m, k)) * b(k, n);  // exact
          sum += p, abs_sum += std::fabs(p);
        }
        // Each product of two bf16 is exact in f32; each of the K additions rounds once by at most
        // 2^-24 of a partial sum, itself at most abs_sum: K 2^-24 abs_sum (one term: exact).
        const double bound =
            static_cast<double>(c.K - (c.accumulate ? 0 : 1)) * std::ldexp(1.0, -24) * abs_sum;
        const double err = std::fabs(got[m * c.N + n] - sum);
        ASSERT_LE(err, bound) << "C[" << m << "][" << n << "] = " << got[m * c.N + n] << ", want "
                              << sum;
        worst = std::max(worst, err);
      }
    if (c.K > 100) {
      EXPECT_GT(worst, 0) << "f32 accumulation rounds somewhere";
    }
  }
}

TEST(Bf16Gemm, AnyThreadCountGivesTheSameBits) {
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const Case c{70, 650, 777, false, true, false};
  const std::vector<uint16_t> A = random_bf16(c.M * c.K, 4), B = random_bf16(c.K * c.N, 5);
  const std::vector<float> C0(static_cast<size_t>(c.M * c.N));
  set_num_threads(1);
  const std::vector<float> one = run(c, A, B, C0);
  set_num_threads(2);
  EXPECT_EQ(run(c, A, B, C0), one);
  const Case tall{650, 70, 777, true, false, false};  // split by rows
  const std::vector<uint16_t> TA = random_bf16(tall.M * tall.K, 6),
                              TB = random_bf16(tall.K * tall.N, 7);
  const std::vector<float> T0(static_cast<size_t>(tall.M * tall.N));
  set_num_threads(1);
  const std::vector<float> t1 = run(tall, TA, TB, T0);
  set_num_threads(2);
  EXPECT_EQ(run(tall, TA, TB, T0), t1);
}

// Sets the bf16 product kernel for one scope.
class KernelGuard {
 public:
  explicit KernelGuard(ops::Bf16GemmKernel kernel) { ops::set_bf16_gemm_kernel(kernel); }
  ~KernelGuard() { ops::set_bf16_gemm_kernel(saved_); }

 private:
  ops::Bf16GemmKernel saved_ = ops::bf16_gemm_kernel();
};

std::vector<ops::Bf16GemmKernel> kernels_of_this_cpu() {
  if (!cpu_has_avx512_bf16()) return {ops::Bf16GemmKernel::kWiden};
  return {ops::Bf16GemmKernel::kWiden, ops::Bf16GemmKernel::kAvx512Bf16};
}

const char* kernel_name(ops::Bf16GemmKernel kernel) {
  return kernel == ops::Bf16GemmKernel::kWiden ? "widen" : "avx512bf16";
}

Tensor bf16_tensor(const Shape& shape, uint64_t seed) {
  std::vector<float> v;
  for (uint16_t h : random_bf16(shape_numel(shape), seed)) v.push_back(bf16_to_float(h));
  return Tensor::from_vector(v, shape).to(DType::BF16);
}

// The two kernels are two paths: VDPBF16PS treats bf16 subnormal inputs as zero (Intel SDM), the
// widened sgemm multiplies them exactly. 2^-130 is a bf16 (and f32) subnormal; 2^-130 * 2^100 =
// 2^-30.
TEST(Bf16Gemm, TheKernelSetterSwitchesThePath) {
  Tensor a = Tensor::from_vector<float>({std::ldexp(1.f, -130)}, {1, 1}).to(DType::BF16);
  Tensor b = Tensor::from_vector<float>({std::ldexp(1.f, 100)}, {1, 1}).to(DType::BF16);
  auto product = [&](ops::Bf16GemmKernel kernel) {
    KernelGuard guard(kernel);
    Tensor out = Tensor::empty({1, 1});
    ops::gemm(a, false, b, false, out, false);
    return out.item();
  };
  EXPECT_EQ(product(ops::Bf16GemmKernel::kWiden), std::ldexp(1.0, -30));
  if (!cpu_has_avx512_bf16()) {
    EXPECT_THROW(ops::set_bf16_gemm_kernel(ops::Bf16GemmKernel::kAvx512Bf16), InvalidArgument);
    GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  }
  EXPECT_EQ(product(ops::Bf16GemmKernel::kAvx512Bf16), 0.0);
}

// ops::gemm on bf16 operands into an f32 or a bf16 C, with each kernel, against the double
// product: the f32 accumulation's bound above, plus for a bf16 C its one rounding, at most 2^-8
// of the result (8 significant bits).
TEST(Bf16Gemm, OpsGemmWithEachKernelIsTheDoubleProductWithinTheBound) {
  for (ops::Bf16GemmKernel kernel : kernels_of_this_cpu()) {
    KernelGuard guard(kernel);
    for (const Case c : {Case{7, 33, 5, false, true, false}, Case{13, 70, 513, true, true, true},
                         Case{9, 2100, 64, false, false, true}}) {
      for (DType out_dtype : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(testing::Message()
                     << kernel_name(kernel) << " " << c.M << "x" << c.N << "x" << c.K << " ta "
                     << c.ta << " tb " << c.tb << " into " << dtype_name(out_dtype));
        Tensor a = bf16_tensor(c.ta ? Shape{c.K, c.M} : Shape{c.M, c.K}, 1);
        Tensor b = bf16_tensor(c.tb ? Shape{c.N, c.K} : Shape{c.K, c.N}, 2);
        Tensor out = bf16_tensor({c.M, c.N}, 3).to(out_dtype);
        const std::vector<double> c0 = out.to(DType::F64).to_vector<double>();
        ops::gemm(a, c.ta, b, c.tb, out, c.accumulate);
        const std::vector<double> got = out.to(DType::F64).to_vector<double>();
        Tensor a2 = (c.ta ? a.transpose(0, 1) : a).to(DType::F64).contiguous();
        Tensor b2 = (c.tb ? b.transpose(0, 1) : b).to(DType::F64).contiguous();
        const std::vector<double> va = a2.to_vector<double>(), vb = b2.to_vector<double>();
        const double u_out = out_dtype == DType::BF16 ? std::ldexp(1.0, -8) : 0.0;
        double worst_ratio = 0;
        for (int64_t m = 0; m < c.M; ++m)
          for (int64_t n = 0; n < c.N; ++n) {
            const double init = c.accumulate ? c0[m * c.N + n] : 0.0;
            double sum = init, abs_sum = std::fabs(init);
            for (int64_t k = 0; k < c.K; ++k) {
              sum += va[m * c.K + k] * vb[k * c.N + n];
              abs_sum += std::fabs(va[m * c.K + k] * vb[k * c.N + n]);
            }
            const double acc = static_cast<double>(c.K) * std::ldexp(1.0, -24) * abs_sum;
            const double bound = acc + u_out * (std::fabs(sum) + acc);
            const double err = std::fabs(got[m * c.N + n] - sum);
            ASSERT_LE(err, bound) << "C[" << m << "][" << n << "] = " << got[m * c.N + n];
            worst_ratio = std::max(worst_ratio, err / bound);
          }
        // A bf16 C's rounding dominates its bound, and the worst element must use a visible part
        // of it (a bound that loose would miss a wrong rounding). An f32 C's bound is the
        // worst case of K roundings, typically sqrt(K) times the error; a rounding to bf16 instead
        // (2^-9 of the result) would still be 2^15 / K times over it.
        if (out_dtype == DType::BF16) {
          EXPECT_GT(worst_ratio, 0.01) << "the bound is loose";
        }
      }
    }
  }
}

Tensor abs_f64(const Tensor& t) {
  std::vector<double> v = t.to(DType::F64).to_vector<double>();
  for (double& x : v) x = std::fabs(x);
  return Tensor::from_vector(v, t.shape());
}

// [linear, dx, dw, dbias] of the inputs, as doubles.
std::vector<std::vector<double>> linear_results(const Tensor& x, const Tensor& w, const Tensor& b,
                                                const Tensor& dy) {
  auto g = ops::linear_backward(dy, x, w, true, true, true);
  std::vector<std::vector<double>> r;
  for (const Tensor& t : {ops::linear(x, w, b), g.dx, g.dw, g.dbias})
    r.push_back(t.to(DType::F64).to_vector<double>());
  return r;
}

// linear and linear_backward on bf16 operands take the kernel's path too (native_low, cpu/
// gemm.cpp), with each kernel against the same ops in double on the same values: each result
// within its f32 accumulation's bound (terms 2^-24 of the absolute sum) plus its one rounding to
// its dtype (bf16: 2^-8 of the result; dbias is f32: 2^-24).
TEST(Bf16Gemm, LinearAndItsBackwardWithEachKernelAreTheDoubleOpsWithinTheBound) {
  Tensor x = bf16_tensor({6, 40}, 4), w = bf16_tensor({40, 24}, 5), dy = bf16_tensor({6, 24}, 6);
  Tensor bias = bf16_tensor({24}, 7).to(DType::F32);
  auto f64 = [](const Tensor& t) { return t.to(DType::F64); };
  const auto want = linear_results(f64(x), f64(w), f64(bias), f64(dy));
  const auto abs_sum = linear_results(abs_f64(x), abs_f64(w), abs_f64(bias), abs_f64(dy));
  const char* names[] = {"linear", "dx", "dw", "dbias"};
  const double terms[] = {41, 24, 6, 6};  // K products (+ the bias), N, rows, rows
  const double u_out[] = {std::ldexp(1.0, -8), std::ldexp(1.0, -8), std::ldexp(1.0, -8),
                          std::ldexp(1.0, -24)};
  for (ops::Bf16GemmKernel kernel : kernels_of_this_cpu()) {
    KernelGuard guard(kernel);
    const auto got = linear_results(x, w, bias, dy);
    for (size_t r = 0; r < got.size(); ++r) {
      SCOPED_TRACE(testing::Message() << kernel_name(kernel) << " " << names[r]);
      double worst_ratio = 0;
      for (size_t i = 0; i < got[r].size(); ++i) {
        const double acc = terms[r] * std::ldexp(1.0, -24) * abs_sum[r][i];
        const double bound = acc + u_out[r] * (std::fabs(want[r][i]) + acc);
        const double err = std::fabs(got[r][i] - want[r][i]);
        ASSERT_LE(err, bound) << "element " << i << ": " << got[r][i] << ", want " << want[r][i];
        worst_ratio = std::max(worst_ratio, err / bound);
      }
      if (r < 3) {  // the bf16 results: as in OpsGemmWithEachKernel... above
        EXPECT_GT(worst_ratio, 0.01) << "the bound is loose";
      }
    }
  }
}

}  // namespace
}  // namespace mw
