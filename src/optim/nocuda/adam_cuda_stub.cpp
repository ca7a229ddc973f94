// adam_update_cuda() for builds without CUDA: always throws DeviceError (optim/adam_cuda.h).
#include "core/error.h"
#include "optim/adam_cuda.h"

namespace mw::optim {

void adam_update_cuda(const AdamStepScalars&, float*, const void*, DType, float*, float*, int64_t,
                      void*) {
  throw DeviceError(
      "adam_update_cuda: memwall was built without CUDA; reconfigure with -DMW_CUDA=ON on a "
      "machine "
      "with nvcc, or run the CPU Adam (adam_update_parallel)");
}

}  // namespace mw::optim
