// Each CUDA op (core/ops_cuda.h, reached through ops.h's dispatch) against the CPU op on random
// inputs, in f32 and, where the algorithm differs from the CPU's (attention), in f64 too. Every
// test skips without a visible GPU; StubOrWrongDeviceIsAClearError runs everywhere.
#include "core/ops.h"

#include <gtest/gtest.h>

#include "core/ops_cuda.h"
#include "cuda_test_util.h"

namespace mw {
namespace {

using test::expect_bitwise_equal;
using test::gpu;
using test::random_tensor;

// f32 tolerances. A single mul+add may be one FMA on the GPU and two roundings on the CPU: 1 ulp
// of values of size ~4 is 5e-7. Sums of n terms of size ~1 in another order differ by ~n * 6e-8.
constexpr double kFmaAtol = 1e-6, kFmaRtol = 1e-6;
constexpr double kSumAtol = 2e-5, kSumRtol = 1e-5;  // sums of up to ~300 terms

TEST(CudaOps, StubOrWrongDeviceIsAClearError) {
  // Without CUDA the stub names the op; with CUDA the wrapper rejects a CPU tensor naming it.
  Tensor x = Tensor::ones({4});
  try {
    ops::cuda::gelu(x);
    ADD_FAILURE() << "expected DeviceError";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("gelu"), std::string::npos) << e.what();
  }
}

TEST(CudaOps, CopiesFillsAndLayouts) {
  MW_SKIP_WITHOUT_GPU();
  Tensor a = random_tensor({3, 5, 7}, 1);
  Tensor d = a.to(gpu());
  expect_bitwise_equal("round trip", d.to(Device::cpu()), a);
  // A transposed view made contiguous on the device, and copied back into a strided host view.
  expect_bitwise_equal("contiguous", d.transpose(0, 2).contiguous(),
                       a.transpose(0, 2).contiguous());
  Tensor host = Tensor::zeros({7, 5, 3});
  host.transpose(0, 2).copy_(d);
  expect_bitwise_equal("copy_ into strided host", host.transpose(0, 2).contiguous(), a);
  // dtype conversion on the device (f32 -> f64 is exact) and from a host view into the device.
  expect_bitwise_equal("to(f64)", d.to(DType::F64), a.to(DType::F64));
  Tensor dd = Tensor::empty({7, 5, 3}, DType::F32, gpu());
  dd.copy_(a.transpose(0, 2));
  expect_bitwise_equal("copy_ host view -> device", dd, a.transpose(0, 2).contiguous());
  // fill_ of a narrowed (strided) view touches only that view.
  Tensor f = Tensor::zeros({4, 6}, DType::F32, gpu());
  f.narrow(1, 2, 3).fill_(2.5);
  Tensor fh = Tensor::zeros({4, 6});
  fh.narrow(1, 2, 3).fill_(2.5);
  expect_bitwise_equal("fill_ view", f, fh);
  // Rows of narrowed matrices (one pitched copy) both ways, and a single row.
  Tensor wide = random_tensor({5, 11}, 3), wd = wide.to(gpu());
  expect_bitwise_equal("narrowed columns made contiguous", wd.narrow(1, 2, 7).contiguous(),
                       wide.narrow(1, 2, 7).contiguous());
  Tensor into = Tensor::zeros({5, 11}, DType::F32, gpu()), into_h = Tensor::zeros({5, 11});
  Tensor into_view = into.narrow(1, 1, 7), into_h_view = into_h.narrow(1, 1, 7);
  into_view.copy_(wd.narrow(1, 3, 7));
  into_h_view.copy_(wide.narrow(1, 3, 7));
  expect_bitwise_equal("into narrowed columns", into, into_h);
  expect_bitwise_equal("one narrowed row", wd.narrow(0, 2, 1).narrow(1, 4, 6).contiguous(),
                       wide.narrow(0, 2, 1).narrow(1, 4, 6).contiguous());
  EXPECT_EQ(Tensor::full({2}, 7.0, DType::I64, gpu()).to_vector<int64_t>(),
            (std::vector<int64_t>{7, 7}));
}

TEST(CudaOps, BinaryWithBroadcastingIsBitwiseEqual) {
  MW_SKIP_WITHOUT_GPU();
  // One correctly rounded operation per element on both devices: bitwise equal.
  Tensor a = random_tensor({2, 3, 4}, 2), b = random_tensor({3, 1}, 3), c = random_tensor({4}, 4);
  Tensor at = random_tensor({4, 3, 2}, 5).transpose(0, 2);  // non-contiguous operand
  for (auto op : {ops::BinaryOp::Add, ops::BinaryOp::Sub, ops::BinaryOp::Mul, ops::BinaryOp::Div}) {
    SCOPED_TRACE(static_cast<int>(op));
    expect_bitwise_equal("a op b", ops::binary(op, a.to(gpu()), b.to(gpu())),
                         ops::binary(op, a, b));
    expect_bitwise_equal("c op a", ops::binary(op, c.to(gpu()), a.to(gpu())),
                         ops::binary(op, c, a));
    expect_bitwise_equal("at op a",
                         ops::binary(op, at.to(gpu()).transpose(0, 2).transpose(0, 2), a.to(gpu())),
                         ops::binary(op, at, a));
  }
  Tensor atd = random_tensor({4, 3, 2}, 5).to(gpu()).transpose(0, 2);  // strided on the device
  expect_bitwise_equal("strided device operand", ops::binary(ops::BinaryOp::Add, atd, a.to(gpu())),
                       ops::binary(ops::BinaryOp::Add, at, a));
}

TEST(CudaOps, AffineAxpyAndReductions) {
  MW_SKIP_WITHOUT_GPU();
  Tensor a = random_tensor({5, 6, 7}, 6), x = random_tensor({5, 6, 7}, 7);
  MW_EXPECT_CLOSE("affine", ops::affine_scalar(a.to(gpu()), 1.7, -0.3),
                  ops::affine_scalar(a, 1.7, -0.3), kFmaAtol, kFmaRtol);
  Tensor y = a.clone(), yd = a.to(gpu());
  ops::axpy_(y, x, 0.5);
  ops::axpy_(yd, x.to(gpu()), 0.5);
  MW_EXPECT_CLOSE("axpy_", yd, y, kFmaAtol, kFmaRtol);
  // scale_ in place: one rounded product per element on both devices, so bitwise equal (the
  // data-parallel buckets and Gemini's gradient chunks are scaled to the mean by it).
  Tensor s = a.clone(), sd = a.to(gpu());
  ops::scale_(s, 1.0 / 3.0);
  ops::scale_(sd, 1.0 / 3.0);
  expect_bitwise_equal("scale_", sd, s);
  // sum_to_shape adds in element order on both devices, in the same precision: bitwise equal.
  expect_bitwise_equal("sum_to_shape [6,1]", ops::sum_to_shape(a.to(gpu()), {6, 1}),
                       ops::sum_to_shape(a, {6, 1}));
  expect_bitwise_equal("sum_to_shape [7]", ops::sum_to_shape(a.to(gpu()), {7}),
                       ops::sum_to_shape(a, {7}));
  expect_bitwise_equal("sum_to_shape [5,1,7]", ops::sum_to_shape(a.to(gpu()), {5, 1, 7}),
                       ops::sum_to_shape(a, {5, 1, 7}));
  MW_EXPECT_CLOSE("sum_all", ops::sum_all(a.to(gpu())), ops::sum_all(a), kSumAtol, kSumRtol);
  for (int64_t dim : {0, 1, 2}) {
    for (bool keep : {false, true}) {
      SCOPED_TRACE(testing::Message() << "dim " << dim << " keepdim " << keep);
      Tensor s = ops::sum_dim(a, dim, keep);
      expect_bitwise_equal("sum_dim", ops::sum_dim(a.to(gpu()), dim, keep), s);  // same order
      expect_bitwise_equal("expand_dim", ops::expand_dim(s.to(gpu()), a.shape(), dim, keep),
                           ops::expand_dim(s, a.shape(), dim, keep));
    }
  }
}

TEST(CudaOps, GemmMatmulLinear) {
  MW_SKIP_WITHOUT_GPU();
  // Products of K = 37 terms in cuBLAS's order vs OpenBLAS's: ~K * 6e-8 relative to sum |terms|.
  constexpr double kAtol = 2e-5, kRtol = 1e-5;
  const int64_t M = 19, N = 23, K = 37;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(testing::Message() << "trans_a " << ta << " trans_b " << tb);
      Tensor a = ta ? random_tensor({K, M}, 8) : random_tensor({M, K}, 8);
      Tensor b = tb ? random_tensor({N, K}, 9) : random_tensor({K, N}, 9);
      Tensor c = random_tensor({M, N}, 10), cd = c.to(gpu());
      ops::gemm(a, ta, b, tb, c, true);
      ops::gemm(a.to(gpu()), ta, b.to(gpu()), tb, cd, true);
      MW_EXPECT_CLOSE("gemm accumulate", cd, c, kAtol, kRtol);
      // The same product through transposed views (flags flipped by the BLAS view).
      Tensor out = Tensor::empty({M, N}), outd = Tensor::empty({M, N}, DType::F32, gpu());
      ops::gemm(a.transpose(0, 1), !ta, b, tb, out, false);
      ops::gemm(a.to(gpu()).transpose(0, 1), !ta, b.to(gpu()), tb, outd, false);
      MW_EXPECT_CLOSE("gemm of a view", outd, out, kAtol, kRtol);
    }
  }
  Tensor a = random_tensor({3, M, K}, 11), b = random_tensor({3, K, N}, 12);
  MW_EXPECT_CLOSE("batched matmul", ops::matmul(a.to(gpu()), b.to(gpu())), ops::matmul(a, b), kAtol,
                  kRtol);
  Tensor x = random_tensor({2, 5, K}, 13), w = random_tensor({K, N}, 14),
         bias = random_tensor({N}, 15);
  MW_EXPECT_CLOSE("linear", ops::linear(x.to(gpu()), w.to(gpu()), bias.to(gpu())),
                  ops::linear(x, w, bias), kAtol, kRtol);
  Tensor dy = random_tensor({2, 5, N}, 16);
  auto g = ops::linear_backward(dy, x, w, true, true, true);
  auto gd = ops::linear_backward(dy.to(gpu()), x.to(gpu()), w.to(gpu()), true, true, true);
  MW_EXPECT_CLOSE("linear dx", gd.dx, g.dx, kAtol, kRtol);
  MW_EXPECT_CLOSE("linear dw", gd.dw, g.dw, kAtol, kRtol);
  MW_EXPECT_CLOSE("linear dbias", gd.dbias, g.dbias, kAtol, kRtol);  // 10 rows, another order
}

TEST(CudaOps, EmbeddingIsBitwiseEqualAndChecksIds) {
  MW_SKIP_WITHOUT_GPU();
  Tensor table = random_tensor({11, 9}, 17);
  std::vector<int64_t> id_values = {3, 0, 3, 10, 7, 3, 0, 5};  // repeats exercise the scatter-add
  Tensor ids = Tensor::from_vector(id_values, {2, 4});
  expect_bitwise_equal("embedding", ops::embedding(table.to(gpu()), ids.to(gpu())),
                       ops::embedding(table, ids));
  // The scatter-add adds each row's positions in position order on both devices: bitwise equal.
  Tensor dout = random_tensor({2, 4, 9}, 18);
  expect_bitwise_equal("embedding_backward",
                       ops::embedding_backward(dout.to(gpu()), ids.to(gpu()), 11),
                       ops::embedding_backward(dout, ids, 11));
  Tensor bad = Tensor::from_vector(std::vector<int32_t>{1, 11}, {2}, gpu());
  EXPECT_THROW(ops::embedding(table.to(gpu()), bad), InvalidArgument);
}

TEST(CudaOps, LayerNormGeluSoftmax) {
  MW_SKIP_WITHOUT_GPU();
  const int64_t C = 300;  // more channels than threads per row block
  Tensor x = random_tensor({4, 5, C}, 19, DType::F32, 2.0);
  Tensor w = random_tensor({C}, 20), b = random_tensor({C}, 21),
         dout = random_tensor({4, 5, C}, 22);
  auto r = ops::layernorm(x, w, b, 1e-5);
  auto rd = ops::layernorm(x.to(gpu()), w.to(gpu()), b.to(gpu()), 1e-5);
  // Row statistics are sums of 300 terms: kSum tolerances; the outputs are O(3).
  MW_EXPECT_CLOSE("layernorm out", rd.out, r.out, kSumAtol * 4, kSumRtol);
  MW_EXPECT_CLOSE("layernorm mean", rd.mean, r.mean, kSumAtol, kSumRtol);
  MW_EXPECT_CLOSE("layernorm rstd", rd.rstd, r.rstd, kSumAtol, kSumRtol);
  auto g = ops::layernorm_backward(dout, x, w, r.mean, r.rstd);
  auto gd = ops::layernorm_backward(dout.to(gpu()), x.to(gpu()), w.to(gpu()), r.mean.to(gpu()),
                                    r.rstd.to(gpu()));
  MW_EXPECT_CLOSE("layernorm dx", gd.dx, g.dx, kSumAtol * 4, kSumRtol);
  MW_EXPECT_CLOSE("layernorm dweight", gd.dweight, g.dweight, kSumAtol, kSumRtol);  // 20 rows
  MW_EXPECT_CLOSE("layernorm dbias", gd.dbias, g.dbias, kSumAtol, kSumRtol);
  // GELU: the CPU computes x sigma(2u) with fast::exp (Note [GELU as a sigmoid], core/cpu/
  // layers.cpp): a few f32 roundings (tests/accuracy/ops_accuracy_test.cpp: within 8 eps forward,
  // 4 eps backward), relative to each result in the forward (no cancellation), so inside 1e-5
  // |gelu|; backward at most 4 eps of |dout gelu'| <= 4.5: 1e-6. The GPU keeps the tanh form
  // 0.5 x (1 + tanhf(u)), tanhf within 2 ulp (1.2e-7 for |t| <= 1), and its error dominates.
  // Forward: 0.5 |x| * 1.2e-7 for |x| <= 8 (x has stddev 2): 5e-7, below 2e-6 also where 1 + t
  // cancels (x << 0, result near 0). Backward multiplies the error of sech^2 = 1 - t^2 (4e-7) by
  // 0.5 |x| sqrt(2/pi) (1 + 3 * 0.044715 x^2) <= 30, times |dout| <= 4.
  MW_EXPECT_CLOSE("gelu", ops::gelu(x.to(gpu())), ops::gelu(x), 2e-6, 1e-5);
  MW_EXPECT_CLOSE("gelu_backward", ops::gelu_backward(dout.to(gpu()), x.to(gpu())),
                  ops::gelu_backward(dout, x), 5e-5, 1e-5);
  Tensor y = ops::softmax(x);
  // Probabilities ~1/300 each, normalised by a sum of 300 terms in another order.
  MW_EXPECT_CLOSE("softmax", ops::softmax(x.to(gpu())), y, 1e-8, 1e-5);
  MW_EXPECT_CLOSE("softmax_backward", ops::softmax_backward(dout.to(gpu()), y.to(gpu())),
                  ops::softmax_backward(dout, y), 1e-7, 1e-5);
}

TEST(CudaOps, DropoutMaskIsBitwiseEqualAcrossDevices) {
  MW_SKIP_WITHOUT_GPU();
  // Same counter-based draws (random.h is __host__ __device__), one multiply per kept element.
  Tensor x = random_tensor({3, 1000}, 23);
  for (double p : {0.1, 0.5}) {
    const RngState rng{42, 12345};
    expect_bitwise_equal("dropout", ops::dropout(x.to(gpu()), p, rng), ops::dropout(x, p, rng));
  }
}

TEST(CudaOps, CrossEntropy) {
  MW_SKIP_WITHOUT_GPU();
  const int64_t B = 2, T = 6, V = 517;
  Tensor logits = random_tensor({B, T, V}, 24, DType::F32, 3.0);
  std::vector<int32_t> idv;
  for (int64_t i = 0; i < B * T; ++i) idv.push_back(static_cast<int32_t>((i * 97 + 5) % V));
  Tensor ids = Tensor::from_vector(idv, {B, T});
  auto [loss, lse] = ops::shifted_cross_entropy(logits, ids);
  auto [lossd, lsed] = ops::shifted_cross_entropy(logits.to(gpu()), ids.to(gpu()));
  // log of a sum of 517 exponentials in another order: a few ulp of values ~10.
  MW_EXPECT_CLOSE("lse", lsed, lse, 1e-5, 1e-6);
  MW_EXPECT_CLOSE("loss", lossd, loss, 1e-5, 1e-6);
  Tensor dloss = Tensor::full({}, 1.5);
  Tensor dl = ops::shifted_cross_entropy_backward(dloss, logits, lse, ids, false);
  Tensor dld = ops::shifted_cross_entropy_backward(dloss.to(gpu()), logits.to(gpu()), lsed,
                                                   ids.to(gpu()), false);
  MW_EXPECT_CLOSE("dlogits", dld, dl, 1e-8, 1e-5);  // exp(x - lse) with lse a few ulp apart
}

}  // namespace
}  // namespace mw
