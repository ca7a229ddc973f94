// The backward engine: accumulation, hooks, version checks, graph release, iterative teardown.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "autograd/saved_tensor.h"
#include "gradcheck.h"

namespace mw {
namespace {

TEST(Engine, LeafGradientsAccumulateAcrossBackwards) {
  Tensor x = Tensor::from_vector<double>({1, 2, 3}, {3});
  set_requires_grad(x);
  backward(sum(mul_scalar(x, 2.0)));
  backward(sum(mul_scalar(x, 3.0)));
  EXPECT_EQ(grad(x).to_vector<double>(), (std::vector<double>{5, 5, 5}));
}

TEST(Engine, DiamondSumsBothPaths) {
  Tensor x = Tensor::from_vector<double>({2}, {1});
  set_requires_grad(x);
  Tensor y = mul(x, x);  // y = x^2, then z = y + y*x = x^2 + x^3
  backward(sum(add(y, mul(y, x))));
  EXPECT_DOUBLE_EQ(grad(x).item(), 2 * 2.0 + 3 * 4.0);
}

TEST(Engine, GradReadyHookSeesFinalGradientOncePerBackward) {
  Tensor x = Tensor::from_vector<double>({1, 1}, {2});
  set_requires_grad(x);
  int calls = 0;
  double seen = 0;
  add_grad_ready_hook(x, [&](const Tensor& leaf) {
    ++calls;
    seen = grad(leaf).to_vector<double>()[0];
  });
  backward(sum(add(mul_scalar(x, 2.0), mul_scalar(x, 5.0))));  // two uses, one final gradient
  EXPECT_EQ(calls, 1);
  EXPECT_DOUBLE_EQ(seen, 7.0);
}

TEST(Engine, InPlaceChangeOfSavedTensorIsReported) {
  Tensor x = Tensor::from_vector<double>({1, 2}, {2});
  set_requires_grad(x);
  Tensor y = mul_scalar(x, 1.0);
  Tensor z = gelu(y);  // saves y
  y.fill_(0.0);        // modifies it in place
  EXPECT_THROW(backward(sum(z)), AutogradError);
}

TEST(Engine, SecondBackwardWithoutRetainGraphIsAnError) {
  Tensor x = Tensor::from_vector<double>({1, 2}, {2});
  set_requires_grad(x);
  Tensor loss = sum(gelu(x));
  backward(loss);
  EXPECT_THROW(backward(loss), AutogradError);
  Tensor loss2 = sum(gelu(x));
  backward(loss2, Tensor(), /*retain_graph=*/true);
  EXPECT_NO_THROW(backward(loss2));
}

// The loss's backward gives up its saved logits to reuse their buffer: with retain_graph it keeps
// them (a second backward found them gone and crashed), and gives the same gradient again.
TEST(Engine, ASecondBackwardThroughTheLossWithRetainGraphGivesTheSameGradient) {
  Tensor w = Tensor::full({2, 4, 8}, 0.25);
  w.data<float>()[5] = 1.5f;
  set_requires_grad(w);
  const Tensor ids = Tensor::from_vector<int32_t>({1, 7, 3, 0, 2, 2, 5, 6}, {2, 4});
  Tensor loss = shifted_cross_entropy(mul_scalar(w, 2.0), ids);
  backward(loss, Tensor(), /*retain_graph=*/true);
  const std::vector<float> once = grad(w).to_vector<float>();
  backward(loss, Tensor(), /*retain_graph=*/true);
  const std::vector<float> twice = grad(w).to_vector<float>();
  for (size_t i = 0; i < once.size(); ++i) ASSERT_EQ(twice[i], 2 * once[i]) << i;
}

// sub and div of two 16-bit tensors recorded a graph whose backward then refused (the negation
// took f32 and f64 only); gradients come back in their inputs' dtypes, also where the inputs'
// dtypes differ outside autocast (matmul, lm_head, linear with a frozen weight gave 16-bit ones
// to f32 inputs).
TEST(Engine, SixteenBitAndMixedInputsGetGradientsInTheirOwnDtypes) {
  for (DType low : {DType::BF16, DType::F16}) {
    Tensor a = Tensor::full({2, 3}, 3.0, low), b = Tensor::full({2, 3}, 2.0, low);
    set_requires_grad(a);
    set_requires_grad(b);
    backward(sum(cast(sub(a, b), DType::F32)));
    EXPECT_EQ(grad(b).dtype(), low);
    EXPECT_EQ(grad(b).to(DType::F32).to_vector<float>()[0], -1.0f);
    zero_grad(a);
    zero_grad(b);
    backward(sum(cast(div(a, b), DType::F32)));
    EXPECT_EQ(grad(b).to(DType::F32).to_vector<float>()[0], -0.75f);  // -a/b^2
  }
  Tensor x = Tensor::full({2, 4}, 0.5), t = Tensor::full({4, 3}, 0.25);
  set_requires_grad(x);
  set_requires_grad(t);
  backward(sum(cast(matmul(x.to(DType::BF16), t), DType::F32)));
  EXPECT_EQ(grad(t).dtype(), DType::F32);
  Tensor table = Tensor::full({5, 4}, 0.5);
  set_requires_grad(table);
  backward(sum(cast(lm_head(x.to(DType::BF16), table), DType::F32)));
  EXPECT_EQ(grad(table).dtype(), DType::F32);
  Tensor frozen = Tensor::full({4, 3}, 0.5, DType::BF16);
  zero_grad(x);
  backward(sum(cast(linear(x, frozen, Tensor()), DType::F32)));
  EXPECT_EQ(grad(x).dtype(), DType::F32);
}

TEST(Engine, NoGradRecordsNothing) {
  Tensor x = Tensor::from_vector<double>({1, 2}, {2});
  set_requires_grad(x);
  NoGradGuard guard;
  Tensor y = gelu(x);
  EXPECT_FALSE(requires_grad(y));
}

TEST(Engine, SavedTensorHooksPackAndUnpack) {
  Tensor x = Tensor::from_vector<double>({0.5, -1.0, 2.0}, {3});
  set_requires_grad(x);
  int packed = 0, unpacked = 0;
  Tensor y;
  {
    SavedTensorHooksGuard hooks(
        [&](const Tensor& t) -> std::shared_ptr<void> {
          ++packed;
          return std::make_shared<Tensor>(t.clone());  // a copy, as an offload would make
        },
        [&](const std::shared_ptr<void>& p) {
          ++unpacked;
          return *static_cast<Tensor*>(p.get());
        });
    y = gelu(x);
  }
  backward(sum(y));
  EXPECT_EQ(packed, 1);
  EXPECT_EQ(unpacked, 1);
  Tensor expected = ops::gelu_backward(Tensor::ones({3}, DType::F64), x);
  EXPECT_EQ(grad(x).to_vector<double>(), expected.to_vector<double>());
}

TEST(Engine, DeepChainBuildsAndTearsDownWithoutRecursion) {
  Tensor x = Tensor::from_vector<double>({1}, {1});
  set_requires_grad(x);
  Tensor y = x;
  for (int i = 0; i < 200000; ++i) y = add_scalar(y, 1e-6);  // deep enough to overflow a recursion
  backward(sum(y));
  EXPECT_DOUBLE_EQ(grad(x).item(), 1.0);
  y = Tensor();  // iterative teardown of the remaining graph
}

TEST(Engine, BackwardHookRunsWhenGradientPasses) {
  Tensor x = Tensor::from_vector<double>({1, 2}, {2});
  set_requires_grad(x);
  bool fired = false;
  Tensor y = identity_with_backward_hook(mul_scalar(x, 2.0), [&] { fired = true; });
  EXPECT_FALSE(fired);
  backward(sum(y));
  EXPECT_TRUE(fired);
  EXPECT_EQ(grad(x).to_vector<double>(), (std::vector<double>{2, 2}));
}

// ---- Note [Rows-ready hooks] ------------------------------------------------------------------

using testing::random_tensor;

// A tied table as in GPT-2: looked up by `ids`, then used by the LM head. Loss = sum(head * r).
Tensor tied_loss(const Tensor& table, const Tensor& ids, const Tensor& r,
                 const std::function<void()>& between = {}) {
  Tensor h = embedding(table, ids);
  if (between) h = identity_with_backward_hook(h, between);
  return sum(mul(lm_head(gelu(h), table), r));
}

TEST(RowsReadyHook, FiresOnceAfterTheHeadWithTheRowsTheEmbeddingWillAdd) {
  const int64_t V = 7, C = 3;
  Tensor ids = Tensor::from_vector<int32_t>({5, 1, 5, 3}, {2, 2});
  Tensor table = random_tensor({V, C}, 1);
  set_requires_grad(table);
  Tensor r = random_tensor({2, 2, V}, 2);
  // The head's share alone: the same loss with the lookup reading a detached copy.
  backward(sum(mul(lm_head(gelu(embedding(table.detach(), ids)), table), r)));
  const std::vector<double> head_only = grad(table).to_vector<double>();
  zero_grad(table);
  backward(tied_loss(table, ids, r));
  const std::vector<double> full = grad(table).to_vector<double>();
  zero_grad(table);

  int calls = 0;
  bool joined = false, joined_before_final = false;
  add_grad_rows_ready_hook(
      table, [&](const Tensor& leaf, const Tensor& partial, const std::vector<int64_t>& rows) {
        ++calls;
        EXPECT_TRUE(leaf.is_same(table));
        EXPECT_EQ(rows, (std::vector<int64_t>{1, 3, 5}));   // sorted, distinct
        EXPECT_EQ(partial.to_vector<double>(), head_only);  // nothing of the embedding's yet
        // Outside the pending rows, the partial gradient already is the final one.
        std::vector<double> p = partial.to_vector<double>();
        for (int64_t v = 0; v < V; ++v) {
          if (v == 1 || v == 3 || v == 5) continue;
          for (int64_t c = 0; c < C; ++c) EXPECT_EQ(p[v * C + c], full[v * C + c]);
        }
        // At the join, the embedding has not yet added its rows into the buffer the hook reads.
        const double* data = partial.data<double>();
        return std::function<void()>([&, data] {
          joined = true;
          EXPECT_TRUE(std::equal(head_only.begin(), head_only.end(), data));
        });
      });
  add_grad_ready_hook(table, [&](const Tensor&) { joined_before_final = joined; });
  // The join runs before the embedding's backward adds its rows.
  bool joined_before_embedding = true;
  backward(tied_loss(table, ids, r, [&] { joined_before_embedding = joined; }));
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(joined_before_embedding);  // the hook passed between head and lookup: not yet
  EXPECT_TRUE(joined_before_final);
  EXPECT_EQ(grad(table).to_vector<double>(), full);
}

TEST(RowsReadyHook, WaitsForEveryDenseUseAndNeverFiresWhenAccumulating) {
  Tensor ids = Tensor::from_vector<int32_t>({0, 2}, {1, 2});
  Tensor table = random_tensor({4, 3}, 3);
  set_requires_grad(table);
  Tensor x = random_tensor({1, 2, 3}, 4);
  // Two dense uses (an LM head, and a matmul through a transposed view) and the lookup.
  auto loss = [&] {
    Tensor h = embedding(table, ids);
    return add(sum(gelu(lm_head(h, table))),
               sum(mul_scalar(matmul(x, table.transpose(0, 1)), 2.0)));
  };
  backward(loss());
  const std::vector<double> full = grad(table).to_vector<double>();
  zero_grad(table);
  int calls = 0;
  add_grad_rows_ready_hook(
      table, [&](const Tensor&, const Tensor& partial, const std::vector<int64_t>& rows) {
        ++calls;
        EXPECT_EQ(rows, (std::vector<int64_t>{0, 2}));
        // Fired only after both dense uses: rows 1 and 3 are final.
        std::vector<double> p = partial.to_vector<double>();
        for (int64_t v : {1, 3})
          for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(p[v * 3 + c], full[v * 3 + c]) << v;
        return std::function<void()>();
      });
  backward(loss());
  EXPECT_EQ(calls, 1);
  // Accumulating onto an existing .grad: not fired (no row is final before the lookup ran).
  backward(loss());
  EXPECT_EQ(calls, 1);
}

TEST(RowsReadyHook, JoinRunsWhenBackwardFailsHalfway) {
  Tensor ids = Tensor::from_vector<int32_t>({2, 0}, {1, 2});
  Tensor table = random_tensor({4, 3}, 6);
  set_requires_grad(table);
  bool joined = false;
  add_grad_rows_ready_hook(table, [&](const Tensor&, const Tensor&, const std::vector<int64_t>&) {
    return std::function<void()>([&] { joined = true; });
  });
  Tensor loss = tied_loss(table, ids, random_tensor({1, 2, 4}, 7),
                          [] { throw Error("failure between the head and the lookup"); });
  EXPECT_THROW(backward(loss), Error);
  EXPECT_TRUE(joined);  // the hook's reader was joined before the gradient buffers went away
}

}  // namespace
}  // namespace mw
