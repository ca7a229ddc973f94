// Note [cuBLAS on first use]: a CUDA build does not map libcublas (and the libcublasLt it pulls
// in, whose start-up costs ~85 ms per process) until the first matrix product on a GPU. Runs
// without a GPU: opening the library needs none.
#ifdef MW_HAVE_CUDA
#include "core/cuda/cublas_loader.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstring>

#include "core/ops.h"
#include "cuda_test_util.h"

namespace mw {
namespace {

// ctest runs each test in a process of its own, so nothing else here has touched the GPU.
TEST(CublasOnFirstUse, IsNotLoadedByCpuWorkAndResolvesEveryEntryPointWhenAsked) {
  const std::string soname = ops::cuda::cublas_library_name();
  Tensor a = Tensor::ones({8, 8});
  Tensor c = ops::matmul(a, a);  // a product on the CPU
  EXPECT_EQ(c.to_vector<float>()[0], 8.f);
  if (cuda_device_count() == 0) {  // with a GPU, another test of this binary may have used it
    EXPECT_EQ(::dlopen(soname.c_str(), RTLD_NOW | RTLD_NOLOAD), nullptr)
        << soname << " was loaded before any product on a GPU";
  }
  const ops::cuda::CublasApi& api = ops::cuda::cublas();
  EXPECT_NE(api.create, nullptr);
  EXPECT_NE(api.set_math_mode, nullptr);
  EXPECT_NE(api.gemm_ex, nullptr);
  EXPECT_NE(api.gemm_strided_batched_ex, nullptr);
  ASSERT_NE(api.status_string, nullptr);
  EXPECT_GT(std::strlen(api.status_string(CUBLAS_STATUS_NOT_INITIALIZED)), 0u);  // callable
  void* handle = ::dlopen(soname.c_str(), RTLD_NOW | RTLD_NOLOAD);
  EXPECT_NE(handle, nullptr) << soname << " is not loaded after cublas()";
  if (handle) ::dlclose(handle);
}

}  // namespace
}  // namespace mw
#endif
