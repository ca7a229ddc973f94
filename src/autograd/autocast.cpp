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
          Tensor wl = needs[0] ? sw.unpack().to(low) : Tensor::empty(shape_w, low, device);
          Tensor xv = needs[1] ? sx.unpack() : Tensor::empty({1, shape_w[0]}, low, device);
          auto lg = ops::linear_backward(g[0], xv, wl, needs[0], needs[1], needs[2]);
          return {lg.dx, needs[1] ? lg.dw.to(master) : Tensor(), lg.dbias};
        };
      });
}

Tensor lm_head(const Tensor& x, const Tensor& table, DType low) {
  MW_CHECK_T(ShapeError, table.dim() == 2 && x.size(-1) == table.size(1), "lm_head: input ",
             x.desc(), " does not fit table ", table.desc());
  const int64_t V = table.size(0), C = table.size(1);
  Tensor xl = cast(x, low);
  Tensor out = Tensor::empty({xl.numel() / C, V}, low, x.device());
  ops::gemm(xl.reshape({-1, C}), false, table.detach().to(low), true, out, false);
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
          Tensor dy = g[0].reshape({-1, V});
          if (needs[0]) {
            Tensor dx = Tensor::empty({dy.size(0), C}, low, dy.device());
            ops::gemm(dy, false, st.unpack().to(low), false, dx, false);
            r[0] = dx.view(shape_x);
          }
          if (needs[1]) {  // rounded to the low dtype (as the cast copy's gradient), then widened
            Tensor dt = Tensor::empty({V, C}, low, dy.device());
            ops::gemm(dy, true, sx.unpack().reshape({-1, C}), false, dt, false);
            r[1] = dt.to(master);
          }
          return r;
        };
      });
}

}  // namespace autocast
}  // namespace mw
