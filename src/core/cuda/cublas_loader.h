// cuBLAS, loaded on first use (Note [cuBLAS on first use]).
#pragma once

#include <cublas_v2.h>

#include <string>

namespace mw::ops::cuda {

// The cuBLAS entry points memwall calls, resolved from the library with dlsym.
struct CublasApi {
  decltype(&cublasCreate) create = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSgemm) sgemm = nullptr;
  decltype(&cublasDgemm) dgemm = nullptr;
  decltype(&cublasSgemmStridedBatched) sgemm_strided_batched = nullptr;
  decltype(&cublasDgemmStridedBatched) dgemm_strided_batched = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// Loads libcublas on the first call (thread-safe) and returns its entry points; DeviceError naming
// the library and dlerror() when it cannot be loaded or lacks a symbol.
const CublasApi& cublas();

// The library's path as dlopen was asked for it (for messages and tests).
std::string cublas_library_name();

}  // namespace mw::ops::cuda
