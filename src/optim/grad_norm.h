// The global gradient norm's arithmetic, shared by the Trainer (every parameter's .grad) and
// Gemini (gradients inside chunk buffers, possibly on disk), so both sum in one order.
//
// Note [Norm order]: the squared L2 norm is summed in double over fixed blocks of kNormBlock
// elements of each parameter (a block never spans two parameters), the blocks reduced in parallel
// and their partials added in block order, then the parameters in parameter order. The result
// depends only on the gradients and the parameter order, never on the thread count or on where
// a gradient lives, so a run whose gradients sit in chunks gives the plain run's norm bit for bit.
//
// Inside a block the order is that of a GPU warp, so a CUDA gradient is reduced where it lives and
// only its partials (8 bytes per 256 KiB) cross to the host, bit for bit the CPU's: lane l of
// kNormLanes sums the squares of elements l, l + kNormLanes, ... in order, then the lanes are added
// in lane order. A float's square is exact in double, so nvcc's FMA contraction of the lane sums
// rounds as the CPU's separate multiply and add. (Copying every CUDA gradient to the host for the
// norm cost GPT-2 small 474 MiB of device->host traffic and ~80 ms per fp16 step on an H200.)
#pragma once

#include <cstdint>
#include <vector>

namespace mw {
class Tensor;  // core/tensor.h (not included: nvcc compiles this header for the kernel)
}

namespace mw::optim {

constexpr int64_t kNormBlock = int64_t{1} << 16;
constexpr int kNormLanes = 32;

// Appends the sum of squares (in double) of each kNormBlock block of x[0, n) to `partials`.
void append_block_squares(const float* x, int64_t n, std::vector<double>& partials);
// The same for a contiguous f32 tensor on any device: a CUDA one is reduced on its device.
void append_block_squares(const Tensor& x, std::vector<double>& partials);
// The same for a parameter's gradient (contiguous, on its device); nothing when it has none.
void append_grad_block_squares(const Tensor& param, std::vector<double>& partials);
// The kernel behind it: partials[b] (device memory, ceil(n / kNormBlock) doubles) for x[0, n) on
// the device, enqueued on `stream` (a cudaStream_t as void*; nullptr = the compute stream).
// Throws DeviceError in a build without CUDA (optim/nocuda).
void block_squares_cuda(const float* x, int64_t n, double* partials, void* stream);

// Adds partials to sum in order (Note [Norm order]).
double add_in_order(double sum, const std::vector<double>& partials);

// The global L2 norm of the parameters' gradients, in double, over fixed blocks combined in order
// (bitwise reproducible; Note [Deterministic parallelism]). Parameters without a gradient count 0.
double global_grad_norm(const std::vector<Tensor>& params);

}  // namespace mw::optim
