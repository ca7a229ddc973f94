// Elementwise kernels with NumPy broadcasting, scalar affine maps, and the reductions that undo
// broadcasting in backward. Float tensors only (f32, f64).
#include <algorithm>

#include "core/mixed_ops.h"
#include "core/ops.h"
#include "core/ops_cuda.h"
#include "core/parallel.h"

namespace mw::ops {

namespace {
constexpr int64_t kGrain = 1 << 14;

// Strides of `t` aligned to an output of rank `rank` and shape `out`: 0 where t is broadcast.
Shape broadcast_strides(const Tensor& t, const Shape& out) {
  const int64_t rank = static_cast<int64_t>(out.size());
  Shape s(rank, 0);
  const int64_t off = rank - t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) s[off + d] = t.size(d) == 1 ? 0 : t.stride(d);
  return s;
}

template <typename T, typename F>
void binary_loop(const Tensor& a, const Tensor& b, Tensor& out, F f) {
  const T* pa = a.template data<T>();
  const T* pb = b.template data<T>();
  T* po = out.template data<T>();
  const int64_t n = out.numel();
  if (a.shape() == out.shape() && b.shape() == out.shape() && a.is_contiguous() &&
      b.is_contiguous()) {
    parallel_for(n, kGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) po[i] = f(pa[i], pb[i]);
    });
    return;
  }
  // General case: rows over all but the last dim, an inner strided loop over the last.
  const Shape& shape = out.shape();
  const Shape sa = broadcast_strides(a, shape), sb = broadcast_strides(b, shape);
  const int64_t rank = static_cast<int64_t>(shape.size());
  const int64_t inner = rank ? shape.back() : 1;
  const int64_t rows = inner ? n / inner : 0;
  const int64_t ia = rank ? sa.back() : 0, ib = rank ? sb.back() : 0;
  parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1)),
               [&](int64_t s, int64_t e) {
                 for (int64_t r = s; r < e; ++r) {
                   int64_t oa = 0, ob = 0, rem = r;
                   for (int64_t d = rank - 2; d >= 0; --d) {
                     int64_t idx = rem % shape[d];
                     rem /= shape[d];
                     oa += idx * sa[d];
                     ob += idx * sb[d];
                   }
                   T* o = po + r * inner;
                   for (int64_t j = 0; j < inner; ++j) o[j] = f(pa[oa + j * ia], pb[ob + j * ib]);
                 }
               });
}

}  // namespace

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    MW_CHECK_T(ShapeError, da == db || da == 1 || db == 1, "cannot broadcast ", shape_str(a),
               " with ", shape_str(b), ": dimension ", i, " is ", da, " vs ", db);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  if (mixed::any_low({&a, &b})) return mixed::binary(op, a, b);
  check_float("binary op", a);
  MW_CHECK_T(ShapeError, a.dtype() == b.dtype(), "binary op: dtypes differ: ", a.desc(), " vs ",
             b.desc());
  MW_CHECK_T(ShapeError, a.device() == b.device(), "binary op: devices differ: ", a.desc(), " vs ",
             b.desc());
  if (a.device().is_cuda()) return cuda::binary(op, a, b);
  Tensor out = Tensor::empty(broadcast_shapes(a.shape(), b.shape()), a.dtype(), a.device());
  dispatch_float(a.dtype(), "binary op", [&]<typename T>() {
    switch (op) {
      case BinaryOp::Add: binary_loop<T>(a, b, out, [](T x, T y) { return x + y; }); break;
      case BinaryOp::Sub: binary_loop<T>(a, b, out, [](T x, T y) { return x - y; }); break;
      case BinaryOp::Mul: binary_loop<T>(a, b, out, [](T x, T y) { return x * y; }); break;
      case BinaryOp::Div: binary_loop<T>(a, b, out, [](T x, T y) { return x / y; }); break;
    }
  });
  return out;
}

Tensor affine_scalar(const Tensor& a_in, double alpha, double beta) {
  check_float("scalar op", a_in);
  if (a_in.device().is_cuda()) return cuda::affine_scalar(a_in, alpha, beta);
  Tensor a = a_in.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  dispatch_float(a.dtype(), "scalar op", [&]<typename T>() {
    const T* pa = a.template data<T>();
    T* po = out.template data<T>();
    const T al = static_cast<T>(alpha), be = static_cast<T>(beta);
    parallel_for(a.numel(), kGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) po[i] = pa[i] * al + be;
    });
  });
  return out;
}

void axpy_(Tensor& y, const Tensor& x_in, double alpha) {
  if (mixed::any_low({&y, &x_in})) return mixed::axpy_(y, x_in, alpha);
  check_same_shape("axpy_", y, x_in);
  MW_CHECK_T(ShapeError, y.is_contiguous() && y.dtype() == x_in.dtype(), "axpy_: ", y.desc(),
             " must be contiguous and of ", x_in.desc(), "'s dtype");
  if (y.device().is_cuda()) return cuda::axpy_(y, x_in, alpha);
  Tensor x = x_in.contiguous();
  y.bump_version();
  dispatch_float(y.dtype(), "axpy_", [&]<typename T>() {
    T* py = y.template data<T>();
    const T* px = x.template data<T>();
    const T al = static_cast<T>(alpha);
    parallel_for(y.numel(), kGrain, [&](int64_t s, int64_t e) {
      if (al == T(1))
        for (int64_t i = s; i < e; ++i) py[i] += px[i];
      else
        for (int64_t i = s; i < e; ++i) py[i] += al * px[i];
    });
  });
}

void scale_(Tensor& x, double alpha) {
  MW_CHECK_T(ShapeError, x.is_contiguous(), "scale_: ", x.desc(), " must be contiguous");
  if (x.device().is_cuda()) return cuda::scale_(x, alpha);
  x.bump_version();
  dispatch_float(x.dtype(), "scale_", [&]<typename T>() {
    T* p = x.template data<T>();
    const T al = static_cast<T>(alpha);
    parallel_for(x.numel(), kGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) p[i] *= al;
    });
  });
}

Tensor sum_to_shape(const Tensor& grad_in, const Shape& shape) {
  // `shape` must broadcast to grad's (an incompatible one wrote past the sums: heap corruption).
  const int64_t lead = grad_in.dim() - static_cast<int64_t>(shape.size());
  bool fits = lead >= 0;
  for (size_t d = 0; fits && d < shape.size(); ++d)
    fits = shape[d] == 1 || shape[d] == grad_in.size(lead + static_cast<int64_t>(d));
  MW_CHECK_T(ShapeError, fits, "sum_to_shape: ", grad_in.desc(), " does not reduce to ",
             shape_str(shape), " (it must broadcast to the gradient's shape)");
  if (mixed::any_low({&grad_in})) return mixed::sum_to_shape(grad_in, shape);
  if (grad_in.shape() == shape) return grad_in;
  if (grad_in.device().is_cuda()) return cuda::sum_to_shape(grad_in, shape);
  Tensor grad = grad_in.contiguous();
  Tensor out = Tensor::zeros(shape, grad.dtype(), grad.device());
  // Serial, in element order, so the result is deterministic; broadcasting in GPT-2 is small. The
  // sums are in double (Note [Reductions accumulate in double], layers.cpp).
  const Shape& gs = grad.shape();
  const Shape os = broadcast_strides(out, gs);
  const int64_t rank = static_cast<int64_t>(gs.size());
  dispatch_float(grad.dtype(), "sum_to_shape", [&]<typename T>() {
    const T* pg = grad.template data<T>();
    T* po = out.template data<T>();
    std::vector<double> acc(static_cast<size_t>(out.numel()), 0.0);
    const int64_t n = grad.numel();
    for (int64_t i = 0; i < n; ++i) {
      int64_t rem = i, off = 0;
      for (int64_t d = rank - 1; d >= 0; --d) {
        off += (rem % gs[d]) * os[d];
        rem /= gs[d];
      }
      acc[static_cast<size_t>(off)] += static_cast<double>(pg[i]);
    }
    for (size_t j = 0; j < acc.size(); ++j) po[j] = static_cast<T>(acc[j]);
  });
  return out;
}

Tensor sum_all(const Tensor& x_in) {
  check_float("sum", x_in);
  if (x_in.device().is_cuda()) return cuda::sum_all(x_in);
  Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty({}, x.dtype(), x.device());
  dispatch_float(x.dtype(), "sum", [&]<typename T>() {
    const T* p = x.template data<T>();
    auto partial = parallel_reduce_blocks<double>(x.numel(), 1 << 15, [&](int64_t s, int64_t e) {
      double acc = 0;
      for (int64_t i = s; i < e; ++i) acc += p[i];
      return acc;
    });
    double total = 0;
    for (double v : partial) total += v;
    *out.template data<T>() = static_cast<T>(total);
  });
  return out;
}

Tensor sum_dim(const Tensor& x_in, int64_t dim, bool keepdim) {
  check_float("sum", x_in);
  if (x_in.device().is_cuda()) return cuda::sum_dim(x_in, dim, keepdim);
  Tensor x = x_in.contiguous();
  dim = x.wrap_dim(dim);
  int64_t outer = 1, inner = 1, n = x.size(dim);
  for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  Shape shape = x.shape();
  if (keepdim)
    shape[dim] = 1;
  else
    shape.erase(shape.begin() + dim);
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  dispatch_float(x.dtype(), "sum", [&]<typename T>() {
    const T* p = x.template data<T>();
    T* po = out.template data<T>();
    parallel_for(outer * inner, 256, [&](int64_t s, int64_t e) {
      for (int64_t idx = s; idx < e; ++idx) {
        int64_t o = idx / inner, i = idx % inner;
        double acc = 0;  // Note [Reductions accumulate in double] (layers.cpp)
        for (int64_t k = 0; k < n; ++k) acc += static_cast<double>(p[(o * n + k) * inner + i]);
        po[idx] = static_cast<T>(acc);
      }
    });
  });
  return out;
}

Tensor expand_dim(const Tensor& g_in, const Shape& shape, int64_t dim, bool keepdim) {
  if (g_in.device().is_cuda()) return cuda::expand_dim(g_in, shape, dim, keepdim);
  Tensor g = g_in.contiguous();
  Tensor out = Tensor::empty(shape, g.dtype(), g.device());
  const int64_t rank = static_cast<int64_t>(shape.size());
  dim = dim < 0 ? dim + rank : dim;
  int64_t outer = 1, inner = 1, n = shape[dim];
  for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
  for (int64_t d = dim + 1; d < rank; ++d) inner *= shape[d];
  (void)keepdim;  // the element order of g is the same either way
  dispatch_float(g.dtype(), "expand", [&]<typename T>() {
    const T* pg = g.template data<T>();
    T* po = out.template data<T>();
    parallel_for(outer * n, 64, [&](int64_t s, int64_t e) {
      for (int64_t ok = s; ok < e; ++ok) {
        int64_t o = ok / n;
        std::copy(pg + o * inner, pg + (o + 1) * inner, po + ok * inner);
      }
    });
  });
  return out;
}

}  // namespace mw::ops
