// Tensor-level CUDA ops, part 2: embedding, layernorm, GELU, softmax, dropout and the shifted
// cross-entropy (core/ops_cuda.h; attention is attention_cuda.cpp). Token ids are validated on the
// host, as on the CPU, which costs one small device-to-host copy of the ids per call.
#include <algorithm>
#include <numeric>

#include "core/cuda/tensor_args.h"
#include "core/ops_cuda.h"

namespace mw::ops::cuda {

namespace {

// The ids as int64 on `device`, after checking each is in [0, V). `op` names the caller.
Tensor checked_ids_on(const char* op, const std::vector<int64_t>& rows, int64_t V, Device device) {
  for (size_t i = 0; i < rows.size(); ++i)
    MW_CHECK_T(InvalidArgument, rows[i] >= 0 && rows[i] < V, op, ": token id ", rows[i],
               " at position ", i, " is outside the table's ", V,
               " rows; check the data's vocabulary");
  return Tensor::from_vector(rows, {static_cast<int64_t>(rows.size())}, device);
}

}  // namespace

// ---------------- embedding ----------------

Tensor embedding(const Tensor& table_in, const Tensor& ids) {
  use_device_of("embedding", table_in);
  MW_CHECK_T(ShapeError, table_in.dim() == 2, "embedding: table must be [V, C], got ",
             table_in.desc());
  Tensor table = table_in.contiguous();
  const int64_t V = table.size(0), C = table.size(1);
  Shape shape = ids.shape();
  shape.push_back(C);
  Tensor out = Tensor::empty(shape, table.dtype(), table.device());
  const std::vector<int64_t> rows = token_ids(ids);
  Tensor rows_dev = checked_ids_on("embedding", rows, V, table.device());
  dispatch_float(table.dtype(), "embedding", [&]<typename T>() {
    cuda_kernels::embedding<T>(cptr<T>(table), cptr<int64_t>(rows_dev),
                               static_cast<int64_t>(rows.size()), C, mptr<T>(out));
  });
  return out;
}

void embedding_backward_into(Tensor& dtable, const Tensor& dout_in, const Tensor& ids) {
  use_device_of("embedding_backward", dtable, {&dout_in});
  Tensor dout = dout_in.contiguous();
  const int64_t C = dout.size(-1);
  MW_CHECK_T(ShapeError,
             dtable.dim() == 2 && dtable.size(1) == C && dtable.is_contiguous() &&
                 dtable.dtype() == dout.dtype(),
             "embedding_backward_into: table gradient ", dtable.desc(), " does not fit ",
             dout.desc());
  const std::vector<int64_t> rows = token_ids(ids);
  for (int64_t r : rows)
    MW_CHECK_T(InvalidArgument, r >= 0 && r < dtable.size(0), "embedding_backward: token id ", r,
               " is outside the table's ", dtable.size(0), " rows");
  // Positions grouped by id, in position order within a group: each (row, channel) is one thread
  // adding its positions in the CPU's order, so the sums are deterministic (and equal the CPU's).
  std::vector<int64_t> order(rows.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return rows[a] < rows[b]; });
  std::vector<int64_t> uniq, starts;
  for (size_t k = 0; k < order.size(); ++k) {
    if (k == 0 || rows[order[k]] != rows[order[k - 1]]) {
      uniq.push_back(rows[order[k]]);
      starts.push_back(static_cast<int64_t>(k));
    }
  }
  starts.push_back(static_cast<int64_t>(order.size()));
  dtable.bump_version();
  if (uniq.empty()) return;
  const Device dev = dtable.device();
  Tensor u = Tensor::from_vector(uniq, {static_cast<int64_t>(uniq.size())}, dev);
  Tensor s = Tensor::from_vector(starts, {static_cast<int64_t>(starts.size())}, dev);
  Tensor o = Tensor::from_vector(order, {static_cast<int64_t>(order.size())}, dev);
  dispatch_float(dout.dtype(), "embedding_backward", [&]<typename T>() {
    cuda_kernels::embedding_backward<T>(cptr<T>(dout), cptr<int64_t>(u), cptr<int64_t>(s),
                                        cptr<int64_t>(o), static_cast<int64_t>(uniq.size()), C,
                                        mptr<T>(dtable));
  });
}

// ---------------- layernorm ----------------

LayerNormOut layernorm(const Tensor& x_in, const Tensor& weight, const Tensor& bias, double eps) {
  use_device_of("layernorm", x_in, {&weight, &bias});
  Tensor x = x_in.contiguous(), w = weight.contiguous(), b = bias.contiguous();
  const int64_t C = x.size(-1), N = x.numel() / std::max<int64_t>(C, 1);
  MW_CHECK_T(ShapeError, w.numel() == C && b.numel() == C, "layernorm: weight ", weight.desc(),
             " and bias ", bias.desc(), " must have ", C, " elements for ", x.desc());
  LayerNormOut r{Tensor::empty(x.shape(), x.dtype(), x.device()),
                 Tensor::empty({N}, x.dtype(), x.device()),
                 Tensor::empty({N}, x.dtype(), x.device())};
  dispatch_float(x.dtype(), "layernorm", [&]<typename T>() {
    cuda_kernels::layernorm<T>(cptr<T>(x), cptr<T>(w), cptr<T>(b), N, C, eps, mptr<T>(r.out),
                               mptr<T>(r.mean), mptr<T>(r.rstd));
  });
  return r;
}

LayerNormGrads layernorm_backward(const Tensor& dout_in, const Tensor& x_in, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd) {
  use_device_of("layernorm_backward", x_in, {&dout_in, &weight, &mean, &rstd});
  Tensor dout = dout_in.contiguous(), x = x_in.contiguous(), w = weight.contiguous();
  Tensor m = mean.contiguous(), rs = rstd.contiguous();
  const int64_t C = x.size(-1), N = x.numel() / std::max<int64_t>(C, 1);
  LayerNormGrads g{Tensor::empty(x.shape(), x.dtype(), x.device()),
                   Tensor::empty({C}, x.dtype(), x.device()),
                   Tensor::empty({C}, x.dtype(), x.device())};
  Tensor scratch =
      Tensor::empty({cuda_kernels::layernorm_backward_scratch_numel(N, C)}, x.dtype(), x.device());
  dispatch_float(x.dtype(), "layernorm_backward", [&]<typename T>() {
    cuda_kernels::layernorm_backward<T>(cptr<T>(dout), cptr<T>(x), cptr<T>(w), cptr<T>(m),
                                        cptr<T>(rs), N, C, mptr<T>(g.dx), mptr<T>(g.dweight),
                                        mptr<T>(g.dbias), mptr<T>(scratch));
  });
  return g;
}

// ---------------- activations, dropout ----------------

Tensor gelu(const Tensor& x_in) {
  use_device_of("gelu", x_in);
  Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float(x.dtype(), "gelu",
                 [&]<typename T>() { cuda_kernels::gelu<T>(cptr<T>(x), mptr<T>(out), x.numel()); });
  return out;
}

Tensor gelu_backward(const Tensor& dout_in, const Tensor& x_in) {
  use_device_of("gelu_backward", x_in, {&dout_in});
  Tensor x = x_in.contiguous(), dout = dout_in.contiguous();
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float(x.dtype(), "gelu_backward", [&]<typename T>() {
    cuda_kernels::gelu_backward<T>(cptr<T>(dout), cptr<T>(x), mptr<T>(dx), x.numel());
  });
  return dx;
}

Tensor softmax(const Tensor& x_in) {
  use_device_of("softmax", x_in);
  Tensor x = x_in.contiguous();
  const int64_t C = x.size(-1), N = x.numel() / std::max<int64_t>(C, 1);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float(x.dtype(), "softmax",
                 [&]<typename T>() { cuda_kernels::softmax<T>(cptr<T>(x), mptr<T>(out), N, C); });
  return out;
}

Tensor softmax_backward(const Tensor& dout_in, const Tensor& y_in) {
  use_device_of("softmax_backward", y_in, {&dout_in});
  Tensor y = y_in.contiguous(), dout = dout_in.contiguous();
  const int64_t C = y.size(-1), N = y.numel() / std::max<int64_t>(C, 1);
  Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
  dispatch_float(y.dtype(), "softmax_backward", [&]<typename T>() {
    cuda_kernels::softmax_backward<T>(cptr<T>(dout), cptr<T>(y), mptr<T>(dx), N, C);
  });
  return dx;
}

Tensor dropout(const Tensor& x_in, double p, RngState rng) {
  use_device_of("dropout", x_in);
  Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float(x.dtype(), "dropout", [&]<typename T>() {
    cuda_kernels::dropout<T>(cptr<T>(x), mptr<T>(out), x.numel(), p, rng);
  });
  return out;
}

// ---------------- shifted cross-entropy ----------------

namespace {

Tensor targets_on(const Tensor& ids, int64_t B, int64_t T, int64_t V, Device device) {
  MW_CHECK_T(ShapeError, ids.dim() == 2 && ids.size(0) == B && ids.size(1) == T,
             "cross-entropy: ids ", ids.desc(), " do not match logits [", B, ", ", T, ", ", V, "]");
  return checked_ids_on("cross-entropy", token_ids(ids), V, device);
}

}  // namespace

std::pair<Tensor, Tensor> shifted_cross_entropy(const Tensor& logits_in, const Tensor& ids) {
  use_device_of("cross-entropy", logits_in);
  MW_CHECK_T(ShapeError, logits_in.dim() == 3 && logits_in.size(1) >= 2,
             "cross-entropy: expected logits [B, T>=2, V], got ", logits_in.desc());
  Tensor logits = logits_in.contiguous();
  const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
  Tensor targets = targets_on(ids, B, T, V, logits.device());
  Tensor loss = Tensor::empty({}, logits.dtype(), logits.device());
  Tensor lse = Tensor::empty({B, T - 1}, logits.dtype(), logits.device());
  Tensor row_loss = Tensor::empty({B, T - 1}, logits.dtype(), logits.device());
  dispatch_float(logits.dtype(), "cross-entropy", [&]<typename Tp>() {
    cuda_kernels::cross_entropy_forward<Tp>(cptr<Tp>(logits), cptr<int64_t>(targets), B, T, V,
                                            mptr<Tp>(lse), mptr<Tp>(row_loss), mptr<Tp>(loss));
  });
  return {loss, lse};
}

Tensor shifted_cross_entropy_backward(const Tensor& dloss, const Tensor& logits_in,
                                      const Tensor& lse_in, const Tensor& ids, bool reuse_logits) {
  use_device_of("cross-entropy backward", logits_in, {&lse_in});
  Tensor logits = logits_in.contiguous(), lse = lse_in.contiguous();
  const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
  Tensor targets = targets_on(ids, B, T, V, logits.device());
  Tensor dlogits = reuse_logits && logits.is_same(logits_in)
                       ? logits
                       : Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  dlogits.bump_version();
  const double scale = dloss.item() / static_cast<double>(B * (T - 1));
  dispatch_float(logits.dtype(), "cross-entropy backward", [&]<typename Tp>() {
    cuda_kernels::cross_entropy_backward<Tp>(
        cptr<Tp>(logits), cptr<Tp>(lse), cptr<int64_t>(targets), B, T, V, scale, mptr<Tp>(dlogits));
  });
  return dlogits;
}

}  // namespace mw::ops::cuda
