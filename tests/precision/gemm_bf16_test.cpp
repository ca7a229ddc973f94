// The AVX512-BF16 product kernel (Note [bf16 products on AVX512-BF16], core/cpu/gemm_bf16.cpp)
// against a double product of the same bf16 values: every shape edge (M and N past a block, odd
// K, K past a cache block), whole panels (the packing's fast paths), every transpose, accumulation
// into C, and any thread count giving the same bits. Skipped on CPUs without AVX512-BF16 (the
// widened path, MixedOps.*, runs there).
#include "core/cpu/gemm_bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/parallel.h"

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
    if (c.K > 100) EXPECT_GT(worst, 0) << "f32 accumulation rounds somewhere";
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

}  // namespace
}  // namespace mw
