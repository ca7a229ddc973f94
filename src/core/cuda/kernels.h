// Raw-pointer launchers of the CUDA model kernels (core/cuda/*.cu). The Tensor-level wrappers in
// core/cuda/ops_cuda.cpp check shapes, allocate outputs and call these; the .cu files see only
// this header, so they compile as C++17 (nvcc) while the rest of core is C++20.
//
// Every launcher enqueues on the legacy default stream of the current device (the wrappers set
// it), checks the launch (check_kernel_launch) and returns without synchronising. T is float or
// double (explicit instantiations in the .cu files). All sizes are int64_t; pointers are device
// pointers to contiguous row-major data unless strides are given.
#pragma once

#include <cstdint>

#include "core/random.h"

namespace mw::ops::cuda_kernels {

// Throws DeviceError naming `op` when the last kernel launch failed (defined in ops_cuda.cpp).
void check_kernel_launch(const char* op);

// Shape and element strides of up to kMaxRank dims, passed to kernels by value.
constexpr int kMaxRank = 8;
struct StridedShape {
  int32_t rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};
};

// ---- elementwise (elementwise.cu) ----
// op: 0 add, 1 sub, 2 mul, 3 div (the order of ops::BinaryOp). a and b are read through strides
// aligned to out's shape (0 where broadcast); out is contiguous with n elements.
template <typename T>
void binary(int op, const T* a, StridedShape a_view, const T* b, StridedShape b_view, T* out,
            int64_t n);
template <typename T>
void affine(const T* a, T* out, int64_t n, double alpha, double beta);
template <typename T>
void axpy(T* y, const T* x, int64_t n, double alpha);
// x[i] *= alpha, in place (no + 0: a -0 stays -0, as on the CPU).
template <typename T>
void scale(T* x, int64_t n, double alpha);
// out[o] = sum of grad over the elements that broadcast to o, in element order. grad is
// contiguous with shape grad_shape; out_view holds out's strides aligned to grad_shape (0 where
// broadcast), reduce_view the shape/strides (in grad) of the broadcast dims, for a walk.
template <typename T>
void sum_to_shape(const T* grad, StridedShape grad_to_out, StridedShape reduce_walk, T* out,
                  int64_t out_numel);
// out[0] = sum of x[n], in a fixed order (one block, double accumulation).
template <typename T>
void sum_all(const T* x, int64_t n, T* out);
// x viewed as [outer, n, inner]: out[o, i] = sum_k x[o, k, i] (k in order).
template <typename T>
void sum_dim(const T* x, int64_t outer, int64_t n, int64_t inner, T* out);
// out viewed as [outer, n, inner]: out[o, k, i] = g[o, i].
template <typename T>
void expand_dim(const T* g, int64_t outer, int64_t n, int64_t inner, T* out);
// Strided copy with dtype conversion: dst and src are read through their views (same shape).
// dtype codes are core/dtype.h's DType values; any pair of the seven types.
void copy_strided(void* dst, StridedShape dst_view, int dst_dtype, const void* src,
                  StridedShape src_view, int src_dtype, int64_t n);
void fill(void* dst, StridedShape dst_view, int dtype, double value, int64_t n);
// Contiguous f32 <-> bf16/f16 (Note [Low-precision conversions], core/convert.h): one element
// per thread, __float2bfloat16_rn / __float2half_rn (nearest even, subnormals kept) and exact
// widening. dtype codes as above; one side F32, the other BF16 or F16.
void convert_floats(void* dst, int dst_dtype, const void* src, int src_dtype, int64_t n);

// ---- layers (layers.cu) ----
// out[r, :] = table[rows[r], :] for r < n_rows (rows validated by the caller).
template <typename T>
void embedding(const T* table, const int64_t* rows, int64_t n_rows, int64_t C, T* out);
// Deterministic scatter-add: for each distinct row u, dtable[uniq[u], c] += dout[order[k], c] for
// k in [starts[u], starts[u+1]) in order (order lists positions sorted stably by id).
template <typename T>
void embedding_backward(const T* dout, const int64_t* uniq, const int64_t* starts,
                        const int64_t* order, int64_t n_uniq, int64_t C, T* dtable);
template <typename T>
void layernorm(const T* x, const T* w, const T* b, int64_t N, int64_t C, double eps, T* out,
               T* mean, T* rstd);
// dx per row; dweight and dbias by column_sum (fixed order). scratch holds
// layernorm_backward_scratch_numel(N, C) elements.
template <typename T>
void layernorm_backward(const T* dout, const T* x, const T* w, const T* mean, const T* rstd,
                        int64_t N, int64_t C, T* dx, T* dweight, T* dbias, T* scratch);
// Elements of scratch that layernorm_backward needs for N rows of C channels.
int64_t layernorm_backward_scratch_numel(int64_t N, int64_t C);
// out[c] = sum over rows r of x[r, c] (fixed order: chunks of rows, then chunks in order).
// scratch holds column_sum_scratch_numel(R, C) elements.
template <typename T>
void column_sum(const T* x, int64_t R, int64_t C, T* out, T* scratch);
int64_t column_sum_scratch_numel(int64_t R, int64_t C);
// out[r, :] = bias[:] for R rows of N.
template <typename T>
void broadcast_rows(const T* bias, int64_t R, int64_t N, T* out);
template <typename T>
void gelu(const T* x, T* out, int64_t n);
template <typename T>
void gelu_backward(const T* dout, const T* x, T* dx, int64_t n);
template <typename T>
void softmax(const T* x, T* out, int64_t N, int64_t C);
template <typename T>
void softmax_backward(const T* dout, const T* y, T* dx, int64_t N, int64_t C);
template <typename T>
void dropout(const T* x, T* out, int64_t n, double p, RngState rng);

// ---- attention (attention.cu), Note [Attention on CUDA by query blocks] ----
// dst [parts][B][NH][T][hs] from src [B][T][parts * C], and back (parts 3 for qkv, 1 for out).
// split_heads also takes uint16_t: bf16 and f16 planes are moved as 16-bit patterns.
template <typename T>
void split_heads(const T* src, T* dst, int64_t B, int64_t T_len, int64_t C, int64_t NH, int parts);
template <typename T>
void merge_heads(const T* src, T* dst, int64_t B, int64_t T_len, int64_t C, int64_t NH, int parts);
// merge_heads from f32 planes into a bf16 or f16 tensor (low_dtype: a DType code), each element
// rounded once (nearest even).
void merge_heads_low(const float* src, void* dst, int low_dtype, int64_t B, int64_t T_len,
                     int64_t C, int64_t NH, int parts);
// One block of query rows [t0, t0 + rows) of every (batch, head): scores [BNH][rows][keys], keys =
// t0 + rows (the causal prefix); T the sequence length, hs the head size (scale 1/sqrt(hs)).
struct AttentionBlock {
  int64_t BNH, T, rows, keys, t0, hs;
};
// Where the row kernels write what the next products read: in place over the scores (null
// pointers), or rounded to a bf16 or f16 copy with the scores' layout (Note [Low-precision
// attention on CUDA]; float scores only).
struct LowCopies {
  void* probs = nullptr;    // P~
  void* dscores = nullptr;  // dS (backward)
  int dtype = 0;            // their DType code
};
// Raw scores -> dropped-out probabilities (in place or into low.probs); the rows' log-sum-exp into
// lse [BNH, T].
template <typename T>
void attention_probs(T* scores, const AttentionBlock& blk, double attn_dropout, RngState rng,
                     T* lse, const LowCopies& low = {});
// Backward: raw scores -> probabilities (from lse), dprobs (dO . v) -> score gradients, in place
// or into low.probs and low.dscores.
template <typename T>
void attention_grad_scores(T* scores, T* dprobs, const T* lse, const AttentionBlock& blk,
                           double attn_dropout, RngState rng, const LowCopies& low = {});

// ---- shifted cross-entropy (cross_entropy.cu) ----
// targets [B, T] int64 (validated). lse [B, T-1]; loss [1] = mean of the row losses; row_loss is
// scratch [B, T-1].
template <typename T>
void cross_entropy_forward(const T* logits, const int64_t* targets, int64_t B, int64_t T_len,
                           int64_t V, T* lse, T* row_loss, T* loss);
// scale = dloss / (B*(T-1)); dlogits may alias logits.
template <typename T>
void cross_entropy_backward(const T* logits, const T* lse, const int64_t* targets, int64_t B,
                            int64_t T_len, int64_t V, double scale, T* dlogits);

}  // namespace mw::ops::cuda_kernels
