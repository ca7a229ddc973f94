// Tests of the CUDA fused Adam (optim/adam_cuda.h) against the CPU scalar kernel. Without a CUDA
// build, or without a GPU, the comparison is skipped and only the stub's error is checked.
#include "optim/adam_cuda.h"

#include <gtest/gtest.h>

#include <vector>

#include "adam_test_util.h"
#include "core/error.h"
#include "optim/adam_cpu.h"

#ifdef MW_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace mw::optim {
namespace {

using test::AdamProblem;
using test::compare_rel;
using test::make_problem;

#ifdef MW_HAVE_CUDA

// Device copy of a host vector, freed on scope exit.
struct DeviceArray {
  void* ptr = nullptr;
  size_t bytes = 0;
  DeviceArray(const void* host, size_t nbytes) : bytes(nbytes) {
    EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(ptr); }
  void to_host(void* host) const {
    EXPECT_EQ(cudaMemcpy(host, ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }
};

TEST(AdamCuda, MatchesScalarKernel) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    GTEST_SKIP() << "no CUDA device visible";
  }
  const int64_t numel = 1000003;
  for (DType d : {DType::F32, DType::F16, DType::BF16}) {
    for (bool adamw : {true, false}) {
      SCOPED_TRACE(testing::Message() << dtype_name(d) << " adamw " << adamw);
      AdamHyper h;
      h.weight_decay = 0.01f;
      h.adamw_mode = adamw;
      AdamProblem ref = make_problem(numel, d, 256.f, 11);
      DeviceArray p(ref.param.data(), numel * 4), m(ref.exp_avg.data(), numel * 4),
          v(ref.exp_avg_sq.data(), numel * 4), g(ref.grad(), ref.grad_bytes.size());
      for (int t = 1; t <= 3; ++t) {
        const AdamStepScalars s = make_adam_step_scalars(h, t, 256.f);
        adam_update_cuda(s, static_cast<float*>(p.ptr), g.ptr, d, static_cast<float*>(m.ptr),
                         static_cast<float*>(v.ptr), numel, nullptr);
        adam_update(Isa::Scalar, s, ref.param.data(), ref.grad(), d, ref.exp_avg.data(),
                    ref.exp_avg_sq.data(), numel);
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<float> gp(numel), gm(numel), gv(numel);
      p.to_host(gp.data());
      m.to_host(gm.data());
      v.to_host(gv.data());
      // 1e-6 relative: the device runs the same adam_element() with correctly rounded div/sqrt
      // and explicit fmaf, so bitwise equality is expected; 1e-6 allows a reordered operation.
      EXPECT_EQ(compare_rel("param", gp, ref.param, 1e-6), 0);
      EXPECT_EQ(compare_rel("exp_avg", gm, ref.exp_avg, 1e-6), 0);
      EXPECT_EQ(compare_rel("exp_avg_sq", gv, ref.exp_avg_sq, 1e-6), 0);
    }
  }
}

#else

TEST(AdamCuda, MatchesScalarKernel) { GTEST_SKIP() << "built without CUDA (-DMW_CUDA=ON)"; }

TEST(AdamCuda, StubThrowsDeviceError) {
  float x = 0.f;
  const AdamStepScalars s = make_adam_step_scalars(AdamHyper{}, 1, -1.f);
  EXPECT_THROW(adam_update_cuda(s, &x, &x, DType::F32, &x, &x, 1, nullptr), DeviceError);
}

#endif

}  // namespace
}  // namespace mw::optim
