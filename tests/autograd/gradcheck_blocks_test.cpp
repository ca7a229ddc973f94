// Finite-difference gradient checks (gradcheck.h) at sizes that reach the CPU kernels' blocked and
// split code: the shapes in gradcheck_test.cpp all fit in one block, chunk or thread's range, so
// an index wrong only in a later block passed them (a softmax chunk reading row[j] for
// row[j0 + j], a layernorm dropping its last block of rows: both went undetected). Each size
// below says which path it reaches; the ranges split by threads (parallel_for) split only with
// two or more threads, the test binary's default on any machine with two cores.
#include "autograd/node.h"
#include "gradcheck.h"

namespace mw {
namespace {

using testing::gradcheck;
using testing::random_tensor;
using Ts = std::vector<Tensor>;

// V = 517: past one 512-logit chunk of the row's sum of exps (kSoftmaxChunk, core/cpu/
// row_softmax.h), with a second chunk of 5, not a multiple of the 8 lanes; targets in both chunks.
TEST(GradcheckBlocks, ShiftedCrossEntropyPastOneSoftmaxChunk) {
  Tensor ids = Tensor::from_vector<int64_t>({1, 510, 2, 515, 3, 516}, {1, 6});
  gradcheck([&](const Ts& x) { return shifted_cross_entropy(x[0], ids); },
            {random_tensor({1, 6, 517}, 1, 2.0)});
}

// 70 rows: layernorm's backward sums dweight and dbias in blocks of 32 rows (kRowsPerBlock,
// core/cpu/layers.cpp), so two full blocks and one of 6.
TEST(GradcheckBlocks, LayerNormPastOneRowBlock) {
  gradcheck([](const Ts& x) { return layernorm(x[0], x[1], x[2], 1e-5); },
            {random_tensor({70, 8}, 1), random_tensor({8}, 2), random_tensor({8}, 3)});
}

// 300 output columns: the bias gradient's column sums are split into ranges of at least 256
// columns (linear_backward, core/cpu/gemm.cpp), so two ranges, the second starting past 0.
TEST(GradcheckBlocks, LinearBiasPastOneColumnRange) {
  gradcheck([](const Ts& x) { return linear(x[0], x[1], x[2]); },
            {random_tensor({2, 3}, 1), random_tensor({3, 300}, 2), random_tensor({300}, 3)});
}

// C = 70: the embedding's backward splits channels into ranges of at least 64
// (embedding_backward_into, core/cpu/layers.cpp), so two ranges; repeated ids accumulate.
TEST(GradcheckBlocks, EmbeddingPastOneChannelRange) {
  Tensor ids = Tensor::from_vector<int32_t>({1, 4, 1, 0, 3, 4}, {2, 3});
  gradcheck([&](const Ts& x) { return embedding(x[0], ids); }, {random_tensor({5, 70}, 1)});
}

// An identity whose backward records where its incoming gradient's data lives.
Tensor record_gradient_address(const Tensor& x, const void** address) {
  Tensor out = x.detach();
  return record("AddressProbeBackward", out, {x}, [&](const std::vector<bool>&) -> BackwardFn {
    return [address](const std::vector<Tensor>& g) -> std::vector<Tensor> {
      *address = g[0].raw_data();
      return {g[0]};
    };
  });
}

// The loss's backward writes dlogits into the logits' own buffer when nothing else holds it
// (ShiftedCrossEntropyBackward, autograd/functions.cpp): logits made by the LM head inside f are
// such a buffer (gradcheck's other tests pass the logits as an input, which the test holds). The
// address probe shows that branch ran: the logits' gradient lands in the logits' buffer.
TEST(GradcheckBlocks, ShiftedCrossEntropyReusingTheLmHeadsLogits) {
  Tensor ids = Tensor::from_vector<int64_t>({1, 8, 2, 0, 3, 10, 4, 5}, {2, 4});
  const void* logits_address = nullptr;
  const void* gradient_address = nullptr;
  gradcheck(
      [&](const Ts& x) {
        Tensor logits = lm_head(x[0], x[1]);
        if (grad_enabled()) logits_address = logits.raw_data();
        return shifted_cross_entropy(record_gradient_address(logits, &gradient_address), ids);
      },
      {random_tensor({2, 4, 6}, 1), random_tensor({11, 6}, 2)});
  ASSERT_NE(logits_address, nullptr);
  EXPECT_EQ(gradient_address, logits_address) << "the logits buffer was not reused";
}

}  // namespace
}  // namespace mw
