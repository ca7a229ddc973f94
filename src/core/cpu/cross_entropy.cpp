// The fused shifted cross-entropy of GPT-2 training (ColossalAI GPTLMLoss):
//   loss = mean over b, t < T-1 of (logsumexp(logits[b, t]) - logits[b, t, ids[b, t+1]]).
// Row losses are summed serially in double, so the loss is deterministic for any thread count.
#include <cmath>

#include "core/convert.h"
#include "core/cpu/fast_math.h"
#include "core/cpu/row_softmax.h"
#include "core/ops.h"
#include "core/ops_cuda.h"
#include "core/parallel.h"

namespace mw::ops {

namespace {
std::vector<int64_t> target_ids(const Tensor& ids, int64_t B, int64_t T, int64_t V) {
  MW_CHECK_T(ShapeError, ids.dim() == 2 && ids.size(0) == B && ids.size(1) == T,
             "cross-entropy: ids ", ids.desc(), " do not match logits [", B, ", ", T, ", ", V, "]");
  std::vector<int64_t> out(static_cast<size_t>(B * T));
  Tensor c = ids.contiguous();
  for (int64_t i = 0; i < B * T; ++i) {
    int64_t id = ids.dtype() == DType::I32 ? c.data<int32_t>()[i] : c.data<int64_t>()[i];
    MW_CHECK_T(InvalidArgument, id >= 0 && id < V, "cross-entropy: target id ", id,
               " outside the vocabulary of ", V);
    out[static_cast<size_t>(i)] = id;
  }
  return out;
}

MW_F32_BODY double row_max_and_sum_f32_body(const float* row, int64_t V, float& mx) {
  return row_max_and_sum(row, V, mx);
}
MW_F32_VERSIONS(double, row_max_and_sum_f32, (const float* row, int64_t V, float& mx), (row, V, mx))

// d = e^(row - l) * scale: the softmax's gradient before the target's -scale.
MW_F32_BODY void softmax_grad_row_f32_body(const float* row, float l, float scale, float* d,
                                           int64_t V) {
  for (int64_t j = 0; j < V; ++j) d[j] = fast::exp(row[j] - l) * scale;
}
MW_F32_VERSIONS(void, softmax_grad_row_f32,
                (const float* row, float l, float scale, float* d, int64_t V),
                (row, l, scale, d, V))

}  // namespace

std::pair<Tensor, Tensor> shifted_cross_entropy(const Tensor& logits_in, const Tensor& ids) {
  MW_CHECK_T(ShapeError, is_floating(logits_in.dtype()),
             "cross-entropy: expected floating logits, got ", logits_in.desc());
  MW_CHECK_T(ShapeError, logits_in.dim() == 3 && logits_in.size(1) >= 2,
             "cross-entropy: expected logits [B, T>=2, V], got ", logits_in.desc());
  if (logits_in.device()
          .is_cuda())  // low precision there: widened whole (Note [Low-precision storage])
    return cuda::shifted_cross_entropy(
        is_low_precision(logits_in.dtype()) ? logits_in.to(DType::F32) : logits_in, ids);
  Tensor logits = logits_in.contiguous();
  const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
  const auto targets = target_ids(ids, B, T, V);
  // bf16/f16 logits (Note [Low-precision storage], mixed_ops.h): each row is widened to f32 on
  // its own and the loss and log-sum-exp are f32, so no f32 copy of the logits is ever whole.
  const DType store = logits.dtype();
  const DType compute = is_low_precision(store) ? DType::F32 : store;
  Tensor loss = Tensor::empty({}, compute, logits.device());
  Tensor lse = Tensor::empty({B, T - 1}, compute, logits.device());
  dispatch_float(compute, "cross-entropy", [&]<typename Tp>() {
    const char* pl = static_cast<const char*>(logits.raw_data());
    const int64_t esize = dtype_size(store);
    Tp* plse = lse.template data<Tp>();
    std::vector<double> row_loss(static_cast<size_t>(B * (T - 1)));
    parallel_for(B * (T - 1), 4, [&](int64_t s, int64_t e) {
      std::vector<Tp> widened(store == compute ? 0 : static_cast<size_t>(V));
      for (int64_t r = s; r < e; ++r) {
        const int64_t b = r / (T - 1), t = r % (T - 1);
        const Tp* row = reinterpret_cast<const Tp*>(pl + (b * T + t) * V * esize);
        if (store != compute) {
          convert_floats(store, pl + (b * T + t) * V * esize, compute, widened.data(), V);
          row = widened.data();
        }
        Tp mx;
        double sum;
        if constexpr (std::is_same_v<Tp, float>)
          sum = row_max_and_sum_f32(row, V, mx);  // Note [Wider versions of f32 loops]
        else
          sum = row_max_and_sum(row, V, mx);
        const Tp l = static_cast<Tp>(static_cast<double>(mx) + std::log(sum));
        plse[r] = l;
        row_loss[static_cast<size_t>(r)] = static_cast<double>(l - row[targets[b * T + t + 1]]);
      }
    });
    double total = 0;
    for (double v : row_loss) total += v;
    *loss.template data<Tp>() = static_cast<Tp>(total / static_cast<double>(B * (T - 1)));
  });
  return {loss, lse};
}

Tensor shifted_cross_entropy_backward(const Tensor& dloss, const Tensor& logits_in,
                                      const Tensor& lse, const Tensor& ids, bool reuse_logits) {
  if (logits_in.device().is_cuda() && is_low_precision(logits_in.dtype()))
    return cuda::shifted_cross_entropy_backward(dloss, logits_in.to(DType::F32), lse, ids, true)
        .to(logits_in.dtype());
  if (logits_in.device().is_cuda())
    return cuda::shifted_cross_entropy_backward(dloss, logits_in, lse, ids, reuse_logits);
  Tensor logits = logits_in.contiguous();
  const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
  const auto targets = target_ids(ids, B, T, V);
  Tensor dlogits = reuse_logits && logits.is_same(logits_in)
                       ? logits
                       : Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  dlogits.bump_version();
  // Low-precision logits: each row is widened, its gradient computed in f32 and rounded once into
  // the low-precision dlogits row (which may be the logits row itself).
  const DType store = logits.dtype();
  const DType compute = is_low_precision(store) ? DType::F32 : store;
  const int64_t esize = dtype_size(store);
  dispatch_float(compute, "cross-entropy backward", [&]<typename Tp>() {
    const char* pl = static_cast<const char*>(logits.raw_data());
    char* pd = static_cast<char*>(dlogits.raw_data());
    Tensor lse32 = lse.to(compute).contiguous();
    const Tp* plse = lse32.template data<Tp>();
    const Tp scale = static_cast<Tp>(dloss.item() / static_cast<double>(B * (T - 1)));
    parallel_for(B * T, 4, [&](int64_t s, int64_t e) {
      std::vector<Tp> row_in(store == compute ? 0 : static_cast<size_t>(V)), row_out(row_in.size());
      for (int64_t r = s; r < e; ++r) {
        const int64_t b = r / T, t = r % T;
        Tp* d = store == compute ? reinterpret_cast<Tp*>(pd + r * V * esize) : row_out.data();
        const Tp* row = reinterpret_cast<const Tp*>(pl + r * V * esize);
        if (t == T - 1) {
          std::fill(d, d + V, Tp(0));
        } else {
          if (store != compute) {
            convert_floats(store, pl + r * V * esize, compute, row_in.data(), V);
            row = row_in.data();
          }
          const Tp l = plse[b * (T - 1) + t];
          if constexpr (std::is_same_v<Tp, float>)
            softmax_grad_row_f32(row, l, scale, d, V);  // Note [Wider versions of f32 loops]
          else
            for (int64_t j = 0; j < V; ++j) d[j] = fast::exp_t(row[j] - l) * scale;
          d[targets[r + 1]] -= scale;
        }
        if (store != compute) convert_floats(compute, d, store, pd + r * V * esize, V);
      }
    });
  });
  return dlogits;
}

}  // namespace mw::ops
