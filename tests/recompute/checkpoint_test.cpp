// nn::checkpoint, checkpoint_sequential and CheckpointWrapper: gradients bitwise equal to a run
// without recomputation (dropout on), the RNG restore, the segment plan, and the error paths.
#include "nn/checkpoint.h"

#include <gtest/gtest.h>

#include "autograd/saved_tensor.h"
#include "offload/activation/activation_offload.h"
#include "recompute_test_util.h"

namespace mw {
namespace {

using test::expect_same_step;
using test::run_step;

std::vector<std::shared_ptr<nn::Module>> as_modules(gpt2::GPT2& model) {
  return {model.blocks().begin(), model.blocks().end()};
}

TEST(SavedTensorHooks, AGuardCreatedInsideAnUnpackApplies) {
  // Recomputation runs a forward inside an unpack, where hooks are otherwise disabled
  // (autograd/saved_tensor.h); its recording guard must see the tensors that forward saves.
  Tensor x = Tensor::from_vector<double>({0.5, 1.5}, {2});
  set_requires_grad(x);
  int inner_packs = 0, outer_packs = 0;
  Tensor y;
  {
    SavedTensorHooksGuard outer(
        [&](const Tensor& t) -> std::shared_ptr<void> {
          ++outer_packs;
          return std::make_shared<Tensor>(t);
        },
        [&](const std::shared_ptr<void>& p) {
          SavedTensorHooksGuard inner(
              [&](const Tensor& t) -> std::shared_ptr<void> {
                ++inner_packs;
                return std::make_shared<Tensor>(t);
              },
              [](const std::shared_ptr<void>& q) { return *static_cast<Tensor*>(q.get()); });
          EnableGradGuard grad;
          Tensor z = gelu(x);  // saves x: goes through `inner`
          return *static_cast<Tensor*>(p.get());
        });
    y = gelu(x);
  }
  EXPECT_EQ(outer_packs, 1);
  backward(sum(y));
  EXPECT_EQ(inner_packs, 1);
  // Outside any guard, nothing is packed and the disabled state is back to normal.
  Tensor w = gelu(x);
  EXPECT_EQ(inner_packs, 1);
  EXPECT_EQ(outer_packs, 1);
}

TEST(Checkpoint, EveryBlockGivesBitwiseEqualGradientsWithDropout) {
  auto config = test::small_config(4);
  gpt2::GPT2 model(config, 3);
  Tensor ids = test::token_batch(config, 2, 16, Device::cpu());
  auto plain = run_step(model, ids);
  model.run_block = [](nn::Block& b, int64_t, const Tensor& x) {
    return nn::checkpoint([&b](const Tensor& in) { return b(in); }, x);
  };
  auto ckpt = run_step(model, ids);
  expect_same_step(plain, ckpt, "checkpoint every block");
}

TEST(Checkpoint, WithoutRngRestoreTheGradientsWouldDiffer) {
  // The check above can fail: recomputing with the generator where backward left it (i.e. not
  // restoring the forward's state) gives different dropout masks and different gradients.
  auto config = test::small_config(2);
  gpt2::GPT2 model(config, 3);
  Tensor ids = test::token_batch(config, 2, 16, Device::cpu());
  auto plain = run_step(model, ids);
  // A hand-made "checkpoint" that drops the block's saved tensors and recomputes with a fresh RNG
  // draw: emulated by running the block's forward a second time (advancing the generator) before
  // the real one, so the masks of the kept graph differ from a plain run.
  model.run_block = [](nn::Block& b, int64_t, const Tensor& x) {
    {
      NoGradGuard no_grad;
      b(x);
    }
    return b(x);
  };
  auto shifted = run_step(model, ids);
  EXPECT_NE(plain.grads[0], shifted.grads[0]) << "dropout masks do not depend on the RNG offset";
}

TEST(Checkpoint, SequentialWithSeveralSegmentCountsIsBitwiseEqual) {
  auto config = test::small_config(6);
  gpt2::GPT2 model(config, 5);
  Tensor ids = test::token_batch(config, 2, 16, Device::cpu());
  auto plain = run_step(model, ids);
  for (int64_t k : {1, 2, 3, 4, 6}) {
    // checkpoint_sequential itself, on the block list, in place of the model's loop ...
    int64_t calls = 0;
    model.run_block = [&](nn::Block&, int64_t i, const Tensor& x) {
      if (i != 0) return x;
      ++calls;
      return nn::checkpoint_sequential(as_modules(model), k, x);
    };
    auto seq = run_step(model, ids);
    EXPECT_EQ(calls, 1);
    expect_same_step(plain, seq, "checkpoint_sequential segments=" + std::to_string(k));
    // ... and the SegmentedRunner that gpt2_train uses.
    auto runner = std::make_shared<nn::SegmentedRunner>(as_modules(model), nn::plan_segments(6, k));
    model.run_block = [runner](nn::Block&, int64_t i, const Tensor& x) { return (*runner)(i, x); };
    auto seg = run_step(model, ids);
    expect_same_step(plain, seg, "SegmentedRunner segments=" + std::to_string(k));
  }
}

TEST(Checkpoint, PlanFollowsPyTorchAndLeavesTheLastSegmentUncheckpointed) {
  auto plan = nn::plan_segments(12, 3);
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].begin, 0);
  EXPECT_EQ(plan[0].end, 4);
  EXPECT_TRUE(plan[0].checkpointed);
  EXPECT_EQ(plan[1].begin, 4);
  EXPECT_EQ(plan[1].end, 8);
  EXPECT_EQ(plan[2].begin, 8);
  EXPECT_EQ(plan[2].end, 12);
  EXPECT_FALSE(plan[2].checkpointed);
  auto uneven = nn::plan_segments(5, 2);  // PyTorch: segment size 5 // 2 = 2, the last takes 3
  ASSERT_EQ(uneven.size(), 2u);
  EXPECT_EQ(uneven[0].end, 2);
  EXPECT_EQ(uneven[1].begin, 2);
  EXPECT_EQ(uneven[1].end, 5);
  EXPECT_EQ(nn::plan_segments(4, 1).size(), 1u);
  EXPECT_FALSE(nn::plan_segments(4, 1)[0].checkpointed);
  EXPECT_THROW(nn::plan_segments(4, 0), InvalidArgument);
  EXPECT_THROW(nn::plan_segments(4, 5), InvalidArgument);
  EXPECT_EQ(nn::sqrt_segments(12), 3);
  EXPECT_EQ(nn::sqrt_segments(48), 7);
  EXPECT_EQ(nn::sqrt_segments(1), 1);
}

TEST(Checkpoint, ForwardSavesNothingButTheInputsAndRestoresTheCallersRng) {
  Tensor w = Tensor::from_vector<double>({0.5, -1.0, 2.0, 0.25}, {4});
  set_requires_grad(w);
  Tensor x = Tensor::from_vector<double>({1, 2, 3, 4}, {4});
  set_requires_grad(x);
  int outer_packs = 0;
  auto fn = [&w](const Tensor& in) {
    Tensor h = gelu(mul(in, w));
    return gelu(dropout(h, 0.5, default_generator()));
  };
  // Reference without checkpointing.
  default_generator().manual_seed(1);
  backward(sum(fn(x)));
  auto gx = grad(x).to_vector<double>(), gw = grad(w).to_vector<double>();
  zero_grad(x);
  zero_grad(w);
  default_generator().manual_seed(1);
  Tensor y;
  {
    SavedTensorHooksGuard outer(
        [&](const Tensor& t) -> std::shared_ptr<void> {
          ++outer_packs;
          return std::make_shared<Tensor>(t);
        },
        [](const std::shared_ptr<void>& p) { return *static_cast<Tensor*>(p.get()); });
    y = nn::checkpoint(fn, x);
  }
  EXPECT_EQ(outer_packs, 0) << "the checkpoint's own hook must be the one that applies inside it";
  RngState after_forward = default_generator().state();
  default_generator().reserve(1000);  // the caller moves on before backward
  RngState callers = default_generator().state();
  backward(sum(y));
  EXPECT_EQ(default_generator().state().offset, callers.offset) << "recomputation leaked its RNG";
  EXPECT_NE(after_forward.offset, callers.offset);
  EXPECT_EQ(grad(x).to_vector<double>(), gx);
  EXPECT_EQ(grad(w).to_vector<double>(), gw);
}

TEST(Checkpoint, NonDeterministicGraphIsReported) {
  Tensor x = Tensor::from_vector<double>({1, 2}, {2});
  set_requires_grad(x);
  int calls = 0;
  Tensor y = nn::checkpoint(
      [&calls](const Tensor& in) { return ++calls == 1 ? gelu(in) : gelu(gelu(in)); }, x);
  EXPECT_THROW(backward(sum(y)), AutogradError);
}

TEST(Checkpoint, InputModifiedInPlaceIsReported) {
  Tensor x = Tensor::from_vector<double>({1, 2}, {2});
  Tensor w = Tensor::from_vector<double>({3, 4}, {2});
  set_requires_grad(w);
  Tensor y = nn::checkpoint([&w](const Tensor& in) { return gelu(mul(in, w)); }, x);
  x.fill_(0.0);
  EXPECT_THROW(backward(sum(y)), AutogradError);
}

// Inside the checkpointed function a tensor is saved and then written in place. Plain autograd
// reports it; under recomputation the saved storage is gone by backward (the pack kept an index),
// and with a weak reference to it the check was skipped: the recomputation replayed the write and
// the gradient was gelu's at 3, silently (Note [Version counter]).
TEST(Checkpoint, AWriteToATensorSavedInsideIsReported) {
  Tensor x = Tensor::from_vector<double>({0.5, -1.0}, {2});
  set_requires_grad(x);
  Tensor y = nn::checkpoint(
      [](const Tensor& in) {
        Tensor h = mul_scalar(in, 2.0);
        Tensor out = gelu(h);  // saves h
        h.fill_(3.0);
        return out;
      },
      x);
  EXPECT_THROW(backward(sum(y)), AutogradError);
}

// The same write under activation offload, whose worker drops the device storage once its copy
// is done: synchronous copies (made before the write) and background ones.
TEST(Checkpoint, AWriteToAnOffloadedSavedTensorIsReported) {
  for (const bool background : {false, true}) {
    offload::ActivationOffloadOptions options;
    options.background = background;
    offload::ActivationOffloader off(options);
    Tensor x = Tensor::from_vector<double>({0.5, -1.0}, {2}).to(Device::sim(6));
    set_requires_grad(x);
    Tensor y;
    {
      offload::OffloadScope scope(off);
      Tensor h = mul_scalar(x, 2.0);
      y = gelu(h);
      off.wait_idle();  // the copy done and the device storage dropped but for h
      h.fill_(3.0);
    }
    EXPECT_THROW(backward(sum(y)), AutogradError) << (background ? "background" : "synchronous");
  }
}

TEST(Checkpoint, UnderNoGradItJustRunsTheFunction) {
  Tensor x = Tensor::from_vector<double>({1, 2}, {2});
  set_requires_grad(x);
  NoGradGuard no_grad;
  Tensor y = nn::checkpoint([](const Tensor& in) { return gelu(in); }, x);
  EXPECT_FALSE(requires_grad(y));
}

TEST(Checkpoint, RetainGraphRecomputesForTheSecondBackward) {
  Tensor x = Tensor::from_vector<double>({0.3, -0.7, 1.1}, {3});
  set_requires_grad(x);
  Tensor y = sum(nn::checkpoint([](const Tensor& in) { return gelu(gelu(in)); }, x));
  backward(y, Tensor(), /*retain_graph=*/true);
  auto once = grad(x).to_vector<double>();
  backward(y);
  auto twice = grad(x).to_vector<double>();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_EQ(twice[i], 2 * once[i]) << i;
}

TEST(Checkpoint, WrapperWithOffloadToCpuKeepsTheInputOnTheHost) {
  set_sim_capacity(3, 0);
  auto config = test::small_config(3);
  gpt2::GPT2 ref(config, 9, DType::F32, Device::sim(3));
  Tensor ids = test::token_batch(config, 2, 16, Device::sim(3));
  auto plain = run_step(ref, ids);
  std::vector<std::shared_ptr<nn::CheckpointWrapper>> wrapped;
  for (auto& b : ref.blocks()) wrapped.push_back(std::make_shared<nn::CheckpointWrapper>(b, true));
  int64_t cpu_before = 0, cpu_after = 0;
  ref.run_block = [&](nn::Block&, int64_t i, const Tensor& x) {
    if (i == 0) cpu_before = allocator_for(Device::cpu()).stats().current_bytes;
    Tensor y = (*wrapped[static_cast<size_t>(i)])(x);
    if (i == 2) cpu_after = allocator_for(Device::cpu()).stats().current_bytes;
    return y;
  };
  auto offloaded = run_step(ref, ids);
  expect_same_step(plain, offloaded, "CheckpointWrapper(offload_to_cpu)");
  // Three block inputs [2, 16, 32] f32 went to the host (4096-byte granules).
  EXPECT_EQ(cpu_after - cpu_before, 3 * round_up(2 * 16 * 32 * 4, kHostAlignment));
}

}  // namespace
}  // namespace mw
