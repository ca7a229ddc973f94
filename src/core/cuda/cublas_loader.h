// cuBLAS, loaded on first use (Note [cuBLAS on first use]).
#pragma once

#include <cublas_v2.h>

#include <string>

namespace mw::ops::cuda {

// cublasGemmEx and cublasGemmStridedBatchedEx are overloaded in C++ (cublas_api.h adds inline
// wrappers taking the old cudaDataType compute type), so their pointer types are written out.
using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void*, cudaDataType, int, const void*,
                                    cudaDataType, int, const void*, void*, cudaDataType, int,
                                    cublasComputeType_t, cublasGemmAlgo_t);
using GemmStridedBatchedExFn = cublasStatus_t (*)(
    cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*,
    cudaDataType, int, long long int, const void*, cudaDataType, int, long long int, const void*,
    void*, cudaDataType, int, long long int, int, cublasComputeType_t, cublasGemmAlgo_t);

// The cuBLAS entry points memwall calls, resolved from the library with dlsym.
struct CublasApi {
  decltype(&cublasCreate) create = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  GemmExFn gemm_ex = nullptr;
  GemmStridedBatchedExFn gemm_strided_batched_ex = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// Loads libcublas on the first call (thread-safe) and returns its entry points; DeviceError naming
// the library and dlerror() when it cannot be loaded or lacks a symbol.
const CublasApi& cublas();

// The library's path as dlopen was asked for it (for messages and tests).
std::string cublas_library_name();

}  // namespace mw::ops::cuda
