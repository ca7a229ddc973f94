// core/ops_cuda.h for builds without CUDA: every op throws DeviceError naming itself. Unreachable
// in practice (without CUDA no tensor can be allocated on a CUDA device), but it keeps the
// dispatch in the CPU ops free of #ifdef.
#include "core/ops_cuda.h"

namespace mw::ops::cuda {

namespace {
[[noreturn]] void no_cuda(const char* op) {
  throw DeviceError(str(op,
                        " on a CUDA tensor needs the CUDA backend, but memwall was built "
                        "without CUDA; use --device cpu or sim, or rebuild with the CUDA "
                        "toolkit (-DMW_CUDA=ON)"));
}
}  // namespace

Tensor binary(BinaryOp, const Tensor&, const Tensor&) { no_cuda("binary op"); }
Tensor affine_scalar(const Tensor&, double, double) { no_cuda("scalar op"); }
Tensor sum_to_shape(const Tensor&, const Shape&) { no_cuda("sum_to_shape"); }
void axpy_(Tensor&, const Tensor&, double) { no_cuda("axpy_"); }
void scale_(Tensor&, double) { no_cuda("scale_"); }
Tensor sum_all(const Tensor&) { no_cuda("sum"); }
Tensor sum_dim(const Tensor&, int64_t, bool) { no_cuda("sum"); }
Tensor expand_dim(const Tensor&, const Shape&, int64_t, bool) { no_cuda("expand"); }
void gemm(int, GemmDTypes, bool, bool, int64_t, int64_t, int64_t, const void*, int64_t, const void*,
          int64_t, double, void*, int64_t) {
  no_cuda("gemm");
}
void gemm_batched(int, GemmDTypes, bool, bool, int64_t, int64_t, int64_t, const void*, int64_t,
                  const void*, int64_t, double, void*, int64_t, const GemmBatch&) {
  no_cuda("gemm_batched");
}
void fill_rows(Tensor&, const Tensor&) { no_cuda("linear"); }
Tensor column_sums(const Tensor&) { no_cuda("linear_backward"); }
Tensor embedding(const Tensor&, const Tensor&) { no_cuda("embedding"); }
void embedding_backward_into(Tensor&, const Tensor&, const Tensor&) {
  no_cuda("embedding_backward");
}
LayerNormOut layernorm(const Tensor&, const Tensor&, const Tensor&, double) {
  no_cuda("layernorm");
}
LayerNormGrads layernorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&) {
  no_cuda("layernorm_backward");
}
Tensor gelu(const Tensor&) { no_cuda("gelu"); }
Tensor gelu_backward(const Tensor&, const Tensor&) { no_cuda("gelu_backward"); }
Tensor softmax(const Tensor&) { no_cuda("softmax"); }
Tensor softmax_backward(const Tensor&, const Tensor&) { no_cuda("softmax_backward"); }
Tensor dropout(const Tensor&, double, RngState) { no_cuda("dropout"); }
AttentionOut attention(const Tensor&, int64_t, double, RngState) { no_cuda("attention"); }
Tensor attention_backward(const Tensor&, const Tensor&, const Tensor&, int64_t, double, RngState) {
  no_cuda("attention_backward");
}
std::pair<Tensor, Tensor> shifted_cross_entropy(const Tensor&, const Tensor&) {
  no_cuda("cross-entropy");
}
Tensor shifted_cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                      bool) {
  no_cuda("cross-entropy backward");
}
void copy_(Tensor&, const Tensor&) { no_cuda("copy_"); }
void fill_(Tensor&, double) { no_cuda("fill_"); }

}  // namespace mw::ops::cuda
