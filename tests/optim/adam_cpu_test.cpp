// Tests of the CPU Adam kernels (optim/adam_cpu.h): the scalar kernel against a double-precision
// hand computation of Note [Adam math], every SIMD ISA the CPU supports against the scalar kernel
// over the full option matrix, the parallel front-end against the serial one bitwise, and the
// ISA dispatch and argument errors.
#include "optim/adam_cpu.h"

#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "adam_test_util.h"
#include "core/error.h"
#include "optim/cpu/adam_kernels.h"

namespace mw::optim {
namespace {

using test::AdamProblem;
using test::compare_rel;
using test::make_problem;

// ---- Scalar kernel vs a double-precision hand computation ---------------------------------------

struct HandCase {
  bool adamw_mode, bias_correction;
  float weight_decay, div_scale;
  int64_t step;
};

TEST(AdamScalar, MatchesDoubleHandComputation) {
  const HandCase cases[] = {
      {true, true, 0.f, -1.f, 1},     {true, true, 0.01f, -1.f, 1}, {false, true, 0.01f, -1.f, 1},
      {true, true, 0.01f, 1024.f, 7}, {false, false, 0.1f, 8.f, 3}, {true, false, 0.f, -1.f, 100},
  };
  const int64_t numel = 4099;
  for (const HandCase& c : cases) {
    SCOPED_TRACE(testing::Message()
                 << "adamw " << c.adamw_mode << " bias_correction " << c.bias_correction << " wd "
                 << c.weight_decay << " div_scale " << c.div_scale << " step " << c.step);
    AdamHyper h;
    h.lr = 1e-3f;
    h.weight_decay = c.weight_decay;
    h.adamw_mode = c.adamw_mode;
    h.bias_correction = c.bias_correction;
    const float grad_scale = c.div_scale > 0 ? c.div_scale : 1.f;
    AdamProblem pr = make_problem(numel, DType::F32, grad_scale, 1234);
    const AdamProblem before = pr;
    adam_update(Isa::Scalar, h, c.step, c.div_scale, pr.param.data(), pr.grad(), DType::F32,
                pr.exp_avg.data(), pr.exp_avg_sq.data(), numel);

    // The formula of Note [Adam math], in double, written out the plain way (no fma).
    const double b1 = h.beta1, b2 = h.beta2, lr = h.lr, wd = h.weight_decay, eps = h.eps;
    const double bc1 = c.bias_correction ? 1.0 - std::pow(b1, double(c.step)) : 1.0;
    const double bc2 = c.bias_correction ? 1.0 - std::pow(b2, double(c.step)) : 1.0;
    int64_t bad = 0;
    double worst = 0.0;
    for (int64_t i = 0; i < numel; ++i) {
      double g = reinterpret_cast<const float*>(before.grad())[i];
      double p = before.param[i], m = before.exp_avg[i], v = before.exp_avg_sq[i];
      if (c.div_scale > 0) g /= c.div_scale;
      double g_scale = std::fabs(g);  // magnitude of the operands that formed g
      if (c.adamw_mode) {
        p -= lr * wd * p;
      } else {
        g += wd * p;
        g_scale += std::fabs(wd * p);
      }
      const double m_scale = b1 * std::fabs(m) + (1 - b1) * g_scale;
      m = b1 * m + (1 - b1) * g;
      const double v_scale = b2 * v + (1 - b2) * g_scale * g_scale;
      v = b2 * v + (1 - b2) * g * g;
      const double denom = std::sqrt(v) / std::sqrt(bc2) + eps;
      const double update = (lr / bc1) * m / denom;
      const double update_scale = (lr / bc1) * m_scale / denom;
      const double p_new = p - update;
      // Tolerances: the float kernel rounds about 10 times, each by <= 0.5 ulp (6e-8) of that
      // operation's result. Sums like m = b1*m + (1-b1)*g can cancel, so their error is bounded
      // relative to the magnitude of their operands (the *_scale values), not to the result;
      // that error then carries into the update through m. 1e-6 is ~16 roundings of the scale.
      const double err_m = std::fabs(pr.exp_avg[i] - m), tol_m = 1e-6 * m_scale + 1e-30;
      const double err_v = std::fabs(pr.exp_avg_sq[i] - v), tol_v = 1e-6 * v_scale + 1e-30;
      const double err_p = std::fabs(pr.param[i] - p_new);
      const double tol_p = 1e-6 * (std::fabs(p) + update_scale);
      // Written so that a NaN from the kernel fails (it compares false with every bar).
      const double r = std::max({err_m / tol_m, err_v / tol_v, err_p / tol_p});
      const bool ok = err_m <= tol_m && err_v <= tol_v && err_p <= tol_p;
      worst = std::max(worst, std::isnan(r) ? INFINITY : r);
      if (!ok) {
        if (bad < 5) {
          std::printf("  [%lld] p %.9g/%.9g m %.9g/%.9g v %.9g/%.9g (got/want)\n",
                      static_cast<long long>(i), pr.param[i], p_new, pr.exp_avg[i], m,
                      pr.exp_avg_sq[i], v);
        }
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0) << "worst error / tolerance " << worst;
  }
}

// At t = 1 with bias correction and m = v = 0, Adam moves every weight by lr * g / (|g| + eps),
// i.e. by almost exactly lr against the sign of its gradient.
TEST(AdamScalar, FirstStepMovesByLearningRate) {
  const int64_t numel = 257;
  AdamProblem pr = make_problem(numel, DType::F32, 1.f, 99);
  std::fill(pr.exp_avg.begin(), pr.exp_avg.end(), 0.f);
  std::fill(pr.exp_avg_sq.begin(), pr.exp_avg_sq.end(), 0.f);
  const std::vector<float> p0 = pr.param;
  AdamHyper h;  // defaults: lr 1e-3, no weight decay
  adam_update(Isa::Scalar, h, 1, -1.f, pr.param.data(), pr.grad(), DType::F32, pr.exp_avg.data(),
              pr.exp_avg_sq.data(), numel);
  const float* g = static_cast<const float*>(pr.grad());
  for (int64_t i = 0; i < numel; ++i) {
    const double moved = double(p0[i]) - pr.param[i];
    const double want = 1e-3 * (g[i] > 0 ? 1.0 : -1.0) * std::fabs(g[i]) / (std::fabs(g[i]) + 1e-8);
    // 2e-7 absolute: p0 - p1 is computed from two floats with |p| <= 1, whose ulp is <= 1.2e-7,
    // so the measured move carries up to one ulp of p1 besides the kernel's own rounding.
    ASSERT_NEAR(moved, want, 2e-7) << "element " << i << " g " << g[i];
  }
}

// ---- Every SIMD ISA vs the scalar kernel
// ---------------------------------------------------------

struct IsaCase {
  DType grad_dtype;
  bool adamw_mode, bias_correction;
  float div_scale;
};

std::vector<IsaCase> all_isa_cases() {
  std::vector<IsaCase> out;
  for (DType d : {DType::F32, DType::F16, DType::BF16}) {
    for (bool adamw : {true, false}) {
      for (bool bc : {true, false}) {
        for (float div : {-1.f, 512.f}) out.push_back({d, adamw, bc, div});
      }
    }
  }
  return out;
}

// Runs `steps` steps with `isa` and with the scalar kernel on the same problem and compares.
void expect_isa_matches_scalar(Isa isa, int64_t numel, int steps) {
  for (const IsaCase& c : all_isa_cases()) {
    SCOPED_TRACE(testing::Message()
                 << isa_name(isa) << " grad " << dtype_name(c.grad_dtype) << " adamw "
                 << c.adamw_mode << " bias_correction " << c.bias_correction << " div_scale "
                 << c.div_scale << " numel " << numel);
    AdamHyper h;
    h.weight_decay = 0.01f;
    h.adamw_mode = c.adamw_mode;
    h.bias_correction = c.bias_correction;
    const float grad_scale = c.div_scale > 0 ? c.div_scale : 1.f;
    AdamProblem simd = make_problem(numel, c.grad_dtype, grad_scale, 42 + int(numel));
    AdamProblem ref = simd;
    for (int t = 1; t <= steps; ++t) {
      adam_update(isa, h, t, c.div_scale, simd.param.data(), simd.grad(), c.grad_dtype,
                  simd.exp_avg.data(), simd.exp_avg_sq.data(), numel);
      adam_update(Isa::Scalar, h, t, c.div_scale, ref.param.data(), ref.grad(), c.grad_dtype,
                  ref.exp_avg.data(), ref.exp_avg_sq.data(), numel);
    }
    // 1e-6 relative: both kernels perform the same correctly rounded operations in the same order
    // (Note [Adam math]), so they should agree bitwise (compare_rel reports any non-bitwise
    // element); 1e-6 (~8 ulp) leaves room only for a compiler reordering one operation.
    EXPECT_EQ(compare_rel("param", simd.param, ref.param, 1e-6), 0);
    EXPECT_EQ(compare_rel("exp_avg", simd.exp_avg, ref.exp_avg, 1e-6), 0);
    EXPECT_EQ(compare_rel("exp_avg_sq", simd.exp_avg_sq, ref.exp_avg_sq, 1e-6), 0);
  }
}

class AdamIsa : public testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam())) {
      GTEST_SKIP() << "this CPU lacks " << isa_name(GetParam()) << "; its kernel is not run here";
    }
  }
};

TEST_P(AdamIsa, MatchesScalarOnOddNumelOverSeveralSteps) {
  // 1000003 is prime: every vector width leaves a tail.
  expect_isa_matches_scalar(GetParam(), 1000003, 3);
}

TEST_P(AdamIsa, MatchesScalarOnEveryTailLength) {
  for (int64_t numel = 0; numel <= 40; ++numel) expect_isa_matches_scalar(GetParam(), numel, 2);
}

TEST_P(AdamIsa, UnalignedPointers) {
  // Views into a buffer at an odd element offset: kernels must not assume alignment.
  const int64_t numel = 1001, offset = 3;
  AdamHyper h;
  AdamProblem a = make_problem(numel + offset, DType::F16, 1.f, 5), b = a;
  auto grad_at = [&](const AdamProblem& pr) {
    return static_cast<const uint16_t*>(pr.grad()) + offset;
  };
  adam_update(GetParam(), h, 1, -1.f, a.param.data() + offset, grad_at(a), DType::F16,
              a.exp_avg.data() + offset, a.exp_avg_sq.data() + offset, numel);
  adam_update(Isa::Scalar, h, 1, -1.f, b.param.data() + offset, grad_at(b), DType::F16,
              b.exp_avg.data() + offset, b.exp_avg_sq.data() + offset, numel);
  // Same reasoning as above: bitwise expected, 1e-6 relative allowed.
  EXPECT_EQ(compare_rel("param", a.param, b.param, 1e-6), 0);
}

INSTANTIATE_TEST_SUITE_P(AllIsas, AdamIsa, testing::Values(Isa::AVX2, Isa::AVX512),
                         [](const testing::TestParamInfo<Isa>& info) {
                           return std::string(isa_name(info.param));
                         });

// ---- Parallel front-end
// --------------------------------------------------------------------------

TEST(AdamParallel, BitwiseEqualToSerial) {
  const int64_t numel = 1000003;  // 16 tasks of kAdamGrainNumel, the last one short and odd
  tbb::global_control threads(tbb::global_control::max_allowed_parallelism, 4);
  for (Isa isa : supported_isas()) {
    for (DType d : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(testing::Message() << isa_name(isa) << " " << dtype_name(d));
      AdamHyper h;
      h.weight_decay = 0.01f;
      AdamProblem par = make_problem(numel, d, 1.f, 7), ser = par;
      for (int t = 1; t <= 2; ++t) {
        adam_update_parallel(isa, h, t, -1.f, par.param.data(), par.grad(), d, par.exp_avg.data(),
                             par.exp_avg_sq.data(), numel);
        adam_update(isa, h, t, -1.f, ser.param.data(), ser.grad(), d, ser.exp_avg.data(),
                    ser.exp_avg_sq.data(), numel);
      }
      // Elements are independent, so the split cannot change any bit: compare exactly.
      EXPECT_EQ(compare_rel("param", par.param, ser.param, 0.0), 0);
      EXPECT_EQ(compare_rel("exp_avg", par.exp_avg, ser.exp_avg, 0.0), 0);
      EXPECT_EQ(compare_rel("exp_avg_sq", par.exp_avg_sq, ser.exp_avg_sq, 0.0), 0);
      EXPECT_EQ(std::memcmp(par.param.data(), ser.param.data(), numel * 4), 0);
    }
  }
}

// ---- Dispatch and errors
// -------------------------------------------------------------------------

TEST(AdamDispatch, IsaNamesRoundTrip) {
  for (Isa isa : {Isa::Scalar, Isa::AVX2, Isa::AVX512}) EXPECT_EQ(parse_isa(isa_name(isa)), isa);
  EXPECT_THROW(parse_isa("sse4"), InvalidArgument);
  EXPECT_TRUE(isa_supported(Isa::Scalar));
  EXPECT_EQ(supported_isas().front(), Isa::Scalar);
}

// Restores MW_ADAM_ISA when a test that sets it ends.
class ScopedIsaEnv {
 public:
  explicit ScopedIsaEnv(const char* value) {
    if (const char* old = std::getenv("MW_ADAM_ISA")) old_ = old, had_ = true;
    setenv("MW_ADAM_ISA", value, 1);
  }
  ~ScopedIsaEnv() {
    if (had_) {
      setenv("MW_ADAM_ISA", old_.c_str(), 1);
    } else {
      unsetenv("MW_ADAM_ISA");
    }
  }

 private:
  std::string old_;
  bool had_ = false;
};

TEST(AdamDispatch, BestIsaIsFastestSupportedAndHonoursOverride) {
  {
    ScopedIsaEnv env("");
    EXPECT_EQ(best_isa(), supported_isas().back());
  }
  {
    ScopedIsaEnv env("scalar");
    EXPECT_EQ(best_isa(), Isa::Scalar);
  }
  {
    ScopedIsaEnv env("neon");
    EXPECT_THROW(best_isa(), InvalidArgument);
  }
  if (!isa_supported(Isa::AVX512)) {
    ScopedIsaEnv env("avx512");
    EXPECT_THROW(best_isa(), InvalidArgument);
  }
}

TEST(AdamDispatch, RejectsBadArguments) {
  std::vector<float> p(8), m(8), v(8), g(8);
  AdamHyper h;
  EXPECT_THROW(
      adam_update(Isa::Scalar, h, 0, -1.f, p.data(), g.data(), DType::F32, m.data(), v.data(), 8),
      InvalidArgument);  // step is 1-based
  EXPECT_THROW(
      adam_update(Isa::Scalar, h, 1, -1.f, p.data(), g.data(), DType::F64, m.data(), v.data(), 8),
      InvalidArgument);  // no f64 gradients
  EXPECT_THROW(
      adam_update(Isa::Scalar, h, 1, -1.f, p.data(), nullptr, DType::F32, m.data(), v.data(), 8),
      InvalidArgument);
  EXPECT_THROW(
      adam_update(Isa::Scalar, h, 1, -1.f, p.data(), g.data(), DType::F32, m.data(), v.data(), -1),
      InvalidArgument);
  AdamHyper bad_beta;
  bad_beta.beta2 = 1.f;
  EXPECT_THROW(make_adam_step_scalars(bad_beta, 1, -1.f), InvalidArgument);
  for (Isa isa : {Isa::AVX2, Isa::AVX512}) {
    if (!isa_supported(isa)) {
      EXPECT_THROW(
          adam_update(isa, h, 1, -1.f, p.data(), g.data(), DType::F32, m.data(), v.data(), 8),
          InvalidArgument);
    }
  }
  // numel 0 with null pointers is a valid no-op.
  EXPECT_NO_THROW(adam_update_parallel(Isa::Scalar, h, 1, -1.f, nullptr, nullptr, DType::F32,
                                       nullptr, nullptr, 0));
}

}  // namespace
}  // namespace mw::optim
