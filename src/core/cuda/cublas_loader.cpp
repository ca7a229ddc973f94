// Note [cuBLAS on first use]: linking libcublas makes the dynamic loader run its static
// initialisers, and those of the libcublasLt it pulls in (541 MB), in every process at start:
// about 85 ms of CPU on this project's machines, for `gpt2_train --help`, a CPU run, and each of
// the thousand short runs the option tests spawn, none of which touch a GPU. So memwall links
// only the CUDA runtime (about 4 ms) and opens cuBLAS with dlopen on the first matrix product on
// a CUDA device. The soname comes from the headers the build used (libcublas.so.MAJOR), found
// through the executable's RUNPATH and the usual search path, then the path CMake found at build
// time.
#include "core/cuda/cublas_loader.h"

#include <dlfcn.h>

#include "core/error.h"

namespace mw::ops::cuda {

namespace {

void* open_cublas() {
  const std::string soname = cublas_library_name();
  if (void* h = ::dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  const std::string first_error = ::dlerror();
#ifdef MW_CUBLAS_LIBRARY
  if (void* h = ::dlopen(MW_CUBLAS_LIBRARY, RTLD_NOW | RTLD_LOCAL)) return h;
  const std::string second = str("; '", MW_CUBLAS_LIBRARY, "': ", ::dlerror());
#else
  const std::string second;
#endif
  throw DeviceError(str("cannot load cuBLAS for a matrix product on the GPU: '", soname,
                        "': ", first_error, second,
                        "; install the CUDA toolkit's cuBLAS (the build used version ",
                        CUBLAS_VER_MAJOR, ") or put its lib64 on LD_LIBRARY_PATH"));
}

template <typename F>
void resolve(void* lib, const char* symbol, F& fn) {
  fn = reinterpret_cast<F>(::dlsym(lib, symbol));
  MW_CHECK_T(DeviceError, fn != nullptr, "cuBLAS ('", cublas_library_name(), "') has no ", symbol,
             ": ", ::dlerror(), "; install the cuBLAS of CUDA ", CUBLAS_VER_MAJOR,
             " that memwall was built with");
}

// The written-out pointer types name the overloads memwall means (a mismatch does not compile).
[[maybe_unused]] constexpr GemmExFn kGemmExOverload = &cublasGemmEx;
[[maybe_unused]] constexpr GemmStridedBatchedExFn kGemmStridedBatchedExOverload =
    &cublasGemmStridedBatchedEx;

CublasApi load() {
  void* lib = open_cublas();
  CublasApi api;
  // The _v2 names are what cublas_v2.h's macros call.
  resolve(lib, "cublasCreate_v2", api.create);
  resolve(lib, "cublasSetMathMode", api.set_math_mode);
  resolve(lib, "cublasGemmEx", api.gemm_ex);
  resolve(lib, "cublasGemmStridedBatchedEx", api.gemm_strided_batched_ex);
  resolve(lib, "cublasGetStatusString", api.status_string);
  return api;  // the library stays open for the process
}

}  // namespace

std::string cublas_library_name() { return str("libcublas.so.", CUBLAS_VER_MAJOR); }

const CublasApi& cublas() {
  static const CublasApi api = load();  // a failed load throws, and the next call tries again
  return api;
}

}  // namespace mw::ops::cuda
