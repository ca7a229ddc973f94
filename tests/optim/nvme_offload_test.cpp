// NVMe offload of Adam states (optim/nvme_states.h, HybridAdam with nvme.fraction > 0) against the
// in-memory optimizers: every comparison is bitwise, because slicing an elementwise update and
// moving its states through disk changes no arithmetic (Note [NVMe slices]).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "data/random_tokens.h"
#include "models/gpt2/model.h"
#include "nvme_test_util.h"
#include "optim/hybrid_adam.h"
#include "optim/optimizer.h"

namespace mw::optim {
namespace {

namespace fs = std::filesystem;
using namespace test;  // nvme_test_util.h

TEST(NvmeSelect, GreedyInParameterOrderUpToTheFlooredFraction) {
  // total 100; fraction 0.5 -> limit 50: 30 taken, 40 skipped (70 > 50), 20 taken (50), 10 skipped.
  EXPECT_EQ(select_nvme_offloaded({30, 40, 20, 10}, 0.5), (std::vector<bool>{1, 0, 1, 0}));
  EXPECT_EQ(select_nvme_offloaded({30, 40, 20, 10}, 1.0), (std::vector<bool>{1, 1, 1, 1}));
  EXPECT_EQ(select_nvme_offloaded({30, 40, 20, 10}, 0.0), (std::vector<bool>{0, 0, 0, 0}));
  EXPECT_EQ(select_nvme_offloaded({3, 3}, 0.49), (std::vector<bool>{0, 0}));  // floor(2.94) = 2
  EXPECT_THROW(select_nvme_offloaded({1}, 1.5), InvalidArgument);
  EXPECT_THROW(select_nvme_offloaded({1}, -0.1), InvalidArgument);
}

TEST(NvmeOffload, StepPathMatchesAdamWBitwiseAtEveryFraction) {
  AdamHyper hyper;
  hyper.weight_decay = 0.01f;
  std::vector<Tensor> ref_params = make_params(7);
  AdamW ref(ref_params, hyper);
  for (int s = 0; s < 5; ++s) {
    set_grads(ref_params, s, s == 3);
    ref.step();
  }
  for (double fraction : {0.0, 0.5, 1.0}) {
    SCOPED_TRACE(fraction);
    std::vector<Tensor> ps = make_params(7);
    HybridAdam opt(ps, HybridAdamOptions(hyper, -1.f, small_nvme(fraction)));
    for (int s = 0; s < 5; ++s) {
      set_grads(ps, s, s == 3);
      opt.step();
    }
    if (fraction == 1.0) {
      ASSERT_NE(opt.nvme(), nullptr);
      opt.flush();  // the last write-backs overlap what follows step(); count them too
      const NvmeStats st = opt.nvme()->stats();
      // Per step, m+v of every slice padded to 4096: 3000 -> 3 slices (24576 B), 1024 -> 8192,
      // 100 -> 4096, 5000 -> 5 slices (40960), 7 -> 4096: 81920 B. Five steps, one of which skips
      // the 100-element parameter. Reads: steps 2..5 read what the previous one wrote (a prefetched
      // slice of a skipped parameter may be kept for the next step instead of read again), and
      // after the last step the pump may already read ahead for a next one (at most the two slots).
      EXPECT_EQ(st.bytes_written, 5 * 81920 - 4096);
      EXPECT_GE(st.bytes_read, 4 * 81920 - 4096);
      EXPECT_LE(st.bytes_read, 4 * 81920 + 2 * 8192);
      EXPECT_LE(st.staging_bytes, 3 * 8 * 1024);  // two slots and at most one spare
      EXPECT_EQ(opt.state_bytes_in_memory(), st.staging_bytes);
      // Every transfer went through the registered slots (Note [Registered buffers]).
      if (opt.nvme()->engine().backend_name() == "uring") {
        EXPECT_TRUE(st.registered_slots);
        EXPECT_GT(st.fixed_transfers, 0);
      }
    }
    for (size_t i = 0; i < ps.size(); ++i) {
      EXPECT_EQ(bit_mismatches("param", ps[i], ref_params[i]), 0) << "param " << i;
      auto [m, v] = opt.state_copy(i);
      EXPECT_EQ(bit_mismatches("m", m, ref.exp_avg(i)), 0) << "param " << i;
      EXPECT_EQ(bit_mismatches("v", v, ref.exp_avg_sq(i)), 0) << "param " << i;
    }
  }
}

// ---- tiny GPT-2: updates run inside backward, from grad-ready hooks --------------------------

struct RunResult {
  std::vector<float> losses;
  std::vector<Tensor> params;
};

RunResult train_tiny(const std::string& optimizer, double fraction, int steps) {
  gpt2::GPT2 model(tiny_config(), 0, DType::F32);
  std::unique_ptr<Optimizer> opt;
  if (optimizer == "adamw")
    opt = std::make_unique<AdamW>(model.parameters());
  else
    opt = std::make_unique<HybridAdam>(model.parameters(),
                                       HybridAdamOptions({}, -1.f, small_nvme(fraction)));
  RunResult r;
  for (int s = 0; s < steps; ++s) r.losses.push_back(train_step(model, *opt, s));
  for (const Tensor& p : model.parameters()) r.params.push_back(p.clone());
  return r;
}

void expect_same_run(const RunResult& got, const RunResult& want) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t s = 0; s < got.losses.size(); ++s)
    EXPECT_EQ(std::memcmp(&got.losses[s], &want.losses[s], 4), 0)
        << "step " << s << ": loss " << got.losses[s] << " vs " << want.losses[s];
  for (size_t i = 0; i < got.params.size(); ++i)
    EXPECT_EQ(bit_mismatches("param", got.params[i], want.params[i]), 0) << "param " << i;
}

TEST(NvmeOffload, TinyGpt2FractionsAreBitwiseIdenticalToAdamW) {
  const RunResult ref = train_tiny("adamw", 0.0, 4);
  for (double fraction : {0.0, 0.5, 1.0}) {
    SCOPED_TRACE(fraction);
    expect_same_run(train_tiny("hybridadam", fraction, 4), ref);
  }
}

TEST(NvmeOffload, OffloadedUpdatesRunDuringBackward) {
  gpt2::GPT2 model(tiny_config(), 0, DType::F32);
  HybridAdam opt(model.parameters(), HybridAdamOptions({}, -1.f, small_nvme(1.0)));
  train_step(model, opt, 0);
  const int64_t B = 2, T = 16;
  std::vector<int32_t> tokens(static_cast<size_t>(B * T));
  data::random_tokens(3, 1, B, T, model.config().vocab_size, tokens.data());
  Tensor ids = Tensor::from_vector(tokens, {B, T});
  opt.zero_grad();
  backward(shifted_cross_entropy(model(ids), ids));
  // Every parameter got its gradient, so every one was updated by its hook before step().
  // The tied embedding's row split included: its rows were handed over by its grad-ready hook, so
  // step() owes no parameter an update (awaits_update, the store's side of the narrow interface).
  for (int k = 0; k < opt.nvme()->param_count(); ++k) {
    EXPECT_TRUE(opt.nvme()->updated_this_step(k));
    EXPECT_FALSE(opt.nvme()->awaits_update(k)) << "param " << k;
  }
  EXPECT_GT(opt.nvme()->stats().split_rows, 0);  // the row split did happen
  opt.step();
  // The second step read states written by the first, ahead of their use, in the recorded order.
  std::vector<SliceTiming> tl = opt.nvme()->last_timeline();
  ASSERT_FALSE(tl.empty());
  int64_t read_ahead = 0;
  for (const SliceTiming& t : tl) {
    EXPECT_GE(t.compute_start_ms, 0);
    EXPECT_GE(t.write_done_ms, t.write_issue_ms);
    if (t.read_issue_ms >= 0 && t.read_done_ms <= t.compute_start_ms) ++read_ahead;
  }
  EXPECT_GT(read_ahead, 0);
}

TEST(NvmeOffload, SaveLoadContinueGivesBitwiseEqualLosses) {
  const RunResult full = train_tiny("hybridadam", 1.0, 5);
  fs::path ckpt = fs::temp_directory_path() / ("mw_nvme_ckpt_" + std::to_string(::getpid()));
  std::vector<Tensor> saved_params;
  std::vector<float> losses;
  {
    gpt2::GPT2 model(tiny_config(), 0, DType::F32);
    HybridAdam opt(model.parameters(), HybridAdamOptions({}, -1.f, small_nvme(1.0)));
    for (int s = 0; s < 2; ++s) losses.push_back(train_step(model, opt, s));
    opt.save_state(ckpt.string());
    for (const Tensor& p : model.parameters()) saved_params.push_back(p.clone());
  }
  // Resume with another placement too: segments map onto any slicing.
  for (double fraction : {1.0, 0.5}) {
    SCOPED_TRACE(fraction);
    gpt2::GPT2 model(tiny_config(), 99, DType::F32);  // other init, overwritten below
    std::vector<Tensor> ps = model.parameters();
    for (size_t i = 0; i < ps.size(); ++i) ps[i].copy_(saved_params[i]);
    NvmeOffloadOptions nv = small_nvme(fraction);
    nv.slice_numel = 2048;
    HybridAdam opt(ps, HybridAdamOptions({}, -1.f, nv));
    opt.load_state(ckpt.string());
    EXPECT_EQ(opt.step_count(), 2);
    RunResult resumed{losses, {}};
    for (int s = 2; s < 5; ++s) resumed.losses.push_back(train_step(model, opt, s));
    for (const Tensor& p : ps) resumed.params.push_back(p.clone());
    expect_same_run(resumed, full);
  }
  fs::remove(ckpt);
}

TEST(NvmeOffload, UnusableDirectoryIsAClearIoError) {
  fs::path file = fs::temp_directory_path() / ("mw_nvme_notadir_" + std::to_string(::getpid()));
  { std::ofstream(file.string()) << "x"; }
  std::vector<Tensor> ps = make_params(1);
  // Under a regular file (ENOTDIR), and in sysfs, which even root cannot write to (EPERM): tests
  // run as root here, so permission bits alone would not refuse anything.
  for (const fs::path& dir : {file / "sub", fs::path("/sys/memwall-nvme-test")}) {
    SCOPED_TRACE(dir.string());
    if (dir.string().rfind("/sys", 0) == 0 && !fs::is_directory("/sys/kernel")) continue;
    try {
      HybridAdam opt(ps, HybridAdamOptions({}, -1.f, small_nvme(1.0, dir.string())));
      FAIL() << "expected IoError";
    } catch (const IoError& e) {
      EXPECT_NE(e.err, 0);
      EXPECT_NE(std::string(e.what()).find(dir.string()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("pass a directory you can write to"), std::string::npos)
          << e.what();
    }
  }
  fs::remove(file);
}

TEST(NvmeOffload, NoFileOutlivesTheOptimizerAndAGivenDirectoryIsKept) {
  // A TMPDIR of this test's own: other tests running beside it (ctest -j) make and remove their
  // private directories in the shared one, which would change the count.
  const fs::path own_tmp =
      fs::temp_directory_path() / ("mw_nvme_tmp_" + std::to_string(::getpid()));
  fs::create_directories(own_tmp);
  const char* old_tmpdir = std::getenv("TMPDIR");
  const std::string saved = old_tmpdir ? old_tmpdir : "";
  ::setenv("TMPDIR", own_tmp.c_str(), 1);
  auto count_private = [] {
    int n = 0;
    for (auto& e : fs::directory_iterator(fs::temp_directory_path()))
      if (e.path().filename().string().rfind("memwall-nvme-", 0) == 0) ++n;
    return n;
  };
  const int private_before = count_private();
  fs::path given = fs::temp_directory_path() / ("mw_nvme_given_" + std::to_string(::getpid()));
  fs::create_directories(given);
  { std::ofstream((given / "user_file").string()) << "keep me"; }
  {
    std::vector<Tensor> a = make_params(1), b = make_params(2);
    HybridAdam private_opt(a, HybridAdamOptions({}, -1.f, small_nvme(1.0)));
    HybridAdam given_opt(b, HybridAdamOptions({}, -1.f, small_nvme(1.0, given.string())));
    set_grads(a, 0, false);
    set_grads(b, 0, false);
    private_opt.step();
    given_opt.step();
    // Already gone while in use (Note [NVMe files]): the files are unlinked, the private dir
    // removed.
    EXPECT_EQ(count_private(), private_before);
    int entries = 0;
    for (auto& e : fs::directory_iterator(given)) entries += e.path().filename() != "user_file";
    EXPECT_EQ(entries, 0);
    EXPECT_GT(given_opt.nvme()->stats().file_bytes, 0);
  }
  EXPECT_TRUE(fs::exists(given / "user_file"));
  fs::remove_all(given);
  if (old_tmpdir)
    ::setenv("TMPDIR", saved.c_str(), 1);
  else
    ::unsetenv("TMPDIR");
  fs::remove_all(own_tmp);
}

// Note [Update in backward] for in-memory states: the same bits as AdamW's step(), with every
// gradient freed by the time backward returns.
TEST(HybridAdamUpdateInBackward, BitwiseEqualToAdamWAndGradientsAreFreed) {
  const RunResult ref = train_tiny("adamw", 0.0, 4);
  gpt2::GPT2 model(tiny_config(), 0, DType::F32);
  HybridAdamOptions options;
  options.update_in_backward = true;
  HybridAdam opt(model.parameters(), options);
  RunResult got;
  for (int s = 0; s < 4; ++s)
    got.losses.push_back(train_step(model, opt, s, [&] {
      for (const Tensor& p : model.parameters())
        EXPECT_FALSE(grad(p).defined()) << "a spent gradient was kept";
    }));
  for (const Tensor& p : model.parameters()) got.params.push_back(p.clone());
  expect_same_run(got, ref);
}

TEST(HybridAdamPlacement, SimParametersKeepStatesInHostMemoryUnlessAskedOtherwise) {
  for (bool on_host : {true, false}) {
    Tensor p = Tensor::full({1000}, 0.5, DType::F32, Device::sim(5));
    set_requires_grad(p);
    set_grad(p, Tensor::full({1000}, 0.25, DType::F32, Device::sim(5)));
    HybridAdamOptions options;
    options.states_on_host = on_host;
    HybridAdam opt({p}, options);
    opt.step();
    EXPECT_EQ(opt.exp_avg(0).device(), on_host ? Device::cpu() : Device::sim(5));
    EXPECT_EQ(opt.exp_avg_sq(0).device(), on_host ? Device::cpu() : Device::sim(5));
    // One step of Adam moves every weight by lr (the normalised first step): 0.5 - 1e-3.
    EXPECT_FLOAT_EQ(p.to_vector<float>()[7], 0.5f - 1e-3f);
  }
}

// Placed states win over the NVMe fraction: Gemini keeps the states of a chunk its policy leaves
// on the device there (static --offload-optim-frac 0), and a host budget (three tiers, fraction
// 1) sends only the host-placed ones to disk. Both were offloaded before: sim is host-addressable.
TEST(HybridAdamPlacement, StatesPlacedOnTheDeviceStayOffDisk) {
  std::vector<Tensor> ps;
  for (int i = 0; i < 2; ++i) {
    ps.push_back(Tensor::full({4096}, 0.5, DType::F32, Device::sim(5)));
    set_requires_grad(ps.back());
    set_grad(ps.back(), Tensor::full({4096}, 0.25, DType::F32, Device::sim(5)));
  }
  HybridAdamOptions options({}, -1.f, small_nvme(1.0));
  options.update_in_backward = false;
  options.state_devices = {Device::sim(5), Device::cpu()};
  HybridAdam opt(ps, options);
  EXPECT_FALSE(opt.offloaded(0));
  EXPECT_TRUE(opt.offloaded(1));
  opt.step();
  EXPECT_EQ(opt.exp_avg(0).device(), Device::sim(5));
  for (const Tensor& p : ps) EXPECT_FLOAT_EQ(p.to_vector<float>()[7], 0.5f - 1e-3f);
}

// Note [Row-split update]: the tied wte is stepped in two parts (all rows but the batch's tokens
// after the LM head's backward, those rows at the end), its pending rows' pages are held in RAM
// and laid over the next reads. Parameters, m and v (read back through that overlay) must equal
// AdamW's bit for bit.
TEST(NvmeOffload, TiedEmbeddingSteppedInTwoPartsEqualsAdamWBitwise) {
  gpt2::GPT2 ref_model(tiny_config(), 0, DType::F32);
  AdamW ref(ref_model.parameters());
  gpt2::GPT2 model(tiny_config(), 0, DType::F32);
  HybridAdam opt(model.parameters(), HybridAdamOptions({}, -1.f, small_nvme(1.0)));
  for (int s = 0; s < 4; ++s) {
    const float want = train_step(ref_model, ref, s);
    const float got = train_step(model, opt, s);
    EXPECT_EQ(std::memcmp(&got, &want, 4), 0) << "step " << s;
  }
  // The last batch's distinct tokens were the pending rows.
  std::vector<int32_t> tokens(2 * 16);
  data::random_tokens(3, 3, 2, 16, model.config().vocab_size, tokens.data());
  std::sort(tokens.begin(), tokens.end());
  const auto distinct = std::unique(tokens.begin(), tokens.end()) - tokens.begin();
  const NvmeStats st = opt.nvme()->stats();
  EXPECT_EQ(st.split_rows, distinct);
  // The two read streams (split table, the rest) keep every slice read ahead, even though the
  // updater interleaves them by timing; and the first step learns the table comes first.
  EXPECT_EQ(st.spare_slices, 0);
  EXPECT_GT(st.held_bytes, 0);
  // Each pending row holds at most two pages of m and two of v.
  EXPECT_LE(st.held_bytes, distinct * 4 * 4096);
  std::vector<Tensor> ps = model.parameters(), ref_ps = ref_model.parameters();
  ASSERT_EQ(ps[0].dim(), 2);  // wte comes first and is offloaded
  ASSERT_TRUE(opt.offloaded(0));
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(bit_mismatches("param", ps[i], ref_ps[i]), 0) << "param " << i;
    auto [m, v] = opt.state_copy(i);
    EXPECT_EQ(bit_mismatches("m", m, ref.exp_avg(i)), 0) << "param " << i;
    EXPECT_EQ(bit_mismatches("v", v, ref.exp_avg_sq(i)), 0) << "param " << i;
  }
}

TEST(NvmeOffload, WithBorrowedSlotsTheResultIsTheSame) {
  const RunResult ref = train_tiny("adamw", 0.0, 3);
  gpt2::GPT2 model(tiny_config(), 0, DType::F32);
  NvmeOffloadOptions nvme = small_nvme(1.0);
  nvme.borrow_gradient_slots = true;
  HybridAdam opt(model.parameters(), HybridAdamOptions({}, -1.f, nvme));
  RunResult got;
  for (int s = 0; s < 3; ++s) got.losses.push_back(train_step(model, opt, s));
  for (const Tensor& p : model.parameters()) got.params.push_back(p.clone());
  expect_same_run(got, ref);
  EXPECT_GT(opt.nvme()->stats().borrowed_bytes_max, 0);  // spent gradients did serve as slots
}

}  // namespace
}  // namespace mw::optim
