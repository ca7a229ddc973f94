// The fused shifted cross-entropy on CUDA (the CPU's cross_entropy.cpp): one block per row of
// logits computes the row's max and sum of exponentials with block_reduce (fixed order), writes
// the log-sum-exp and the row loss; one more block sums the row losses in double, in a fixed
// order, and divides by the row count. Backward gives one block to each row of logits.
#include "core/cuda/common.cuh"

namespace mw::ops::cuda_kernels {
namespace {

constexpr int kRowThreads = 256;

template <typename T>
__global__ void ce_rows_kernel(const T* logits, const int64_t* targets, int64_t B, int64_t T_len,
                               int64_t V, T* lse, T* row_loss) {
  __shared__ T shared[32];
  const int64_t rows = B * (T_len - 1);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t b = r / (T_len - 1), t = r % (T_len - 1);
    const T* row = logits + (b * T_len + t) * V;
    T mx = row[0];
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = row[j] > mx ? row[j] : mx;
    mx = block_reduce<T, true>(mx, shared);
    T s = 0;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) s += dev_exp(row[j] - mx);
    s = block_reduce<T>(s, shared);
    if (threadIdx.x == 0) {
      const T l = mx + dev_log(s);
      lse[r] = l;
      row_loss[r] = l - row[targets[b * T_len + t + 1]];
    }
  }
}

template <typename T>
__global__ void ce_mean_kernel(const T* row_loss, int64_t rows, T* loss) {
  __shared__ double shared[32];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) acc += static_cast<double>(row_loss[i]);
  acc = block_reduce<double>(acc, shared);
  if (threadIdx.x == 0) loss[0] = static_cast<T>(acc / static_cast<double>(rows));
}

template <typename T>
__global__ void ce_backward_kernel(const T* logits, const T* lse, const int64_t* targets, int64_t B,
                                   int64_t T_len, int64_t V, T scale, T* dlogits) {
  for (int64_t r = blockIdx.x; r < B * T_len; r += gridDim.x) {
    const int64_t b = r / T_len, t = r % T_len;
    T* d = dlogits + r * V;
    if (t == T_len - 1) {
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) d[j] = T(0);
      continue;
    }
    const T* row = logits + r * V;
    const T l = lse[b * (T_len - 1) + t];
    const int64_t target = targets[r + 1];
    // Each element is read and written by the same thread, so dlogits may alias logits.
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      const T g = dev_exp(row[j] - l) * scale;
      d[j] = j == target ? g - scale : g;
    }
  }
}

}  // namespace

template <typename T>
void cross_entropy_forward(const T* logits, const int64_t* targets, int64_t B, int64_t T_len,
                           int64_t V, T* lse, T* row_loss, T* loss) {
  const int64_t rows = B * (T_len - 1);
  if (rows > 0) {
    ce_rows_kernel<T><<<row_grid(rows), kRowThreads>>>(logits, targets, B, T_len, V, lse, row_loss);
    check_kernel_launch("cross-entropy (rows)");
  }
  ce_mean_kernel<T><<<1, 1024>>>(row_loss, rows, loss);
  check_kernel_launch("cross-entropy (mean)");
}

template <typename T>
void cross_entropy_backward(const T* logits, const T* lse, const int64_t* targets, int64_t B,
                            int64_t T_len, int64_t V, double scale, T* dlogits) {
  if (B * T_len == 0) return;
  ce_backward_kernel<T><<<row_grid(B * T_len), kRowThreads>>>(logits, lse, targets, B, T_len, V,
                                                              static_cast<T>(scale), dlogits);
  check_kernel_launch("cross-entropy backward");
}

template void cross_entropy_forward<float>(const float*, const int64_t*, int64_t, int64_t, int64_t,
                                           float*, float*, float*);
template void cross_entropy_forward<double>(const double*, const int64_t*, int64_t, int64_t,
                                            int64_t, double*, double*, double*);
template void cross_entropy_backward<float>(const float*, const float*, const int64_t*, int64_t,
                                            int64_t, int64_t, double, float*);
template void cross_entropy_backward<double>(const double*, const double*, const int64_t*, int64_t,
                                             int64_t, int64_t, double, double*);

}  // namespace mw::ops::cuda_kernels
