// Helpers of the CUDA-vs-CPU tests: skipping without a GPU, random inputs, and comparisons with
// a tolerance stated by each caller.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/cuda_stream.h"
#include "core/random.h"
#include "core/tensor.h"

namespace mw::test {

#define MW_SKIP_WITHOUT_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible (or a build without CUDA)"

inline Device gpu() { return Device::cuda(0); }

// Normal(0, stddev) values from the counter-based generator, on the CPU.
inline Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype = DType::F32,
                            double stddev = 1.0) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  fill_normal(v.data(), 0, v.size(), RngState{seed, 0}, stddev);
  return Tensor::from_vector(v, shape).to(dtype);
}

// Largest |a - e| / (atol + rtol |e|) over the elements; <= 1 passes. Reports the first offenders.
inline double worst_ratio(const std::string& what, const Tensor& actual, const Tensor& expected,
                          double atol, double rtol) {
  EXPECT_EQ(actual.shape(), expected.shape()) << what;
  auto a = actual.to_vector<double>(), e = expected.to_vector<double>();
  EXPECT_EQ(a.size(), e.size()) << what;
  double worst = 0;
  int shown = 0;
  for (size_t i = 0; i < std::min(a.size(), e.size()); ++i) {
    const double r = std::abs(a[i] - e[i]) / (atol + rtol * std::abs(e[i]));
    if (!(r <= 1) && shown++ < 3)
      ADD_FAILURE() << what << "[" << i << "]: cuda " << a[i] << ", cpu " << e[i];
    if (!(r <= worst)) worst = r;  // NaN counts as worst
  }
  return worst;
}

#define MW_EXPECT_CLOSE(what, actual, expected, atol, rtol) \
  EXPECT_LE(::mw::test::worst_ratio(what, actual, expected, atol, rtol), 1.0)

// Bitwise equality of two tensors' bytes (after moving both to the CPU).
inline void expect_bitwise_equal(const std::string& what, const Tensor& actual,
                                 const Tensor& expected) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  ASSERT_EQ(actual.dtype(), expected.dtype()) << what;
  Tensor a = actual.to(Device::cpu()).contiguous(), e = expected.to(Device::cpu()).contiguous();
  const auto* pa = static_cast<const unsigned char*>(a.raw_data());
  const auto* pe = static_cast<const unsigned char*>(e.raw_data());
  EXPECT_TRUE(std::equal(pa, pa + a.nbytes(), pe)) << what << ": bytes differ";
}

}  // namespace mw::test
