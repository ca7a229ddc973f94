// core/cuda_stream.h for builds without CUDA: cuda_device_count() is 0, and creating a stream, an
// event or pinned memory throws DeviceError saying how to get a CUDA build. Nothing else here can
// be reached, because no CudaStream or CudaEvent object can exist.
#include "core/cuda_stream.h"
#include "core/error.h"

namespace mw {

namespace {
[[noreturn]] void built_without_cuda(const char* what) {
  throw DeviceError(str(what,
                        " needs the CUDA backend, but memwall was built without CUDA (nvcc not "
                        "found at configure time, or -DMW_CUDA=OFF); use --device cpu or sim, or "
                        "rebuild with the CUDA toolkit installed"));
}
}  // namespace

int cuda_device_count() { return 0; }

CudaStream CudaStream::create(int) { built_without_cuda("CudaStream::create (a copy stream)"); }
CudaStream CudaStream::borrow(int, void*) { built_without_cuda("CudaStream::borrow"); }
CudaStream::~CudaStream() = default;
CudaStream::CudaStream(CudaStream&&) noexcept = default;
CudaStream& CudaStream::operator=(CudaStream&&) noexcept = default;
void CudaStream::wait(const CudaEvent&) const { built_without_cuda("CudaStream::wait"); }
void CudaStream::copy_async(void*, const void*, int64_t) const {
  built_without_cuda("CudaStream::copy_async");
}
void CudaStream::synchronize() const { built_without_cuda("CudaStream::synchronize"); }

CudaEvent::CudaEvent(int device_index) : device_index_(device_index) {
  built_without_cuda("CudaEvent (a CUDA event)");
}
CudaEvent::~CudaEvent() = default;
CudaEvent::CudaEvent(CudaEvent&&) noexcept = default;
CudaEvent& CudaEvent::operator=(CudaEvent&&) noexcept = default;
void CudaEvent::record(const CudaStream&) { built_without_cuda("CudaEvent::record"); }
bool CudaEvent::query() const { built_without_cuda("CudaEvent::query"); }
void CudaEvent::synchronize() const { built_without_cuda("CudaEvent::synchronize"); }

Allocator& pinned_host_allocator() { built_without_cuda("pinned host memory (cudaHostAlloc)"); }

}  // namespace mw
