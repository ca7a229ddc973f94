// One typed entry to BLAS gemm (row-major), for the kernels that call it directly.
#pragma once

#include <cblas.h>

#include <cstdint>
#include <type_traits>

namespace mw::ops {

// C[M,N] = alpha * op(A) @ op(B) + beta * C, single-threaded (Note [Threads]).
template <typename T>
void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
               const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  auto opa = ta ? CblasTrans : CblasNoTrans;
  auto opb = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, opa, opb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    cblas_dgemm(CblasRowMajor, opa, opb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace mw::ops
