// Products of bf16 matrices on CPUs with AVX512-BF16 (Note [bf16 products on AVX512-BF16]).
//
// Note [bf16 products on AVX512-BF16]: under --precision bf16 the products' operands are bf16, and
// Note [Low-precision storage] widened them to f32 for the one sgemm: the step then ran at sgemm's
// rate plus the widening, slower than fp32 (GPT-2 small B4 T128 on a 2-core Zen 4: 1840 against
// 1749 ms), where PyTorch's oneDNN multiplies bf16 directly (its bf16 GEMMs measured 970 GFLOP/s
// against sgemm's 256 on the same cores; its bf16 step 891 ms). VDPBF16PS multiplies pairs of bf16
// and adds both products to an f32 lane: acc += a[2i] b[2i], then acc += a[2i+1] b[2i+1] (each
// product of two bf16 is exact in f32, each addition rounded once, as an FMA). So the kernel here
// accumulates each output in f32 over k in order, in pairs, like the widened product but in its
// own order; the results differ from it by f32 rounding only (tests/precision/gemm_bf16_test.cpp
// bounds both against a double product). The instruction treats bf16 subnormal inputs as zero and
// flushes subnormal results (Intel SDM), i.e. magnitudes under 2^-126 count as 0, far below any
// product of GPT-2's weights and activations that matters.
//
// Layout (BLIS's): B is packed in panels of 32 columns, each k-pair of a panel one 64-byte line
// (column j's two bf16 side by side); A in panels of kRows rows, each k-pair of a row one 32-bit
// word broadcast to every lane. A kRows x 32 block of C lives in 2 kRows zmm accumulators across
// kPairs k-pairs of a cache block. Odd K, and edges of M and N, are padded with zeros in the
// packed panels and stored under masks. Threads split the columns (or, for a tall C, the rows),
// and every output element sees the same k order whatever the split: bitwise the same for any
// thread count.
#include "core/cpu/gemm_bf16.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/parallel.h"

namespace mw::ops {

namespace {

constexpr int64_t kRows = 8;     // rows of a C block: 16 accumulators
constexpr int64_t kCols = 32;    // columns of a C block and of a packed B panel
constexpr int64_t kPairs = 256;  // k-pairs per cache block (512 k: a B panel is 32 KiB)
constexpr int64_t kPanels = 8;   // B panels per column block (256 columns: 256 KiB packed)

#define MW_TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

inline uint16_t at(const uint16_t* X, int64_t ld, bool trans, int64_t r, int64_t c) {
  return trans ? X[c * ld + r] : X[r * ld + c];
}

// Two rows' 32 bf16 interleaved: r0[0], r1[0], r0[1], r1[1], ... (one packed line of B).
MW_TARGET_BF16 void interleave_rows(const uint16_t* r0, const uint16_t* r1, uint16_t* dst) {
  alignas(64) static const uint16_t kLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                               37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                               11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i lo = _mm512_load_si512(kLo);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  const __m512i a = _mm512_loadu_si512(r0), b = _mm512_loadu_si512(r1);
  _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(a, lo, b));
  _mm512_storeu_si512(dst + 32, _mm512_permutex2var_epi16(a, hi, b));
}

// op(B)[2 (p0 + p) + e][n0 + j] for p < pairs, j < 32, e < 2, zeros past K and N.
void pack_b(const uint16_t* B, int64_t ldb, bool tb, int64_t K, int64_t N, int64_t p0,
            int64_t pairs, int64_t n0, uint16_t* dst) {
  if (n0 + kCols <= N && 2 * (p0 + pairs) <= K) {  // a whole panel: rows or words as they are
    if (tb) {  // column n of op(B) is row n of B: each k-pair one 32-bit word of it
      for (int64_t j = 0; j < kCols; ++j) {
        const uint16_t* row = B + (n0 + j) * ldb + 2 * p0;
        for (int64_t p = 0; p < pairs; ++p) std::memcpy(dst + (p * kCols + j) * 2, row + 2 * p, 4);
      }
    } else {
      for (int64_t p = 0; p < pairs; ++p) {
        const uint16_t* r0 = B + 2 * (p0 + p) * ldb + n0;
        interleave_rows(r0, r0 + ldb, dst + p * kCols * 2);
      }
    }
    return;
  }
  for (int64_t p = 0; p < pairs; ++p)
    for (int64_t j = 0; j < kCols; ++j)
      for (int64_t e = 0; e < 2; ++e) {
        const int64_t k = 2 * (p0 + p) + e, n = n0 + j;
        dst[(p * kCols + j) * 2 + e] = k < K && n < N ? at(B, ldb, tb, k, n) : uint16_t{0};
      }
}

// op(A)[m0 + i][2 (p0 + p) + e] as half e of word p * kRows + i (e = 0 the low half, which
// VDPBF16PS pairs with a B panel's even k), zeros past K and M.
void pack_a(const uint16_t* A, int64_t lda, bool ta, int64_t M, int64_t K, int64_t m0, int64_t p0,
            int64_t pairs, uint32_t* dst) {
  if (m0 + kRows <= M && 2 * (p0 + pairs) <= K) {  // a whole panel
    for (int64_t i = 0; i < kRows && !ta; ++i) {   // row m's k-pairs: consecutive words
      const uint16_t* row = A + (m0 + i) * lda + 2 * p0;
      for (int64_t p = 0; p < pairs; ++p) std::memcpy(dst + p * kRows + i, row + 2 * p, 4);
    }
    for (int64_t p = 0; p < pairs && ta; ++p) {  // op(A)'s k is A's row
      const uint16_t* r0 = A + 2 * (p0 + p) * lda + m0;
      for (int64_t i = 0; i < kRows; ++i)
        dst[p * kRows + i] = static_cast<uint32_t>(r0[i]) | static_cast<uint32_t>(r0[lda + i])
                                                                << 16;
    }
    return;
  }
  for (int64_t p = 0; p < pairs; ++p)
    for (int64_t i = 0; i < kRows; ++i) {
      uint32_t word = 0;
      for (int64_t e = 0; e < 2; ++e) {
        const int64_t m = m0 + i, k = 2 * (p0 + p) + e;
        if (m < M && k < K) word |= static_cast<uint32_t>(at(A, lda, ta, m, k)) << (16 * e);
      }
      dst[p * kRows + i] = word;
    }
}

// A k-pair of one row of A in every lane. Clang 16 crashes (SIGSEGV at -O2) folding the broadcast
// into VDPBF16PS's memory operand; an empty asm keeps it in a register there.
MW_TARGET_BF16 inline __m512bh broadcast(int32_t pair) {
  __m512i v = _mm512_set1_epi32(pair);
#if defined(__clang__)
  asm("" : "+v"(v));
#endif
  return reinterpret_cast<__m512bh>(v);
}

// C[rows, cols] (+)= the packed A panel times the packed B panel over `pairs` k-pairs.
MW_TARGET_BF16 void block(const uint32_t* a, const uint16_t* b, int64_t pairs, float* C,
                          int64_t ldc, int64_t rows, int64_t cols, bool load_c) {
  __m512 acc[kRows][2];
  const __mmask16 m0 = cols >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << cols) - 1u);
  const __mmask16 m1 = cols >= 32   ? 0xFFFF
                       : cols <= 16 ? 0
                                    : static_cast<__mmask16>((1u << (cols - 16)) - 1u);
#pragma GCC unroll 8
  for (int64_t i = 0; i < kRows; ++i) {
    const bool live = load_c && i < rows;
    acc[i][0] = live ? _mm512_maskz_loadu_ps(m0, C + i * ldc) : _mm512_setzero_ps();
    acc[i][1] = live ? _mm512_maskz_loadu_ps(m1, C + i * ldc + 16) : _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + p * 2 * kCols));
    const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + p * 2 * kCols + 32));
#pragma GCC unroll 8
    for (int64_t i = 0; i < kRows; ++i) {
      const __m512bh ai = broadcast(static_cast<int32_t>(a[p * kRows + i]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
    }
  }
#pragma GCC unroll 8
  for (int64_t i = 0; i < kRows; ++i) {
    if (i >= rows) break;
    _mm512_mask_storeu_ps(C + i * ldc, m0, acc[i][0]);
    _mm512_mask_storeu_ps(C + i * ldc + 16, m1, acc[i][1]);
  }
}

struct Problem {
  bool ta, tb;
  int64_t M, N, K;
  const uint16_t* A;
  int64_t lda;
  const uint16_t* B;
  int64_t ldb;
  float* C;
  int64_t ldc;
  bool accumulate;
};

// Rows [r0, r1) by columns [c0, c1) of C, on one thread.
void tile(const Problem& q, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const int64_t pairs_total = (q.K + 1) / 2;
  const int64_t row_panels = (r1 - r0 + kRows - 1) / kRows;
  std::vector<uint32_t> ap(static_cast<size_t>(row_panels * kPairs * kRows));
  std::vector<uint16_t> bp(static_cast<size_t>(kPanels * kPairs * kCols * 2));
  for (int64_t p0 = 0; p0 < pairs_total; p0 += kPairs) {
    const int64_t pairs = std::min(kPairs, pairs_total - p0);
    const bool load_c = q.accumulate || p0 > 0;
    for (int64_t r = 0; r < row_panels; ++r)
      pack_a(q.A, q.lda, q.ta, std::min(q.M, r1), q.K, r0 + r * kRows, p0, pairs,
             ap.data() + r * kPairs * kRows);
    for (int64_t nb = c0; nb < c1; nb += kPanels * kCols) {
      const int64_t panels = std::min(kPanels, (c1 - nb + kCols - 1) / kCols);
      for (int64_t j = 0; j < panels; ++j)
        pack_b(q.B, q.ldb, q.tb, q.K, std::min(q.N, c1), p0, pairs, nb + j * kCols,
               bp.data() + j * kPairs * kCols * 2);
      for (int64_t r = 0; r < row_panels; ++r) {
        const int64_t m = r0 + r * kRows;
        for (int64_t j = 0; j < panels; ++j) {
          const int64_t n = nb + j * kCols;
          block(ap.data() + r * kPairs * kRows, bp.data() + j * kPairs * kCols * 2, pairs,
                q.C + m * q.ldc + n, q.ldc, std::min(kRows, r1 - m), std::min(kCols, c1 - n),
                load_c);
        }
      }
    }
  }
}

Bf16GemmKernel chosen_by_environment() {
  const char* env = std::getenv("MW_BF16_GEMM");
  const std::string want = env ? env : "";
  MW_CHECK_T(InvalidArgument, want.empty() || want == "widen" || want == "avx512bf16",
             "MW_BF16_GEMM='", want,
             "': expected widen (bf16 products through f32 sgemm) or avx512bf16");
  MW_CHECK_T(InvalidArgument, want != "avx512bf16" || cpu_has_avx512_bf16(),
             "MW_BF16_GEMM=avx512bf16: this CPU has no AVX512-BF16 (CPUID 7.1 EAX bit 5); "
             "unset it to widen to f32");
  if (want == "widen") return Bf16GemmKernel::kWiden;
  return cpu_has_avx512_bf16() ? Bf16GemmKernel::kAvx512Bf16 : Bf16GemmKernel::kWiden;
}

std::atomic<int> g_kernel{-1};  // -1: not chosen yet

}  // namespace

Bf16GemmKernel bf16_gemm_kernel() {
  int kernel = g_kernel.load(std::memory_order_relaxed);
  if (kernel < 0) {
    kernel = static_cast<int>(chosen_by_environment());
    g_kernel.store(kernel, std::memory_order_relaxed);
  }
  return static_cast<Bf16GemmKernel>(kernel);
}

void set_bf16_gemm_kernel(Bf16GemmKernel kernel) {
  MW_CHECK_T(InvalidArgument, kernel != Bf16GemmKernel::kAvx512Bf16 || cpu_has_avx512_bf16(),
             "set_bf16_gemm_kernel(avx512bf16): this CPU has no AVX512-BF16");
  g_kernel.store(static_cast<int>(kernel), std::memory_order_relaxed);
}

void gemm_bf16_avx512(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* A,
                      int64_t lda, const uint16_t* B, int64_t ldb, float* C, int64_t ldc,
                      bool accumulate) {
  MW_CHECK_T(InvalidArgument, cpu_has_avx512_bf16(),
             "gemm_bf16_avx512 needs AVX512-BF16; this CPU has none");
  if (M <= 0 || N <= 0) return;
  const Problem q{ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate};
  if (K <= 0) {
    for (int64_t i = 0; i < M && !accumulate; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.f);
    return;
  }
  // One tile per thread along the longer side, in whole blocks; small products on one thread.
  const int64_t threads = num_threads();
  const bool split_cols = N >= M;
  const int64_t extent = split_cols ? N : M, unit = split_cols ? kCols : kRows;
  int64_t step = (extent + threads - 1) / threads;
  step = (step + unit - 1) / unit * unit;
  if (M * N * K < (int64_t{1} << 18)) step = extent;
  const int64_t tiles = (extent + step - 1) / step;
  parallel_for(tiles, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t lo = t * step, hi = std::min(extent, lo + step);
      if (split_cols)
        tile(q, 0, M, lo, hi);
      else
        tile(q, lo, hi, 0, N);
    }
  });
}

}  // namespace mw::ops
