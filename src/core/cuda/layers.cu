// CUDA kernels of the per-row layers: embedding (+ deterministic scatter-add backward), layernorm,
// GELU (tanh form), softmax, dropout, and the column sums behind dbias/dweight.
//
// Per-row ops give one block to a row and reduce with block_reduce (fixed order). Sums across rows
// (layernorm's dweight/dbias, linear's dbias) go through column_sum: chunks of 64 rows summed in
// order, then the chunks summed in order; no atomics anywhere, so every result is deterministic.
// Dropout draws from the same random_uniform() as the CPU (random.h), so masks are bitwise equal.
#include "core/cuda/common.cuh"

namespace mw::ops::cuda_kernels {
namespace {

constexpr int kRowThreads = 256;
constexpr int64_t kChunkRows = 64;

template <typename T>
__global__ void embedding_kernel(const T* table, const int64_t* rows, int64_t n_rows, int64_t C,
                                 T* out) {
  MW_GRID_STRIDE(i, n_rows * C) out[i] = table[rows[i / C] * C + i % C];
}

template <typename T>
__global__ void embedding_backward_kernel(const T* dout, const int64_t* uniq, const int64_t* starts,
                                          const int64_t* order, int64_t n_uniq, int64_t C,
                                          T* dtable) {
  MW_GRID_STRIDE(idx, n_uniq * C) {
    const int64_t u = idx / C, c = idx % C;
    T* g = dtable + uniq[u] * C + c;
    T acc = *g;
    for (int64_t k = starts[u]; k < starts[u + 1]; ++k) acc += dout[order[k] * C + c];
    *g = acc;
  }
}

template <typename T>
__global__ void layernorm_kernel(const T* x, const T* w, const T* b, int64_t N, int64_t C, T eps,
                                 T* out, T* mean, T* rstd) {
  __shared__ T shared[32];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const T* row = x + r * C;
    T s = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += row[c];
    const T m = block_reduce<T>(s, shared) / static_cast<T>(C);
    T v = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) v += (row[c] - m) * (row[c] - m);
    v = block_reduce<T>(v, shared) / static_cast<T>(C);
    const T rs = T(1) / dev_sqrt(v + eps);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      out[r * C + c] = (row[c] - m) * rs * w[c] + b[c];
    if (threadIdx.x == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
  }
}

// dx per row, and dout * norm into `dnorm_out` [N, C] for the dweight column sum.
template <typename T>
__global__ void layernorm_backward_kernel(const T* dout, const T* x, const T* w, const T* mean,
                                          const T* rstd, int64_t N, int64_t C, T* dx,
                                          T* dnorm_out) {
  __shared__ T shared[32];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const T* d = dout + r * C;
    const T* row = x + r * C;
    const T m = mean[r], rs = rstd[r];
    T a = 0, bsum = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const T norm = (row[c] - m) * rs;
      const T dn = w[c] * d[c];
      a += dn;
      bsum += dn * norm;
      dnorm_out[r * C + c] = d[c] * norm;
    }
    const T dnorm_mean = block_reduce<T>(a, shared) / static_cast<T>(C);
    const T dnorm_norm_mean = block_reduce<T>(bsum, shared) / static_cast<T>(C);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const T norm = (row[c] - m) * rs;
      dx[r * C + c] = (w[c] * d[c] - dnorm_mean - norm * dnorm_norm_mean) * rs;
    }
  }
}

template <typename T>
__global__ void column_chunk_kernel(const T* x, int64_t R, int64_t C, T* partial) {
  const int64_t chunks = (R + kChunkRows - 1) / kChunkRows;
  MW_GRID_STRIDE(idx, chunks * C) {
    const int64_t k = idx / C, c = idx % C;
    const int64_t end = (k + 1) * kChunkRows < R ? (k + 1) * kChunkRows : R;
    T acc = 0;
    for (int64_t r = k * kChunkRows; r < end; ++r) acc += x[r * C + c];
    partial[idx] = acc;
  }
}

template <typename T>
__global__ void column_total_kernel(const T* partial, int64_t chunks, int64_t C, T* out) {
  MW_GRID_STRIDE(c, C) {
    T acc = 0;
    for (int64_t k = 0; k < chunks; ++k) acc += partial[k * C + c];
    out[c] = acc;
  }
}

template <typename T>
__global__ void broadcast_rows_kernel(const T* bias, int64_t R, int64_t N, T* out) {
  MW_GRID_STRIDE(i, R * N) out[i] = bias[i % N];
}

constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2/pi), as the CPU kernel

template <typename T>
__global__ void gelu_kernel(const T* x, T* out, int64_t n) {
  const T s = static_cast<T>(kGeluScale), k = static_cast<T>(0.044715);
  MW_GRID_STRIDE(i, n) {
    const T v = x[i];
    out[i] = T(0.5) * v * (T(1) + dev_tanh(s * (v + k * v * v * v)));
  }
}

template <typename T>
__global__ void gelu_backward_kernel(const T* dout, const T* x, T* dx, int64_t n) {
  const T s = static_cast<T>(kGeluScale), k = static_cast<T>(0.044715);
  MW_GRID_STRIDE(i, n) {
    const T v = x[i];
    const T t = dev_tanh(s * (v + k * v * v * v));
    const T sech2 = T(1) - t * t;
    const T local = T(0.5) * (T(1) + t) + T(0.5) * v * sech2 * s * (T(1) + T(3) * k * v * v);
    dx[i] = local * dout[i];
  }
}

template <typename T>
__global__ void softmax_kernel(const T* x, T* out, int64_t N, int64_t C) {
  __shared__ T shared[32];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const T* row = x + r * C;
    T* o = out + r * C;
    T mx = row[0];
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) mx = row[c] > mx ? row[c] : mx;
    mx = block_reduce<T, true>(mx, shared);
    T s = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += (o[c] = dev_exp(row[c] - mx));
    const T inv = T(1) / block_reduce<T>(s, shared);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] *= inv;
  }
}

template <typename T>
__global__ void softmax_backward_kernel(const T* dout, const T* y, T* dx, int64_t N, int64_t C) {
  __shared__ T shared[32];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const T* yr = y + r * C;
    const T* dr = dout + r * C;
    T dot = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += yr[c] * dr[c];
    dot = block_reduce<T>(dot, shared);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dx[r * C + c] = yr[c] * (dr[c] - dot);
  }
}

template <typename T>
__global__ void dropout_kernel(const T* x, T* out, int64_t n, double p, RngState rng, T scale) {
  MW_GRID_STRIDE(i, n) {
    out[i] = random_uniform(rng, static_cast<uint64_t>(i)) >= p ? x[i] * scale : T(0);
  }
}

}  // namespace

int64_t column_sum_scratch_numel(int64_t R, int64_t C) {
  return std::max<int64_t>(1, (R + kChunkRows - 1) / kChunkRows * C);
}

int64_t layernorm_backward_scratch_numel(int64_t N, int64_t C) {
  return N * C + column_sum_scratch_numel(N, C);
}

template <typename T>
void column_sum(const T* x, int64_t R, int64_t C, T* out, T* scratch) {
  if (C == 0) return;
  const int64_t chunks = (R + kChunkRows - 1) / kChunkRows;
  if (chunks > 0) {
    column_chunk_kernel<T><<<grid_for(chunks * C), kThreads>>>(x, R, C, scratch);
    check_kernel_launch("column sum (chunks)");
  }
  column_total_kernel<T><<<grid_for(C), kThreads>>>(scratch, chunks, C, out);
  check_kernel_launch("column sum (total)");
}

template <typename T>
void broadcast_rows(const T* bias, int64_t R, int64_t N, T* out) {
  if (R * N == 0) return;
  broadcast_rows_kernel<T><<<grid_for(R * N), kThreads>>>(bias, R, N, out);
  check_kernel_launch("linear (bias rows)");
}

template <typename T>
void embedding(const T* table, const int64_t* rows, int64_t n_rows, int64_t C, T* out) {
  if (n_rows * C == 0) return;
  embedding_kernel<T><<<grid_for(n_rows * C), kThreads>>>(table, rows, n_rows, C, out);
  check_kernel_launch("embedding");
}

template <typename T>
void embedding_backward(const T* dout, const int64_t* uniq, const int64_t* starts,
                        const int64_t* order, int64_t n_uniq, int64_t C, T* dtable) {
  if (n_uniq * C == 0) return;
  embedding_backward_kernel<T>
      <<<grid_for(n_uniq * C), kThreads>>>(dout, uniq, starts, order, n_uniq, C, dtable);
  check_kernel_launch("embedding_backward");
}

template <typename T>
void layernorm(const T* x, const T* w, const T* b, int64_t N, int64_t C, double eps, T* out,
               T* mean, T* rstd) {
  if (N == 0) return;
  layernorm_kernel<T>
      <<<row_grid(N), kRowThreads>>>(x, w, b, N, C, static_cast<T>(eps), out, mean, rstd);
  check_kernel_launch("layernorm");
}

template <typename T>
void layernorm_backward(const T* dout, const T* x, const T* w, const T* mean, const T* rstd,
                        int64_t N, int64_t C, T* dx, T* dweight, T* dbias, T* scratch) {
  T* dnorm = scratch;
  T* sums = scratch + N * C;
  if (N > 0) {
    layernorm_backward_kernel<T>
        <<<row_grid(N), kRowThreads>>>(dout, x, w, mean, rstd, N, C, dx, dnorm);
    check_kernel_launch("layernorm_backward");
  }
  column_sum<T>(dnorm, N, C, dweight, sums);
  column_sum<T>(dout, N, C, dbias, sums);
}

template <typename T>
void gelu(const T* x, T* out, int64_t n) {
  if (n == 0) return;
  gelu_kernel<T><<<grid_for(n), kThreads>>>(x, out, n);
  check_kernel_launch("gelu");
}

template <typename T>
void gelu_backward(const T* dout, const T* x, T* dx, int64_t n) {
  if (n == 0) return;
  gelu_backward_kernel<T><<<grid_for(n), kThreads>>>(dout, x, dx, n);
  check_kernel_launch("gelu_backward");
}

template <typename T>
void softmax(const T* x, T* out, int64_t N, int64_t C) {
  if (N * C == 0) return;
  softmax_kernel<T><<<row_grid(N), kRowThreads>>>(x, out, N, C);
  check_kernel_launch("softmax");
}

template <typename T>
void softmax_backward(const T* dout, const T* y, T* dx, int64_t N, int64_t C) {
  if (N * C == 0) return;
  softmax_backward_kernel<T><<<row_grid(N), kRowThreads>>>(dout, y, dx, N, C);
  check_kernel_launch("softmax_backward");
}

template <typename T>
void dropout(const T* x, T* out, int64_t n, double p, RngState rng) {
  if (n == 0) return;
  dropout_kernel<T><<<grid_for(n), kThreads>>>(x, out, n, p, rng, static_cast<T>(1.0 / (1.0 - p)));
  check_kernel_launch("dropout");
}

#define MW_INSTANTIATE(T)                                                                         \
  template void column_sum<T>(const T*, int64_t, int64_t, T*, T*);                                \
  template void broadcast_rows<T>(const T*, int64_t, int64_t, T*);                                \
  template void embedding<T>(const T*, const int64_t*, int64_t, int64_t, T*);                     \
  template void embedding_backward<T>(const T*, const int64_t*, const int64_t*, const int64_t*,   \
                                      int64_t, int64_t, T*);                                      \
  template void layernorm<T>(const T*, const T*, const T*, int64_t, int64_t, double, T*, T*, T*); \
  template void layernorm_backward<T>(const T*, const T*, const T*, const T*, const T*, int64_t,  \
                                      int64_t, T*, T*, T*, T*);                                   \
  template void gelu<T>(const T*, T*, int64_t);                                                   \
  template void gelu_backward<T>(const T*, const T*, T*, int64_t);                                \
  template void softmax<T>(const T*, T*, int64_t, int64_t);                                       \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t);                    \
  template void dropout<T>(const T*, T*, int64_t, double, RngState);
MW_INSTANTIATE(float)
MW_INSTANTIATE(double)
#undef MW_INSTANTIATE

}  // namespace mw::ops::cuda_kernels
