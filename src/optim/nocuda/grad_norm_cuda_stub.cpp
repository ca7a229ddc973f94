// block_squares_cuda() for builds without CUDA: always throws DeviceError (optim/grad_norm.h).
#include "core/error.h"
#include "optim/grad_norm.h"

namespace mw::optim {

void block_squares_cuda(const float*, int64_t, double*, void*) {
  throw DeviceError(
      "block_squares_cuda: memwall was built without CUDA; reconfigure with -DMW_CUDA=ON on a "
      "machine with nvcc");
}

}  // namespace mw::optim
