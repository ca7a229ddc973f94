// Built when CUDA is absent: asking for a cuda device gives a clear error instead of a link
// failure.
#include "core/allocator.h"
#include "core/error.h"

namespace mw {
Allocator* cuda_allocator(int index) {
  throw DeviceError(
      str("cuda:", index,
          " requested, but memwall was built without CUDA (nvcc not found at configure "
          "time); use --device cpu or sim, or rebuild on a machine with the CUDA toolkit"));
}
}  // namespace mw

namespace mw {
void cuda_copy_bytes(void*, Device dst_device, const void*, Device src_device, int64_t) {
  throw DeviceError(str("copy between ", src_device.str(), " and ", dst_device.str(),
                        " needs the CUDA backend, but memwall was built without CUDA"));
}
}  // namespace mw
