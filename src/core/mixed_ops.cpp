// Low-precision variants of the ops (Note [Low-precision storage], mixed_ops.h): widen, run the f32
// kernel, round the outputs once.
#include "core/mixed_ops.h"

#include <algorithm>

#include "core/convert.h"

namespace mw::ops::mixed {

namespace {
// Rows/columns per block of gemm: an f32 block of 2048 x 2048 is 16 MiB. GPT-2's activations
// (B*T rows <= 2048 at B4 T512) then fit one block, and only the vocabulary dimension is cut.
constexpr int64_t kGemmBlock = 2048;

Tensor narrow_to(const Tensor& t, DType dtype) { return t.dtype() == dtype ? t : t.to(dtype); }

// The low dtype among the arguments (they must agree), or F32.
DType low_dtype_of(const char* op, std::initializer_list<const Tensor*> ts) {
  DType low = DType::F32;
  for (const Tensor* t : ts) {
    if (!t->defined() || !is_low_precision(t->dtype())) continue;
    MW_CHECK_T(ShapeError, low == DType::F32 || low == t->dtype(), op,
               ": bf16 and f16 inputs mixed in one op: ", t->desc(), "; cast them to one dtype");
    low = t->dtype();
  }
  return low;
}

// A row-major copy of op(t)'s block [r0, r0+rn) x [c0, c0+cn) in f32, where op(t) = t^T when
// `trans`. The block is cut from t as stored, so the copy reads whole row segments.
Tensor widened_block(const Tensor& t, bool trans, int64_t r0, int64_t rn, int64_t c0, int64_t cn) {
  const Tensor blk =
      trans ? t.narrow(0, c0, cn).narrow(1, r0, rn) : t.narrow(0, r0, rn).narrow(1, c0, cn);
  return blk.to(DType::F32).contiguous();
}

// A 2-D operand as a view whose last dimension has stride 1, with `trans` flipped if it had to be
// transposed for that (a transposed view of a row-major matrix).
Tensor row_major(const Tensor& t, bool& trans) {
  MW_CHECK_T(ShapeError, t.dim() == 2, "gemm: expected a 2-D operand, got ", t.desc());
  if (t.stride(1) == 1) return t;
  if (t.stride(0) == 1) {
    trans = !trans;
    return t.transpose(0, 1);
  }
  return t.contiguous();
}
}  // namespace

bool any_low(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && is_low_precision(t->dtype())) return true;
  return false;
}

Tensor widen(const Tensor& t) { return narrow_to(t, DType::F32); }

void gemm(const Tensor& a_in, bool trans_a, const Tensor& b_in, bool trans_b, Tensor& out,
          bool accumulate) {
  for (const Tensor* t : {&a_in, &b_in, static_cast<const Tensor*>(&out)})
    MW_CHECK_T(ShapeError, t->dtype() == DType::F32 || is_low_precision(t->dtype()),
               "gemm: mixed-precision operands must be f32, bf16 or f16, got ", t->desc());
  Tensor a = row_major(a_in, trans_a), b = row_major(b_in, trans_b);
  const int64_t M = trans_a ? a.size(1) : a.size(0), K = trans_a ? a.size(0) : a.size(1);
  const int64_t N = trans_b ? b.size(0) : b.size(1);
  MW_CHECK_T(ShapeError, (trans_b ? b.size(1) : b.size(0)) == K,
             "gemm: inner dimensions differ: ", a_in.desc(), " @ ", b_in.desc());
  MW_CHECK_T(ShapeError,
             out.dim() == 2 && out.size(0) == M && out.size(1) == N && out.is_contiguous(),
             "gemm: output ", out.desc(), " is not a contiguous [", M, ", ", N, "]");
  out.bump_version();
  for (int64_t m0 = 0; m0 < M; m0 += kGemmBlock) {
    const int64_t mn = std::min(kGemmBlock, M - m0);
    for (int64_t n0 = 0; n0 < N; n0 += kGemmBlock) {
      const int64_t nn = std::min(kGemmBlock, N - n0);
      Tensor out_block = out.narrow(0, m0, mn).narrow(1, n0, nn);
      Tensor acc = accumulate ? out_block.to(DType::F32).contiguous()
                              : Tensor::empty({mn, nn}, DType::F32, out.device());
      if (K == 0 && !accumulate) acc.zero_();
      for (int64_t k0 = 0; k0 < K; k0 += kGemmBlock) {
        const int64_t kn = std::min(kGemmBlock, K - k0);
        Tensor ab = widened_block(a, trans_a, m0, mn, k0, kn);
        Tensor bb = widened_block(b, trans_b, k0, kn, n0, nn);
        ops::gemm(ab, trans_a, bb, trans_b, acc, accumulate || k0 > 0);
      }
      out_block.copy_(acc);  // the one rounding of each output element
    }
  }
}

// The layer-sized ops widen whole operands: a GPT-2 weight or activation is at most tens of MiB
// in f32, alive only during the call.

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  const DType low = low_dtype_of("linear", {&x, &w, &bias});
  return narrow_to(ops::linear(widen(x), widen(w), bias.defined() ? widen(bias) : bias), low);
}

LinearGrads linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, bool need_dx,
                            bool need_dw, bool need_dbias) {
  low_dtype_of("linear_backward", {&dy, &x, &w});
  LinearGrads g32 =
      ops::linear_backward(widen(dy), widen(x), widen(w), need_dx, need_dw, need_dbias);
  // dx and dw in their inputs' dtypes; dbias stays f32 (the bias is an f32 master under autocast).
  return {need_dx ? narrow_to(g32.dx, x.dtype()) : Tensor(),
          need_dw ? narrow_to(g32.dw, w.dtype()) : Tensor(), g32.dbias};
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  // f32 with bf16 gives f32 (PyTorch's promotion); two low inputs give their low dtype.
  const DType low = low_dtype_of("binary op", {&a, &b});
  const bool both_low = is_low_precision(a.dtype()) && is_low_precision(b.dtype());
  return narrow_to(ops::binary(op, widen(a), widen(b)), both_low ? low : DType::F32);
}

void axpy_(Tensor& y, const Tensor& x, double alpha) {
  Tensor y32 = widen(y);
  if (y32.is_same(y)) return ops::axpy_(y, widen(x), alpha);
  ops::axpy_(y32, widen(x), alpha);
  y.copy_(y32);
}

Tensor sum_to_shape(const Tensor& grad, const Shape& shape) {
  return narrow_to(ops::sum_to_shape(widen(grad), shape), grad.dtype());
}

Tensor gelu(const Tensor& x) { return narrow_to(ops::gelu(widen(x)), x.dtype()); }

Tensor gelu_backward(const Tensor& dout, const Tensor& x) {
  return narrow_to(ops::gelu_backward(widen(dout), widen(x)), dout.dtype());
}

Tensor dropout(const Tensor& x, double p, RngState rng) {
  return narrow_to(ops::dropout(widen(x), p, rng), x.dtype());
}

// att stays f32: on cpu/sim each row's softmax statistics (Note [Row statistics instead of
// probabilities], cpu/attention.cpp: rounded probabilities would move every dS of a row), on CUDA
// the per-row log-sum-exp [B, NH, T], where bf16's 2^-8 relative step on a value near log(T) would
// scale every recomputed probability by up to 4%.
AttentionOut attention(const Tensor& qkv, int64_t n_head, double attn_dropout, RngState rng) {
  AttentionOut r = ops::attention(widen(qkv), n_head, attn_dropout, rng);
  return {narrow_to(r.out, qkv.dtype()), r.att};
}

Tensor attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& att, int64_t n_head,
                          double attn_dropout, RngState rng) {
  return narrow_to(
      ops::attention_backward(widen(dout), widen(qkv), widen(att), n_head, attn_dropout, rng),
      qkv.dtype());
}

}  // namespace mw::ops::mixed
