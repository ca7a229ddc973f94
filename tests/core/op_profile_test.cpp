// Note [Op profile] (core/op_profile.h): scopes record exclusive time per name, GEMM time inside
// them, nothing while profiling is off; and one GPT-2 step through the autograd puts its forward
// functions and backward nodes in the table.
#include "core/op_profile.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace mw {
namespace {

const profile::OpTime* find(const std::vector<profile::OpTime>& table, const std::string& name) {
  for (const profile::OpTime& t : table)
    if (t.name == name) return &t;
  return nullptr;
}

TEST(OpProfile, NothingIsRecordedWhileOff) {
  profile::enable(false);
  { profile::Scope s("off"); }
  EXPECT_TRUE(profile::take().empty());
}

// The inner scope's 200 ms are not the outer's: the outer scope's own work is a 10 ms sleep, and
// with the inner time included it would be at least 210 ms. The bound of 150 ms leaves 140 ms
// for scheduling delays on a loaded machine; sleep_for never returns early, so the lower bounds
// hold exactly.
TEST(OpProfile, NestedScopesRecordExclusiveTime) {
  profile::enable(true);
  {
    profile::Scope outer("outer");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    {
      profile::Scope inner("inner");
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    { profile::Scope inner("inner"); }
  }
  const std::vector<profile::OpTime> table = profile::take();
  profile::enable(false);
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(table[0].name, "inner") << "longest first";
  EXPECT_EQ(table[0].calls, 2);
  EXPECT_GE(table[0].ms, 200.0);
  const profile::OpTime* outer = find(table, "outer");
  ASSERT_NE(outer, nullptr);
  EXPECT_EQ(outer->calls, 1);
  EXPECT_GE(outer->ms, 10.0);
  EXPECT_LT(outer->ms, 150.0) << "the inner scope's time was counted in the outer one";
  EXPECT_TRUE(profile::take().empty()) << "take() empties the table";
}

TEST(OpProfile, GemmTimeIsAttributedToTheScopeThatRanIt) {
  Tensor a = Tensor::full({256, 256}, 1.0), b = Tensor::full({256, 256}, 2.0);
  Tensor out = Tensor::empty({256, 256});
  profile::enable(true);
  {
    profile::Scope product("product");
    ops::gemm(a, false, b, false, out, false);
    profile::Scope after("after");  // opened after the gemm: none of it
  }
  const std::vector<profile::OpTime> table = profile::take();
  profile::enable(false);
  const profile::OpTime* product = find(table, "product");
  const profile::OpTime* after = find(table, "after");
  ASSERT_TRUE(product && after);
  EXPECT_GT(product->gemm_ms, 0.0);
  EXPECT_LE(product->gemm_ms, product->ms);
  EXPECT_EQ(after->gemm_ms, 0.0);
}

// Forward functions by their names, backward nodes by theirs, and AccumulateGrad for the leaves.
TEST(OpProfile, AStepThroughTheAutogradNamesForwardAndBackwardOps) {
  Tensor x = Tensor::full({4, 8}, 0.5);
  Tensor w = Tensor::full({8, 3}, 0.25), bias = Tensor::full({3}, 0.1);
  set_requires_grad(w);
  set_requires_grad(bias);
  profile::enable(true);
  backward(sum(gelu(linear(x, w, bias))));
  const std::vector<profile::OpTime> table = profile::take();
  profile::enable(false);
  for (const char* name :
       {"linear", "gelu", "sum", "LinearBackward", "GeluBackward", "SumBackward", "AccumulateGrad"})
    EXPECT_NE(find(table, name), nullptr) << name;
  EXPECT_EQ(find(table, "AccumulateGrad")->calls, 2) << "w and bias";
}

}  // namespace
}  // namespace mw
