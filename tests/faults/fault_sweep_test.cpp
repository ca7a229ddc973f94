// Fault injection at every stage (issue #14 item 5): one training step of a tiny GPT-2 is run again
// and again, each time with the k-th I/O request of that step failing (EIO for a read, ENOSPC for a
// write), over every request of the step. Two owners of disk traffic are swept:
//  - HybridAdam with every Adam state on NVMe (Note [NVMe failure guarantee], optim/nvme_states.h):
//    the step reports an IoError and every element's (p, m, v) is all old or all new;
//  - Gemini with three tiers, chunks and states on disk (docs/gemini.md, "Failure guarantee"): the
//    step reports an IoError, each parameter is wholly old or wholly new (a chunk is stepped
//    whole), and the parameters can still be read (saved) afterwards.
// Either way no file is left once the owner is gone. A slow device and short transfers on every
// request are not failures: the run must be bitwise the clean run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "../gemini/dir_entries.h"
#include "autograd/functions.h"
#include "core/allocator.h"
#include "core/random.h"
#include "data/random_tokens.h"
#include "models/gpt2/model.h"
#include "offload/gemini/gemini.h"
#include "optim/hybrid_adam.h"
#include "optim/nvme_states.h"
#include "optim/optimizer.h"

namespace mw {
namespace {

using testing::entries;
using Weights = std::vector<std::vector<float>>;

gpt2::Config tiny() {
  gpt2::Config c = gpt2::Config::preset("tiny");
  c.n_layer = 2;
  c.n_embd = 64;
  c.vocab_size = 257;
  c.set_dropout(0.0);
  return c;
}

// Removed with rmdir only: a file left behind keeps it, and the tests name it.
struct TempDir {
  std::string path;
  TempDir() {
    char name[] = "/tmp/mw-faults-XXXXXX";
    if (::mkdtemp(name) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = name;
  }
  ~TempDir() { ::rmdir(path.c_str()); }
};

void one_step(gpt2::GPT2& model, optim::Optimizer& opt, int64_t step, const Device& device) {
  std::vector<int32_t> tokens(2 * 16);
  data::random_tokens(7, step, 2, 16, model.config().vocab_size, tokens.data());
  Tensor ids = Tensor::from_vector(tokens, {2, 16}, device);
  opt.zero_grad();
  Tensor logits = model(ids);
  Tensor loss = shifted_cross_entropy(logits, ids);
  logits = Tensor();
  backward(loss);
  opt.step();
}

// What one injector does: fail request number `fail_at` counted from arming (-1: none), and
// optionally slow every request down or cut every transfer short.
struct Injection {
  std::atomic<int64_t> seen{0};
  int64_t fail_at = -1;
  bool slow = false;
  bool short_transfers = false;
  io::FaultInjector injector() {
    return [this](const io::IoRequest& r, int64_t) {
      io::Fault f;
      const int64_t k = seen.fetch_add(1);
      if (k == fail_at) f.error = r.op == io::IoOp::kRead ? EIO : ENOSPC;
      if (slow) std::this_thread::sleep_for(std::chrono::microseconds(300));
      if (short_transfers && r.length > 4096) f.short_bytes = 4096;  // O_DIRECT: block multiples
      return f;
    };
  }
};

// Up to `most` request indices spread over [0, n), always with the first and the last.
std::vector<int64_t> sweep(int64_t n, int64_t most) {
  std::vector<int64_t> ks;
  for (int64_t i = 0; i < std::min(n, most); ++i)
    ks.push_back(n <= most ? i : i * (n - 1) / (most - 1));
  return ks;
}

// Element e of tensor t is old or new in every one of p, m, v (Note [NVMe failure guarantee]).
bool all_old_or_all_new(const std::vector<const float*>& got, const std::vector<const float*>& old,
                        const std::vector<const float*>& neu, int64_t e) {
  bool is_old = true, is_new = true;
  for (size_t t = 0; t < got.size(); ++t) {
    is_old = is_old && std::memcmp(got[t] + e, old[t] + e, 4) == 0;
    is_new = is_new && std::memcmp(got[t] + e, neu[t] + e, 4) == 0;
  }
  return is_old || is_new;
}

// ---- HybridAdam, every state on NVMe -----------------------------------------------------------

optim::HybridAdamOptions nvme_adam(const std::string& dir) {
  optim::HybridAdamOptions o;
  o.update_in_backward = true;  // gpt2_train's default: the riskiest interleaving
  o.nvme.fraction = 1.0;
  o.nvme.dir = dir;
  o.nvme.slice_numel = 1024;
  o.nvme.window_bytes = 2 * 8 * 1024;
  return o;
}

// (p, m, v) of every parameter after `steps` clean AdamW steps: the reference.
std::vector<std::array<std::vector<float>, 3>> adamw_states(int steps) {
  gpt2::GPT2 model(tiny(), 0, DType::F32);
  optim::AdamW opt(model.parameters());
  for (int s = 0; s < steps; ++s) one_step(model, opt, s, Device::cpu());
  std::vector<std::array<std::vector<float>, 3>> out;
  std::vector<Tensor> ps = model.parameters();
  for (size_t i = 0; i < ps.size(); ++i)
    out.push_back({ps[i].to_vector<float>(), opt.exp_avg(i).to_vector<float>(),
                   opt.exp_avg_sq(i).to_vector<float>()});
  return out;
}

TEST(FaultSweep, EveryRequestOfAnNvmeAdamStepFailsCleanly) {
  const std::vector<std::vector<std::array<std::vector<float>, 3>>> ref = {
      adamw_states(2), adamw_states(3), adamw_states(4)};
  // How many requests a clean third step makes (with the reads ahead for the fourth).
  int64_t requests = 0;
  {
    TempDir dir;
    Injection count;  // outlives the optimizer, whose threads call it (declared first)
    gpt2::GPT2 model(tiny(), 0, DType::F32);
    optim::HybridAdam opt(model.parameters(), nvme_adam(dir.path));
    for (int s = 0; s < 2; ++s) one_step(model, opt, s, Device::cpu());
    opt.flush();
    opt.nvme()->engine().set_fault_injector(count.injector());
    one_step(model, opt, 2, Device::cpu());
    opt.flush();
    requests = count.seen.load();
  }
  ASSERT_GT(requests, 8) << "the step made almost no I/O: the sweep would test nothing";
  int64_t stepped_elements = 0, kept_elements = 0;
  for (int64_t k : sweep(requests, 24)) {
    SCOPED_TRACE("failing request " + std::to_string(k) + " of " + std::to_string(requests));
    TempDir dir;
    {
      Injection fail;  // outlives the optimizer, whose threads call it (declared first)
      fail.fail_at = k;
      gpt2::GPT2 model(tiny(), 0, DType::F32);
      optim::HybridAdam opt(model.parameters(), nvme_adam(dir.path));
      for (int s = 0; s < 2; ++s) one_step(model, opt, s, Device::cpu());
      opt.flush();
      opt.nvme()->engine().set_fault_injector(fail.injector());
      // A failed read ahead for the next step surfaces in that step, where its slice is needed.
      int failed_step = -1;
      for (int s = 2; s < 4 && failed_step < 0; ++s) {
        try {
          one_step(model, opt, s, Device::cpu());
          opt.flush();
        } catch (const IoError&) {
          failed_step = s;
        }
      }
      ASSERT_GE(failed_step, 0) << "the injected failure was never reported";
      opt.nvme()->engine().set_fault_injector({});
      const auto& before = ref[static_cast<size_t>(failed_step - 2)];
      const auto& after = ref[static_cast<size_t>(failed_step - 1)];
      std::vector<Tensor> ps = model.parameters();
      for (size_t i = 0; i < ps.size(); ++i) {
        auto [m, v] = opt.state_copy(i);
        const std::vector<const float*> got = {ps[i].data<float>(), m.data<float>(),
                                               v.data<float>()};
        const std::vector<const float*> old = {before[i][0].data(), before[i][1].data(),
                                               before[i][2].data()};
        const std::vector<const float*> neu = {after[i][0].data(), after[i][1].data(),
                                               after[i][2].data()};
        for (int64_t e = 0; e < ps[i].numel(); ++e) {
          if (!all_old_or_all_new(got, old, neu, e)) {
            ADD_FAILURE() << "parameter " << i << " element " << e << " is neither old nor new";
            break;
          }
          (std::memcmp(got[0] + e, neu[0] + e, 4) == 0 ? stepped_elements : kept_elements)++;
        }
      }
    }
    EXPECT_TRUE(entries(dir.path).empty()) << "a state file was left in " << dir.path;
  }
  EXPECT_GT(kept_elements, 0) << "no failure left anything at the old step";
}

// ---- Gemini, three tiers -----------------------------------------------------------------------

constexpr int kSim = 5;  // a sim device of its own

struct GeminiRun {
  TempDir dir;
  gpt2::GPT2 model{tiny(), 21, DType::F32, Device::cpu()};
  std::unique_ptr<gemini::Gemini> gem;
  explicit GeminiRun(bool deferred = false) {
    gemini::GeminiOptions o;
    o.policy = gemini::Policy::kAuto;
    o.device = Device::sim(kSim);
    o.chunk_numel = 20000;
    o.verbose = false;
    o.nvme_dir = dir.path;
    o.host_capacity_bytes = (64 << 10) + 5 * 80000;  // states and some chunks on disk
    o.adam.nvme.slice_numel = 1024;
    o.adam.nvme.window_bytes = 8 << 13;
    gem = std::make_unique<gemini::Gemini>(model, o);
    // Note [Deferred updates] (--grad-clip, --grad-accum): every chunk is stepped in step().
    gem->set_deferred_updates(deferred);
    model.train();
  }
  void step(int64_t s) { one_step(model, *gem, s, Device::sim(kSim)); }
  void inject(Injection* chunks, Injection* states) {
    gem->io_engine()->set_fault_injector(chunks ? chunks->injector() : io::FaultInjector{});
    gem->adam().nvme()->engine().set_fault_injector(states ? states->injector()
                                                           : io::FaultInjector{});
  }
  Weights weights() {
    Weights w;
    gem->with_parameters_readable([&] {
      for (auto& [name, p] : model.named_parameters())
        w.push_back(p.to(Device::cpu()).to_vector<float>());
    });
    return w;
  }
};

Weights plain_weights(int steps) {
  gpt2::GPT2 model(tiny(), 21, DType::F32, Device::sim(kSim));
  optim::HybridAdamOptions o;
  o.update_in_backward = true;
  o.states_on_host = true;
  optim::HybridAdam opt(model.parameters(), o);
  model.train();
  for (int s = 0; s < steps; ++s) one_step(model, opt, s, Device::sim(kSim));
  Weights w;
  for (auto& [name, p] : model.named_parameters())
    w.push_back(p.to(Device::cpu()).to_vector<float>());
  return w;
}

// Counts each element of `got` as stepped (bitwise `after`) or kept (bitwise `before`); any other
// value is a failure: a chunk is stepped whole, its states slice by slice.
void count_old_and_new(const Weights& got, const Weights& before, const Weights& after,
                       int64_t& stepped, int64_t& kept) {
  ASSERT_EQ(got.size(), before.size());
  for (size_t t = 0; t < got.size(); ++t)
    for (size_t e = 0; e < got[t].size(); ++e) {
      if (std::memcmp(&got[t][e], &after[t][e], 4) == 0) {
        ++stepped;
      } else if (std::memcmp(&got[t][e], &before[t][e], 4) == 0) {
        ++kept;
      } else {
        ADD_FAILURE() << "parameter " << t << " element " << e
                      << " is neither as before the step nor as after it";
        break;
      }
    }
}

void sweep_gemini(bool deferred, int64_t points) {
  SCOPED_TRACE(deferred ? "updates deferred to step()" : "updates in backward");
  const std::vector<Weights> ref = {plain_weights(2), plain_weights(3), plain_weights(4)};
  int64_t chunk_requests = 0, state_requests = 0;
  {
    Injection chunks, states;  // outlive the run, whose engines call them (declared first)
    GeminiRun run(deferred);
    ASSERT_NE(run.gem->io_engine(), nullptr) << "no chunk was homed on disk";
    ASSERT_NE(run.gem->adam().nvme(), nullptr) << "no Adam state went to disk";
    for (int s = 0; s < 2; ++s) run.step(s);
    run.inject(&chunks, &states);
    run.step(2);
    chunk_requests = chunks.seen.load();
    state_requests = states.seen.load();
    run.inject(nullptr, nullptr);
    EXPECT_TRUE(run.weights() == ref[1]) << "the clean three-tier run is not the plain run";
  }
  ASSERT_GT(chunk_requests, 4);
  ASSERT_GT(state_requests, 4);
  int64_t stepped = 0, kept = 0, unused = 0;
  for (int which = 0; which < 2; ++which) {
    const int64_t n = which == 0 ? chunk_requests : state_requests;
    for (int64_t k : sweep(n, points)) {
      SCOPED_TRACE(std::string(which == 0 ? "chunk" : "state") + " request " + std::to_string(k) +
                   " of " + std::to_string(n));
      std::string dir;
      {
        Injection fail;  // outlives the run, whose engines call it (declared first)
        fail.fail_at = k;
        GeminiRun run(deferred);
        dir = run.dir.path;
        for (int s = 0; s < 2; ++s) run.step(s);
        run.inject(which == 0 ? &fail : nullptr, which == 1 ? &fail : nullptr);
        // A failed read ahead for the next step surfaces there; a failed read of a prefetched
        // copy that is released unused is no failure at all (the chunk is read again if needed).
        int failed_step = -1;
        for (int s = 2; s < 4 && failed_step < 0; ++s) {
          try {
            run.step(s);
          } catch (const IoError&) {
            failed_step = s;
          }
        }
        run.inject(nullptr, nullptr);
        if (failed_step < 0) {
          ++unused;
          EXPECT_TRUE(run.weights() == ref[2]) << "an unreported failure changed the result";
          continue;
        }
        if (k % 2 == 1) continue;  // the owner just goes away (the trainer's path): no file left
        run.gem->abandon_step();
        const Weights got = run.weights();
        const Weights& before = ref[static_cast<size_t>(failed_step - 2)];
        const Weights& after = ref[static_cast<size_t>(failed_step - 1)];
        count_old_and_new(got, before, after, stepped, kept);
        if (run.gem->failed()) {
          EXPECT_THROW(run.step(failed_step), Error) << "a partially applied step must not go on";
          run.gem->abandon_step();
        } else {  // nothing was stepped: the model is as before, and the step can be run again
          EXPECT_TRUE(got == before);
          run.step(failed_step);
          EXPECT_TRUE(run.weights() == after) << "the retried step differs from the clean one";
        }
      }
      EXPECT_TRUE(entries(dir).empty()) << "a swap file was left in " << dir;
    }
  }
  EXPECT_GT(kept, 0) << "no failure left a parameter as it was";
  EXPECT_GT(stepped, 0) << "no failure came after a chunk was stepped";
  std::printf("  %lld elements stepped, %lld kept; %lld failed reads were of unused copies\n",
              static_cast<long long>(stepped), static_cast<long long>(kept),
              static_cast<long long>(unused));
}

TEST(FaultSweep, EveryChunkAndStateRequestOfAGeminiStepFailsCleanly) {
  sweep_gemini(/*deferred=*/false, 12);
  sweep_gemini(/*deferred=*/true, 8);
}

// A slow device and short transfers are not failures: bitwise the clean run.
TEST(FaultSweep, SlowDeviceAndShortTransfersChangeNoBit) {
  const Weights want = plain_weights(3);
  for (int mode = 0; mode < 2; ++mode) {
    SCOPED_TRACE(mode == 0 ? "slow device" : "short transfers");
    Injection chunks, states;  // outlive the run, whose engines call them (declared first)
    GeminiRun run;
    chunks.slow = states.slow = mode == 0;
    chunks.short_transfers = states.short_transfers = mode == 1;
    run.inject(&chunks, &states);
    for (int s = 0; s < 3; ++s) run.step(s);
    EXPECT_GT(chunks.seen.load() + states.seen.load(), 0);
    EXPECT_EQ(run.weights(), want);
    run.inject(nullptr, nullptr);
  }
}

}  // namespace
}  // namespace mw
