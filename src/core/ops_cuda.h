// The CUDA implementations behind ops.h: same names and contracts as the ops.h functions, called by
// them when the inputs live on a CUDA device (the dispatch is the first line of each op in
// core/cpu/*.cpp). Built from core/cuda/ops_cuda.cpp and the kernels in core/cuda/*.cu when CUDA is
// on; core/nocuda/ops_cuda_stub.cpp otherwise, where each throws DeviceError naming the op (it is
// unreachable in practice: without CUDA no tensor can live on a CUDA device).
//
// Differences from the CPU ops, each by design (docs/cuda.md):
//   - attention's AttentionOut::att is the per-row log-sum-exp [B, NH, T], not the probabilities
//     (Note [Attention on CUDA by query blocks]); attention_backward takes that lse.
//   - every reduction is deterministic, but sums may be combined in another order than on the CPU,
//     and nvcc contracts a*b+c into FMAs, so float results agree to rounding, not bitwise. Dropout
//     masks and the embedding backward's summation order are bitwise equal to the CPU's.
#pragma once

#include "core/ops.h"

namespace mw::ops::cuda {

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
Tensor affine_scalar(const Tensor& a, double alpha, double beta);
Tensor sum_to_shape(const Tensor& grad, const Shape& shape);
void axpy_(Tensor& y, const Tensor& x, double alpha);
void scale_(Tensor& x, double alpha);
Tensor sum_all(const Tensor& x);
Tensor sum_dim(const Tensor& x, int64_t dim, bool keepdim);
Tensor expand_dim(const Tensor& g, const Shape& shape, int64_t dim, bool keepdim);

// The dtypes of a product: both operands', and the result's. f32 and f64 products keep their
// dtype (a DType converts to that); bf16 and f16 operands give their own dtype or f32, rounded
// once from f32 sums (Note [Products in bf16 and f16 on CUDA], core/cuda/ops_cuda.cpp).
struct GemmDTypes {
  DType operands, result;
  GemmDTypes(DType same) : operands(same), result(same) {}  // NOLINT: implicit on purpose
  GemmDTypes(DType operands_, DType result_) : operands(operands_), result(result_) {}
};
// C[M, N] (row-major, ld ldc) = op(A) @ op(B) (+ C when beta = 1): cuBLAS on device pointers on
// cuda:device_index, operands as ops::gemm's BLAS view (row-major with leading dimensions).
void gemm(int device_index, GemmDTypes dtypes, bool trans_a, bool trans_b, int64_t M, int64_t N,
          int64_t K, const void* A, int64_t lda, const void* B, int64_t ldb, double beta, void* C,
          int64_t ldc);
// `batch` such products at once (cublasGemmStridedBatchedEx): product i reads A + i*stride_a and
// B + i*stride_b and writes C + i*stride_c (strides in elements). Attention's per-head products.
struct GemmBatch {
  int64_t count, stride_a, stride_b, stride_c;
};
void gemm_batched(int device_index, GemmDTypes dtypes, bool trans_a, bool trans_b, int64_t M,
                  int64_t N, int64_t K, const void* A, int64_t lda, const void* B, int64_t ldb,
                  double beta, void* C, int64_t ldc, const GemmBatch& batch);
// linear's two non-GEMM steps: out [R, N] = bias [N] in every row; the column sums [N] of a 2-D
// x [R, N] (dbias), deterministic (chunks of rows in order, then the chunks in order).
void fill_rows(Tensor& out, const Tensor& bias);
Tensor column_sums(const Tensor& x);

Tensor embedding(const Tensor& table, const Tensor& ids);
void embedding_backward_into(Tensor& dtable, const Tensor& dout, const Tensor& ids);
LayerNormOut layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
LayerNormGrads layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd);
Tensor gelu(const Tensor& x);
Tensor gelu_backward(const Tensor& dout, const Tensor& x);
Tensor softmax(const Tensor& x);
Tensor softmax_backward(const Tensor& dout, const Tensor& y);
Tensor dropout(const Tensor& x, double p, RngState rng);

// att of the result is the log-sum-exp [B, NH, T] (see above).
AttentionOut attention(const Tensor& qkv, int64_t n_head, double attn_dropout, RngState rng);
Tensor attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& lse, int64_t n_head,
                          double attn_dropout, RngState rng);

std::pair<Tensor, Tensor> shifted_cross_entropy(const Tensor& logits, const Tensor& ids);
Tensor shifted_cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& lse,
                                      const Tensor& ids, bool reuse_logits);

// Tensor::copy_ and Tensor::fill_ when either side is on a CUDA device (any strides, any dtypes,
// host <-> device through a staging copy).
void copy_(Tensor& dst, const Tensor& src);
void fill_(Tensor& t, double value);

}  // namespace mw::ops::cuda
