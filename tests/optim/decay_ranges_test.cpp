// Note [Weight decay by ranges]: the ranges' segments, and every optimizer path stepping the
// elements inside them as torch.optim.AdamW steps a param group with weight_decay 0, bit for bit.
#include "optim/decay_ranges.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "autograd/autograd.h"
#include "optim/hybrid_adam.h"
#include "optim/optimizer.h"

namespace mw::optim {
namespace {

struct Segment {
  int64_t lo, hi;
  bool decayed;
  bool operator==(const Segment&) const = default;
};

std::vector<Segment> segments(const NoDecayRanges& r, int64_t lo, int64_t hi, float wd) {
  AdamHyper h;
  h.weight_decay = wd;
  std::vector<Segment> out;
  for_each_decay_segment(r, lo, hi, make_adam_step_scalars(h, 1, -1.f),
                         [&](int64_t a, int64_t b, const AdamStepScalars& s) {
                           out.push_back({a, b, s.neg_lr_weight_decay != 0.f});
                         });
  return out;
}

TEST(WeightDecayRanges, SegmentsCoverTheRangeAndSplitWhereTheDecayChanges) {
  const NoDecayRanges r = {{2, 5}, {7, 9}};
  EXPECT_EQ(segments(r, 0, 10, 0.1f),
            (std::vector<Segment>{
                {0, 2, true}, {2, 5, false}, {5, 7, true}, {7, 9, false}, {9, 10, true}}));
  // A slice of the tensor starting and ending inside ranges (an NVMe slice, a row split's part).
  EXPECT_EQ(segments(r, 3, 8, 0.1f),
            (std::vector<Segment>{{3, 5, false}, {5, 7, true}, {7, 8, false}}));
  EXPECT_EQ(segments(r, 5, 7, 0.1f), (std::vector<Segment>{{5, 7, true}}));
  EXPECT_EQ(segments(r, 9, 9, 0.1f), std::vector<Segment>{});
  // Without a decay, or without ranges, one call.
  EXPECT_EQ(segments(r, 0, 10, 0.f), (std::vector<Segment>{{0, 10, false}}));
  EXPECT_EQ(segments({}, 0, 10, 0.1f), (std::vector<Segment>{{0, 10, true}}));
}

TEST(WeightDecayRanges, PartsLeftAloneBecomeMergedRangesOfAPiece) {
  // Parts (a chunk's tensors) at [0, 10) decayed, [10, 14) not, [14, 20) not, [20, 30) decayed,
  // [30, 34) not.
  const std::vector<int64_t> offsets = {0, 10, 14, 20, 30}, numels = {10, 4, 6, 10, 4};
  const std::vector<char> decays = {1, 0, 0, 1, 0};
  EXPECT_EQ(no_decay_ranges_of(offsets, numels, decays, 0, 34),
            (NoDecayRanges{{10, 20}, {30, 34}}));
  // A piece [12, 32): its own element indices.
  EXPECT_EQ(no_decay_ranges_of(offsets, numels, decays, 12, 20), (NoDecayRanges{{0, 8}, {18, 20}}));
  EXPECT_EQ(no_decay_ranges_of(offsets, numels, decays, 0, 10), NoDecayRanges{});
}

// Parameters of 3000, 1024, 100, 5000 and 7 elements, some of whose elements are left alone.
const std::vector<int64_t> kNumels = {3000, 1024, 100, 5000, 7};
const std::vector<NoDecayRanges> kNoDecay = {
    {{0, 100}, {2500, 3000}}, {}, {{0, 100}}, {{1000, 1030}, {4999, 5000}}, {}};

std::vector<Tensor> make_params() {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<Tensor> ps;
  for (int64_t n : kNumels) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = u(rng);
    Tensor p = Tensor::from_vector(v, {n});
    set_requires_grad(p);
    ps.push_back(p);
  }
  return ps;
}

void set_grads(const std::vector<Tensor>& ps, int step) {
  std::mt19937 rng(500 + step);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (const Tensor& p : ps) {
    std::vector<float> g(static_cast<size_t>(p.numel()));
    for (float& x : g) x = u(rng);
    set_grad(p, Tensor::from_vector(g, p.shape()));
  }
}

template <typename Opt>
std::vector<std::vector<float>> train(Opt& opt, const std::vector<Tensor>& ps) {
  for (int s = 0; s < 4; ++s) {
    set_grads(ps, s);
    opt.step();
  }
  std::vector<std::vector<float>> out;
  for (const Tensor& p : ps) out.push_back(p.to_vector<float>());
  return out;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

// torch's two param groups, element by element: the reference AdamW over every element with the
// decay, and over every element without it, each element taken from the group its range says.
std::vector<std::vector<float>> two_groups(const AdamHyper& hyper) {
  std::vector<Tensor> decayed = make_params(), bare = make_params();
  AdamHyper none = hyper;
  none.weight_decay = 0.f;
  AdamW a(decayed, hyper), b(bare, none);
  std::vector<std::vector<float>> wa = train(a, decayed), wb = train(b, bare);
  for (size_t i = 0; i < kNumels.size(); ++i)
    for (const auto& [lo, hi] : kNoDecay[i])
      for (int64_t e = lo; e < hi; ++e)
        wa[i][static_cast<size_t>(e)] = wb[i][static_cast<size_t>(e)];
  return wa;
}

TEST(WeightDecayRanges, EveryOptimizerPathStepsTheRangesAsAGroupWithoutDecay) {
  for (const bool adamw_mode : {true, false}) {
    SCOPED_TRACE(adamw_mode ? "AdamW (decoupled)" : "Adam with L2");
    AdamHyper hyper;
    hyper.weight_decay = 0.5f;  // large, so that a decayed element is far from an undecayed one
    hyper.adamw_mode = adamw_mode;
    const std::vector<std::vector<float>> want = two_groups(hyper);
    {
      std::vector<Tensor> all = make_params();
      AdamW decay_all(all, hyper);
      const auto w = train(decay_all, all);
      EXPECT_FALSE(bitwise_equal(w[0], want[0])) << "the ranges must matter";
      EXPECT_TRUE(bitwise_equal(w[1], want[1])) << "a parameter without ranges is decayed whole";
    }
    std::vector<Tensor> ps = make_params();
    AdamW reference(ps, hyper, kNoDecay);
    const auto got = train(reference, ps);
    for (size_t i = 0; i < kNumels.size(); ++i)
      EXPECT_TRUE(bitwise_equal(got[i], want[i])) << "AdamW, parameter " << i;
    // HybridAdam in memory, with half and with all of the states on disk in slices of 1024
    // elements (slice ends fall inside ranges: [1000, 1030) of the 5000-element parameter).
    for (const double fraction : {0.0, 0.5, 1.0}) {
      SCOPED_TRACE(fraction);
      NvmeOffloadOptions nvme;
      nvme.fraction = fraction;
      nvme.slice_numel = 1024;
      nvme.window_bytes = 2 * 8 * 1024;
      HybridAdamOptions o(hyper, -1.f, nvme);
      o.no_decay = kNoDecay;
      std::vector<Tensor> hp = make_params();
      HybridAdam hybrid(hp, o);
      const auto w = train(hybrid, hp);
      hybrid.flush();
      for (size_t i = 0; i < kNumels.size(); ++i)
        EXPECT_TRUE(bitwise_equal(w[i], want[i])) << "HybridAdam, parameter " << i;
    }
  }
}

TEST(WeightDecayRanges, AListPerParameterIsRequired) {
  std::vector<Tensor> ps = make_params();
  EXPECT_THROW(AdamW(ps, AdamHyper{}, {NoDecayRanges{}}), InvalidArgument);
  HybridAdamOptions o;
  o.no_decay = {NoDecayRanges{}};
  EXPECT_THROW(HybridAdam(ps, o), InvalidArgument);
}

}  // namespace
}  // namespace mw::optim
