// The baseline, AVX2 and AVX-512 versions of the f32 loops (Note [Wider versions of f32 loops],
// fast_math.h): each version this CPU runs gives the baseline's results bit for bit, and each wide
// version runs code of its own. The second is about speed only and nothing in the results shows
// it: a helper that is not inlined into a version is its one baseline (SSE2) copy. Until session
// 30 the cross-entropy's forward was exactly that, GCC's AVX2 clone a jump to row_max_and_sum's
// SSE2 code (21.4 -> 10.3 ms per GPT-2 small B4 T128 step once inlined), so the test reads this
// binary's own machine code.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/cpu/fast_math.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace mw {
namespace {

using ops::F32Isa;

Tensor random_tensor(const Shape& shape, float scale, uint32_t seed) {
  Tensor t = Tensor::empty(shape);
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(gen);
  return t;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data<float>(), b.data<float>(), sizeof(float) * a.numel()) == 0;
}

// Restores the version the process started with.
struct IsaGuard {
  F32Isa saved = ops::f32_isa();
  ~IsaGuard() { ops::set_f32_isa(saved); }
};

// Every op whose f32 loops have versions, forward and backward, on shapes whose rows are not a
// multiple of any vector width (the versions' tails differ), with values that reach exp's clamps.
std::vector<Tensor> every_versioned_op() {
  std::vector<Tensor> out;
  const Tensor x = random_tensor({3, 37, 41}, 4.0f, 1), dy = random_tensor({3, 37, 41}, 1.0f, 2);
  out.push_back(ops::gelu(x));
  out.push_back(ops::gelu_backward(dy, x));
  const int64_t B = 2, T = 19, V = 1003;
  const Tensor logits = random_tensor({B, T, V}, 30.0f, 3);
  Tensor ids = Tensor::empty({B, T}, DType::I64);
  for (int64_t i = 0; i < B * T; ++i) ids.data<int64_t>()[i] = (i * 131) % V;
  auto [loss, lse] = ops::shifted_cross_entropy(logits, ids);
  out.push_back(loss);
  out.push_back(lse);
  Tensor dloss = Tensor::empty({});
  dloss.data<float>()[0] = 1.0f;
  out.push_back(ops::shifted_cross_entropy_backward(dloss, logits, lse, ids, false));
  const int64_t NH = 3, C = 3 * 8;
  const Tensor qkv = random_tensor({B, 77, 3 * C}, 2.0f, 4), dout = random_tensor({B, 77, C}, 1, 5);
  const ops::AttentionOut att = ops::attention(qkv, NH, 0.0, RngState{});
  out.push_back(att.out);
  out.push_back(att.att);
  out.push_back(ops::attention_backward(dout, qkv, att.att, NH, 0.0, RngState{}));
  return out;
}

TEST(F32Versions, EveryVersionThisCpuRunsIsBitwiseTheBaseline) {
  IsaGuard guard;
  ops::set_f32_isa(F32Isa::Baseline);
  const std::vector<Tensor> want = every_versioned_op();
  int versions = 0;
  for (F32Isa isa : {F32Isa::AVX2, F32Isa::AVX512}) {
    if (!ops::f32_isa_supported(isa)) continue;
    ++versions;
    ops::set_f32_isa(isa);
    const std::vector<Tensor> got = every_versioned_op();
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_TRUE(bitwise_equal(got[i], want[i])) << ops::f32_isa_name(isa) << " output " << i;
  }
  if (versions == 0) GTEST_SKIP() << "this CPU runs the baseline version only";
}

TEST(F32Versions, AnUnsupportedVersionIsRefused) {
  IsaGuard guard;
  if (ops::f32_isa_supported(F32Isa::AVX512)) GTEST_SKIP() << "this CPU runs every version";
  EXPECT_THROW(ops::set_f32_isa(F32Isa::AVX512), InvalidArgument);
}

struct WideScan {
  int versions = 0;
  std::vector<std::string> baseline_calls;  // "version: instruction" for each call out of one
};

// Reads `objdump -d` of this executable: the functions MW_F32_VERSIONS names *_on_avx2 and
// *_on_avx512, and in them each call or jump to another memwall function (a jump inside the
// function names it with a "+0x" offset; a call to libm or the C++ runtime is not memwall code).
WideScan scan_wide_versions() {
  WideScan scan;
  // /proc/self/exe read here: in the shell popen starts it would name the shell.
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string cmd = "objdump -d --no-show-raw-insn -C '" + self + "' 2>/dev/null";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return scan;
  std::string line, function;
  bool in_wide = false;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe)) {
    line = buf;
    if (!line.empty() && line.back() == '\n') line.pop_back();
    if (line.size() > 2 && line.back() == ':' && line[line.size() - 2] == '>') {
      function = line;
      in_wide = line.find("_on_avx2(") != std::string::npos ||
                line.find("_on_avx512(") != std::string::npos;
      scan.versions += in_wide;
      continue;
    }
    if (!in_wide) continue;
    const bool branch =
        line.find("\tcall") != std::string::npos || line.find("\tjmp") != std::string::npos;
    const size_t target = line.find('<');
    if (!branch || target == std::string::npos) continue;
    const std::string name = line.substr(target);
    const bool memwall = name.find("mw::") != std::string::npos;
    const bool inside = name.find("+0x") != std::string::npos;
    if (memwall && !inside) scan.baseline_calls.push_back(function + " " + line);
  }
  ::pclose(pipe);
  return scan;
}

TEST(F32Versions, EveryWideVersionRunsItsOwnCode) {
  const WideScan scan = scan_wide_versions();
  if (scan.versions == 0) GTEST_SKIP() << "no objdump here";
  for (const auto& call : scan.baseline_calls)
    ADD_FAILURE() << "a wide version calls baseline code (make the callee MW_F32_BODY): " << call;
  // Eight loops (gelu and its backward, the cross-entropy's two, the attention's four) in two
  // wide versions each: fewer found means this scan checks less than it claims.
  EXPECT_GE(scan.versions, 16);
}

}  // namespace
}  // namespace mw
