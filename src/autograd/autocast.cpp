// The autocast state, the differentiable cast, and the autocast forms of the matrix products
// (Note [Autocast policy], autocast.h).
#include "autograd/autocast.h"

#include "autograd/node.h"
#include "autograd/saved_tensor.h"
#include "core/ops.h"

namespace mw {

namespace {
thread_local DType t_autocast = DType::F32;
using Grads = std::vector<Tensor>;
}  // namespace

DType autocast_dtype() { return t_autocast; }

AutocastGuard::AutocastGuard(DType low) : previous_(t_autocast) {
  MW_CHECK_T(InvalidArgument, low == DType::F32 || low == DType::BF16 || low == DType::F16,
             "autocast: the precision must be f32, bf16 or f16, got ", dtype_name(low));
  t_autocast = low;
}
AutocastGuard::~AutocastGuard() { t_autocast = previous_; }

DType parse_precision(const std::string& name) {
  if (name == "fp32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  if (name == "fp16") return DType::F16;
  throw InvalidArgument(str("unknown precision '", name, "'; expected fp32, bf16 or fp16"));
}

const char* precision_name(DType dtype) {
  switch (dtype) {
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    default: return "fp32";
  }
}

Tensor cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor out = x.to(dtype);
  return record("CastBackward", out, {x}, [&](const std::vector<bool>&) -> BackwardFn {
    const DType from = x.dtype();
    return [from](const Grads& g) -> Grads { return {g[0].to(from)}; };
  });
}

namespace autocast {

bool applies(std::initializer_list<Tensor> inputs) {
  if (t_autocast == DType::F32) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.dtype() != DType::F32 && t.dtype() != t_autocast) return false;
  return true;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, DType low) {
  Tensor xl = cast(x, low);
  Tensor out = ops::linear(xl, w.detach().to(low), bias);  // bias added in f32 before the rounding
  return record(
      "LinearBackward(autocast)", out, {xl, w, bias},
      [&](const std::vector<bool>& needs) -> BackwardFn {
        SavedTensor sx(needs[1] ? xl : Tensor(), "linear input");
        SavedTensor sw(needs[0] ? w : Tensor(), "linear weight (f32 master)");
        const Shape shape_w = w.shape();
        const DType master = w.dtype();
        const Device device = w.device();
        return [=](const Grads& g) -> Grads {
          // Placeholders for what is not saved, as in mw::linear (functions.cpp).
          Tensor wl = needs[0] ? sw.unpack().to(low) : Tensor::empty(shape_w, low, device);
          Tensor xv = needs[1] ? sx.unpack() : Tensor::empty({1, shape_w[0]}, low, device);
          auto lg = ops::linear_backward(g[0], xv, wl, needs[0], needs[1], needs[2]);
          return {lg.dx, needs[1] ? lg.dw.to(master) : Tensor(), lg.dbias};
        };
      });
}

// Note [Padded vocabulary on CUDA]: cuBLAS's tensor-core kernels want 16-byte aligned rows, and
// GPT-2's 50257-entry vocabulary makes every row of the bf16 logits and of their gradient an odd
// number of elements: the LM head's three products ran at 9 TFLOP/s on an H100 (15.6 ms of an
// 88 ms bf16 step, against ~1 ms each at the rate the same shapes reach aligned). So on CUDA the
// products run on the cast table padded with zero rows to a multiple of 8 entries, into padded
// logits, and the gradient is copied into a padded buffer whose extra columns are zeros. The
// padding adds only zero terms (+0 to a sum changes no bits), so the results are those of the
// unpadded products; the logits the model returns are the unpadded [.., V] (one pitched copy).
// On the CPU (BLAS does not care) nothing is padded.
namespace {

int64_t padded_vocab(int64_t V, const Device& device) {
  return device.is_cuda() ? (V + 7) / 8 * 8 : V;
}

// The table [V, C] cast to `low`, with zero rows up to Vp.
Tensor cast_table(const Tensor& table, DType low, int64_t Vp) {
  const int64_t V = table.size(0);
  if (Vp == V) return table.detach().to(low);
  Tensor out = Tensor::empty({Vp, table.size(1)}, low, table.device());
  out.narrow(0, V, Vp - V).zero_();
  Tensor rows = out.narrow(0, 0, V);
  rows.copy_(table.detach());
  return out;
}

// m [R, V] as [R, Vp] with zero columns after V (m itself when Vp == V).
Tensor pad_columns(const Tensor& m, int64_t Vp) {
  const int64_t R = m.size(0), V = m.size(1);
  if (Vp == V) return m;
  Tensor out = Tensor::empty({R, Vp}, m.dtype(), m.device());
  out.narrow(1, V, Vp - V).zero_();
  Tensor cols = out.narrow(1, 0, V);
  cols.copy_(m);
  return out;
}

}  // namespace

Tensor lm_head(const Tensor& x, const Tensor& table, DType low) {
  MW_CHECK_T(ShapeError, table.dim() == 2 && x.size(-1) == table.size(1), "lm_head: input ",
             x.desc(), " does not fit table ", table.desc());
  const int64_t V = table.size(0), C = table.size(1), Vp = padded_vocab(V, x.device());
  Tensor xl = cast(x, low);
  Tensor wide = Tensor::empty({xl.numel() / C, Vp}, low, x.device());
  ops::gemm(xl.reshape({-1, C}), false, cast_table(table, low, Vp), true, wide, false);
  Tensor out = Vp == V ? wide : wide.narrow(1, 0, V).contiguous();
  Shape shape = x.shape();
  shape.back() = V;
  out = out.view(shape);
  return record(
      "LmHeadBackward(autocast)", out, {xl, table},
      [&](const std::vector<bool>& needs) -> BackwardFn {
        SavedTensor sx(needs[1] ? xl : Tensor(), "lm_head input");
        SavedTensor st(needs[0] ? table : Tensor(), "lm_head table (f32 master)");
        const Shape shape_x = x.shape();
        const DType master = table.dtype();
        return [=](const Grads& g) -> Grads {
          Grads r(2);
          Tensor dy = pad_columns(g[0].reshape({-1, V}), Vp);
          if (needs[0]) {
            Tensor dx = Tensor::empty({dy.size(0), C}, low, dy.device());
            ops::gemm(dy, false, cast_table(st.unpack(), low, Vp), false, dx, false);
            r[0] = dx.view(shape_x);
          }
          if (needs[1]) {  // rounded to the low dtype (as the cast copy's gradient), then widened
            Tensor dt = Tensor::empty({Vp, C}, low, dy.device());
            ops::gemm(dy, true, sx.unpack().reshape({-1, C}), false, dt, false);
            r[1] = dt.narrow(0, 0, V).to(master);
          }
          return r;
        };
      });
}

}  // namespace autocast
}  // namespace mw
