// gpt2_train (and nvme_step_bench) as a user runs it: exit codes, the documents' lines, the JSON
// log, determinism, and save -> --init-from round trips.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../data/temp_dir.h"
#include "bench/nvme_bench.h"
#include "core/cuda_stream.h"
#include "data/json.h"
#include "data/token_shard.h"

namespace mw {
namespace {

using data::testing::TempDir;

struct Result {
  int exit_code;
  std::string output;  // stdout and stderr
};

Result run_app(const std::string& app, const std::string& args) {
  std::string cmd = std::string(MW_BINARY_DIR) + "/apps/" + app + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

Result run(const std::string& args) { return run_app("gpt2_train", args); }

std::vector<std::string> loss_lines(const std::string& out) {
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);)
    if (l.size() > 1 && l[0] == '[' && l.find("] loss: ") != std::string::npos) lines.push_back(l);
  return lines;
}

const char* kTiny = "--model tiny --seq 16 --batch 2 --threads 2 ";

std::string format_val(double v) {  // as gpt2_train prints it
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

TEST(Gpt2Train, BadFlagsPrintUsageWithTheReasonAndExit2) {
  for (const char* args :
       {"--no-such-flag", "--batch abc", "--model huge", "--steps", "--device gpu", "--dropout 1.5",
        "--lr -1", "--gpu-margin-mem-ratio 0.5", "--device cuda:7x", "--device cuda:0:-1MiB",
        "--device sim:1GiB --gemini static --gpu-margin-mem-ratio 0.5",
        "--device sim:1GiB --gemini auto --gpu-margin-mem-ratio 1.5",
        "--device sim:1GiB --gemini auto --gpu-margin-mem-ratio 0.5 --host-capacity 1GiB"}) {
    SCOPED_TRACE(args);
    Result r = run(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("usage: gpt2_train"), std::string::npos) << r.output;
  }
}

// A host budget below the states' two staging slots (4 MiB each with 128-wide blocks' chunks):
// the refusal says --nvme-window cannot shrink them and names --chunk-size, which does (it once
// told the user who had passed --nvme-window 1MiB to shrink the window).
TEST(Gpt2Train, AHostBudgetBelowTheStagingSlotsNamesWhatShrinksThem) {
  const std::string args =
      "--model small --n-layer 4 --n-embd 128 --n-head 4 --vocab-size 257 --batch 2 --seq 64 "
      "--steps 1 --device sim:4GiB --gemini static --offload-param-frac 1 --offload-optim-frac 1 "
      "--host-capacity 4MiB --nvme-window 1MiB ";
  Result r = run(args);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("(two slots of 4.00 MiB, the least it works with; --nvme-window 1.00 "
                          "MiB cannot shrink it)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("shrink the window"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--chunk-size"), std::string::npos) << r.output;
  Result smaller = run(args + "--chunk-size 50000");
  EXPECT_EQ(smaller.exit_code, 0) << smaller.output;
}

TEST(Gpt2Train, PrintsTheDocumentsLinesAndIsDeterministic) {
  TempDir tmp;
  Result a = run(std::string(kTiny) + "--steps 3 --log " + tmp.file("log.jsonl"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  for (const char* line :
       {"Model numel: 0.000 B", "[0] loss: ", "[2] loss: ", "Time: ", "Mem usage: ", "Peak RSS: "})
    EXPECT_NE(a.output.find(line), std::string::npos) << line << "\n" << a.output;
  Result b = run(std::string(kTiny) + "--steps 3");
  EXPECT_EQ(loss_lines(a.output), loss_lines(b.output));

  std::ifstream in(tmp.file("log.jsonl"));
  int steps = 0;
  for (std::string l; std::getline(in, l); ++steps) {
    json::Value v = json::parse(l, "log");
    EXPECT_EQ(v.get_int("step"), steps);
    EXPECT_GT(v.get_double("loss"), 0.0);
    EXPECT_GT(v.get_double("step_ms"), 0.0);
    EXPECT_GT(v.get_double("rss_mb"), 0.0);
    EXPECT_GT(v.at("device_peak_bytes").get_int("cpu"), 0);
  }
  EXPECT_EQ(steps, 3);
}

TEST(Gpt2Train, SaveThenInitFromContinuesFromTheSavedWeights) {
  TempDir tmp;
  Result a = run(std::string(kTiny) + "--steps 2 --dropout 0 --save " + tmp.file("ckpt"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  // Training from the saved weights on step-0 data must give a loss below the fresh model's.
  Result fresh = run(std::string(kTiny) + "--steps 1 --dropout 0");
  Result resumed =
      run(std::string(kTiny) + "--steps 1 --dropout 0 --init-from " + tmp.file("ckpt"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  auto f = loss_lines(fresh.output), r = loss_lines(resumed.output);
  ASSERT_EQ(f.size(), 1u);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_LT(std::stod(r[0].substr(r[0].find(": ") + 2)),
            std::stod(f[0].substr(f[0].find(": ") + 2)));
}

// --save-dtype bf16 writes half the bytes, and the model trains on from them.
TEST(Gpt2Train, SaveDtypeBf16HalvesTheSavedWeights) {
  TempDir tmp;
  for (const char* dtype : {"fp32", "bf16"}) {
    Result a =
        run(std::string(kTiny) + "--steps 2 --save-dtype " + dtype + " --save " + tmp.file(dtype));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    EXPECT_NE(a.output.find(std::string("Saved to ") + tmp.file(dtype) +
                            (std::string(dtype) == "bf16" ? " (bf16 weights)" : "\n")),
              std::string::npos)
        << a.output;
  }
  // 29,600 parameters (the tied wte once), 4 and 2 bytes each; the JSON headers differ by tens
  // of bytes (the dtype names, the offsets' digits, the padding).
  const auto f32 = std::filesystem::file_size(tmp.file("fp32") + "/model.safetensors");
  const auto bf16 = std::filesystem::file_size(tmp.file("bf16") + "/model.safetensors");
  EXPECT_NEAR(static_cast<double>(f32 - bf16), 2.0 * 29600, 256);
  Result b = run(std::string(kTiny) + "--steps 1 --lr 1e-4 --init-from " + tmp.file("bf16"));
  EXPECT_EQ(b.exit_code, 0) << b.output;
}

// b printed a's `steps` losses, to f32 rounding: printed with 3 decimals, values 1e-5 apart may
// still round to neighbouring thousandths.
void expect_same_printed_losses(const Result& a, const Result& b, size_t steps) {
  auto al = loss_lines(a.output), bl = loss_lines(b.output);
  ASSERT_EQ(al.size(), steps) << a.output;
  ASSERT_EQ(bl.size(), steps) << b.output;
  for (size_t i = 0; i < steps; ++i) {
    const double la = std::stod(al[i].substr(al[i].find("loss: ") + 6));
    const double lb = std::stod(bl[i].substr(bl[i].find("loss: ") + 6));
    EXPECT_NEAR(lb, la, 0.0015) << al[i] << " vs " << bl[i];
  }
}

TEST(Gpt2Train, DeviceCudaRunsOnAGpuAndIsAUsageErrorWithoutOne) {
  if (cuda_device_count() == 0) {
    // A build without CUDA, or no visible GPU: exit 2 before any work, saying why.
    Result r = run(std::string(kTiny) + "--steps 1 --device cuda");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("--device 'cuda'"), std::string::npos) << r.output;
    return;
  }
  // Losses agree to f32 rounding over 3 Adam steps (the dropout masks are the same on both).
  const std::string args = std::string(kTiny) + "--steps 3 ";
  Result c = run(args + "--device cpu"), g = run(args + "--device cuda:0");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  ASSERT_EQ(g.exit_code, 0) << g.output;
  expect_same_printed_losses(c, g, 3);
}

// Note [Disk reads through the host] (offload/gemini/tiers.cpp): on a GPU, Gemini's disk-homed
// chunks reach the device through a pinned host buffer. Three tiers on cuda train as on sim (the
// CPU kernels), to f32 rounding. Needs a GPU; on sim the same path runs in
// GeminiTrain.ThreeTiersAreBitwiseAndLeaveNoFiles.
TEST(Gpt2Train, GeminiThreeTiersOnCudaMatchSim) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible (or a build without CUDA)";
  const std::string args = std::string(kTiny) +
                           "--steps 3 --dropout 0 --gemini auto --chunk-size 4096 "
                           "--host-capacity 160KiB --nvme-window 64KiB ";
  Result s = run(args + "--device sim:64MiB"), g = run(args + "--device cuda:0");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  ASSERT_EQ(g.exit_code, 0) << g.output;
  EXPECT_NE(g.output.find("homed on disk"), std::string::npos) << g.output;
  expect_same_printed_losses(s, g, 3);
}

// A prefetch is optional (Note [Prefetch]): one whose memory is refused (on a GPU the allocator's
// capacity is not what it has free, and pinned buffers run out) is skipped and the op gathers the
// chunk itself. MW_GEMINI_PREFETCH_OOM=1 refuses every one, after the copy's device bytes are
// taken: the chunk must be left as it was (a read's device copy left gathered and unlisted once
// made the next release undefined), and the run is the same to every bit, with no prefetch.
TEST(Gpt2Train, GeminiRefusedPrefetchesAreSkippedAndTheBitsStay) {
  TempDir tmp;
  const std::string args = std::string(kTiny) +
                           "--steps 3 --dropout 0.1 --device sim:64MiB --gemini auto "
                           "--chunk-size 4096 --host-capacity 160KiB --nvme-window 64KiB "
                           "--copy-worker on --log ";
  Result free = run(args + tmp.file("free.jsonl") + " --save " + tmp.file("free"));
  ::setenv("MW_GEMINI_PREFETCH_OOM", "1", 1);  // the child's environment
  Result refused = run(args + tmp.file("refused.jsonl") + " --save " + tmp.file("refused"));
  ::unsetenv("MW_GEMINI_PREFETCH_OOM");
  ASSERT_EQ(free.exit_code, 0) << free.output;
  ASSERT_EQ(refused.exit_code, 0) << refused.output;
  EXPECT_NE(free.output.find("homed on disk"), std::string::npos) << free.output;
  std::ifstream a(tmp.file("free.jsonl")), b(tmp.file("refused.jsonl"));
  int64_t ahead = 0, records = 0;
  for (std::string la, lb; std::getline(a, la) && std::getline(b, lb); ++records) {
    const json::Value va = json::parse(la, "free log"), vb = json::parse(lb, "refused log");
    EXPECT_EQ(va.get_double("loss"), vb.get_double("loss")) << la << " vs " << lb;
    EXPECT_EQ(vb.get_double("prefetches"), 0) << lb;
    ahead += static_cast<int64_t>(va.get_double("prefetches"));
  }
  EXPECT_EQ(records, 3);
  EXPECT_GT(ahead, 0) << "the free run prefetches, so the refused one had some to refuse";
  auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string model = bytes(tmp.file("free") + "/model.safetensors");
  EXPECT_FALSE(model.empty());
  EXPECT_TRUE(model == bytes(tmp.file("refused") + "/model.safetensors"));
}

// Note [Copy worker] on CUDA: chunks copied ahead on the copy stream give the losses of gathers
// on the compute stream, exactly (the JSON log's full-precision values), and do go ahead.
TEST(Gpt2Train, GeminiCopyStreamOnCudaMatchesInlineGathers) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible (or a build without CUDA)";
  TempDir tmp;
  const std::string args = std::string(kTiny) +
                           "--steps 4 --dropout 0.1 --device cuda:0 --gemini auto "
                           "--chunk-size 4096 --log ";
  Result off = run(args + tmp.file("off.jsonl") + " --copy-worker off");
  Result on = run(args + tmp.file("on.jsonl") + " --copy-worker on");
  ASSERT_EQ(off.exit_code, 0) << off.output;
  ASSERT_EQ(on.exit_code, 0) << on.output;
  EXPECT_NE(on.output.find("| copy stream"), std::string::npos) << on.output;
  std::ifstream a(tmp.file("off.jsonl")), b(tmp.file("on.jsonl"));
  int64_t ahead = 0, records = 0;
  for (std::string la, lb; std::getline(a, la) && std::getline(b, lb); ++records) {
    const json::Value va = json::parse(la, "off log"), vb = json::parse(lb, "on log");
    EXPECT_EQ(va.get_double("loss"), vb.get_double("loss")) << la << " vs " << lb;
    EXPECT_EQ(va.get_double("prefetches"), 0) << la;
    ahead += static_cast<int64_t>(vb.get_double("prefetches"));
  }
  EXPECT_EQ(records, 4);
  EXPECT_GT(ahead, 0) << on.output;
}

// Note [16-bit copies] (offload/gemini/low_copies.cpp): under --precision bf16 the blocks'
// matrices go to the device in bf16 (--chunk-copy-dtype auto, the default) and the saved model is
// byte for byte the one of f32 copies, with fewer bytes moved and planned. On a GPU too when one
// is visible (the rounding on the host, the gradients widened there).
TEST(Gpt2Train, GeminiSixteenBitCopiesSaveTheSameModelWithFewerBytes) {
  std::vector<std::string> devices = {"sim:64MiB"};
  if (cuda_device_count() > 0) devices.push_back("cuda:0");
  for (const std::string& device : devices) {
    TempDir tmp;
    const std::string args = std::string(kTiny) +
                             "--n-embd 64 --steps 3 --precision bf16 --device " + device +
                             " --gemini auto --chunk-size 8192 ";
    auto h2d = [&](const std::string& log) {
      std::ifstream in(log);
      int64_t bytes = 0;
      for (std::string line; std::getline(in, line);)
        bytes += static_cast<int64_t>(json::parse(line, log).get_double("h2d_bytes"));
      return bytes;
    };
    Result a = run(args + "--save " + tmp.file("a") + " --log " + tmp.file("a.jsonl"));
    Result f = run(args + "--save " + tmp.file("f") + " --log " + tmp.file("f.jsonl") +
                   " --chunk-copy-dtype fp32");
    ASSERT_EQ(a.exit_code, 0) << a.output;
    ASSERT_EQ(f.exit_code, 0) << f.output;
    auto bytes = [](const std::string& path) {
      std::ifstream in(path, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    EXPECT_EQ(bytes(tmp.file("a/model.safetensors")), bytes(tmp.file("f/model.safetensors")))
        << device;
    EXPECT_LT(h2d(tmp.file("a.jsonl")), 0.9 * h2d(tmp.file("f.jsonl"))) << device;
  }
  // Under fp32 every copy is f32: the option would do nothing, so it is refused.
  Result f32 =
      run(std::string(kTiny) + "--steps 1 --device sim --gemini auto --chunk-copy-dtype fp32");
  EXPECT_EQ(f32.exit_code, 2) << f32.output;
  EXPECT_NE(f32.output.find("--precision bf16"), std::string::npos) << f32.output;
}

TEST(Gpt2Train, ReadsAnLlmcTokenShard) {
  TempDir tmp;
  std::vector<uint16_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7) % 97);
  data::write_token_shard(tmp.file("shard.bin"), tokens);
  Result r = run(std::string(kTiny) + "--steps 2 --data " + tmp.file("shard.bin"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  tokens[5] = 500;  // outside the tiny vocabulary of 97
  data::write_token_shard(tmp.file("bad.bin"), tokens);
  Result bad = run(std::string(kTiny) + "--steps 1 --data " + tmp.file("bad.bin"));
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("500"), std::string::npos) << bad.output;
  // Fewer tokens than one sequence (--seq 16): every row would repeat them. Refused for both
  // streams, with the count found and the largest --seq that would do.
  tokens.assign(15, 3);
  data::write_token_shard(tmp.file("short.bin"), tokens);
  for (const char* option : {"--data ", "--val-data "}) {
    Result s = run(std::string(kTiny) + "--steps 1 " + option + tmp.file("short.bin"));
    EXPECT_EQ(s.exit_code, 1) << s.output;
    EXPECT_NE(s.output.find("holds 15 tokens"), std::string::npos) << s.output;
    EXPECT_NE(s.output.find("at most 15"), std::string::npos) << s.output;
  }
  tokens.assign(16, 3);  // exactly one sequence is enough
  data::write_token_shard(tmp.file("one.bin"), tokens);
  EXPECT_EQ(run(std::string(kTiny) + "--steps 1 --data " + tmp.file("one.bin")).exit_code, 0);
}

TEST(Gpt2Train, MissingOrCorruptInputsGiveAClearErrorAndExit1) {
  TempDir tmp;
  Result r = run(std::string(kTiny) + "--init-from " + tmp.file("nope"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("not a directory"), std::string::npos) << r.output;
  Result d = run(std::string(kTiny) + "--data " + tmp.file("missing.bin"));
  EXPECT_EQ(d.exit_code, 1);
  EXPECT_NE(d.output.find("missing.bin"), std::string::npos) << d.output;
}

// Issue #12: validation on a directory of shards with a schedule and clipping (val loss in the
// output and the log, with lr and grad_norm), then --eval-only on the saved model gives the same
// val loss, and a model of any shape from the shape options.
TEST(Gpt2Train, ValidationScheduleClippingAndEvalOnly) {
  TempDir tmp;
  std::vector<uint16_t> tokens(2000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7) % 97);
  data::write_token_shard(tmp.file("train_000000.bin"), tokens);
  data::write_token_shard(tmp.file("train_000001.bin"), tokens);
  data::write_token_shard(tmp.file("val_000000.bin"), tokens);
  const std::string args =
      std::string(kTiny) + "--steps 4 --data " + tmp.path() + " --val-data " + tmp.path() +
      " --eval-every 2 --eval-batches 3 --lr-schedule linear --warmup-steps 1 --grad-clip 0.1 ";
  Result r = run(args + "--log " + tmp.file("log.jsonl") + " --save " + tmp.file("m"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[2] val loss: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[4] val loss: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 4/4 | loss "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(clipped)"), std::string::npos) << r.output;  // norms are ~2
  std::ifstream log(tmp.file("log.jsonl"));
  int steps = 0, evals = 0;
  std::string last_val;
  for (std::string line; std::getline(log, line);) {
    const json::Value v = json::parse(line, "log");
    if (v.contains("val_loss")) {
      ++evals;
      last_val = format_val(v.get_double("val_loss"));
      continue;
    }
    EXPECT_EQ(v.get_int("step"), steps);
    // linear, W = 1, N = 4: 0, then lr * (4 - s) / 3.
    EXPECT_NEAR(v.get_double("lr"), steps == 0 ? 0.0 : 1e-3 * (4 - steps) / 3.0, 1e-9);
    EXPECT_GT(v.get_double("grad_norm"), 0.1);
    EXPECT_TRUE(v.get_bool("clipped"));
    ++steps;
  }
  EXPECT_EQ(steps, 4);
  EXPECT_EQ(evals, 2);
  Result e = run(std::string(kTiny) + "--eval-only --init-from " + tmp.file("m") + " --val-data " +
                 tmp.path() + " --eval-batches 3");
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_NE(e.output.find("val loss: " + last_val), std::string::npos) << e.output << last_val;
  // --steps 0 evaluates the model as it starts: "after the last step" (it evaluated nothing).
  Result z = run(std::string(kTiny) + "--steps 0 --init-from " + tmp.file("m") + " --val-data " +
                 tmp.path() + " --eval-batches 3");
  ASSERT_EQ(z.exit_code, 0) << z.output;
  EXPECT_NE(z.output.find("[0] val loss: " + last_val), std::string::npos) << z.output << last_val;
  // A training command's outputs given with --eval-only are named as not acted on (they were
  // silently dropped).
  Result w = run(std::string(kTiny) + "--eval-only --init-from " + tmp.file("m") + " --val-data " +
                 tmp.path() + " --eval-batches 1 --save " + tmp.file("never") + " --steps 9");
  ASSERT_EQ(w.exit_code, 0) << w.output;
  EXPECT_NE(w.output.find("warning: --eval-only evaluates and exits: --save not acted on"),
            std::string::npos)
      << w.output;
  EXPECT_FALSE(std::filesystem::exists(tmp.file("never")));

  Result shaped =
      run("--model tiny --n-layer 3 --n-embd 48 --n-head 6 --vocab-size 200 --steps 1 "
          "--threads 2 --batch 1");
  ASSERT_EQ(shaped.exit_code, 0) << shaped.output;
  // wte 200*48 + wpe 32*48 + 3 blocks of (12*48^2 + 13*48) + ln_f 2*48 = 96,048.
  EXPECT_NE(shaped.output.find("Parameters: 96,048"), std::string::npos) << shaped.output;
}

// Issue #12 item 6: a config.json starts a model from random weights; tiny runs with the default
// sequence length (its 32 positions, not 128).
TEST(Gpt2Train, ConfigJsonAndTinyWithDefaults) {
  Result c = run("--config " + std::string(MW_SOURCE_DIR) +
                 "/tests/fixtures/gpt2_tiny/config.json --steps 1 --threads 2 --batch 1");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("Parameters: 29,600"), std::string::npos) << c.output;
  Result t = run("--model tiny --steps 1 --threads 2");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_NE(t.output.find("B4 T32"), std::string::npos) << t.output;  // the plan's shape
}

// Gemini in the training loop (docs/gemini.md): clipping, accumulation and validation under
// --gemini auto log the plain run's losses, norms and validation losses exactly, and --eval-only
// of the saved model under Gemini prints the same validation loss.
TEST(Gpt2Train, GeminiClipAccumAndValidationLogThePlainRunsValues) {
  TempDir tmp;
  std::vector<uint16_t> tokens(2000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7) % 97);
  data::write_token_shard(tmp.file("val_000000.bin"), tokens);
  const std::string args = std::string(kTiny) + "--steps 3 --val-data " + tmp.path() +
                           " --eval-every 1 --eval-batches 2 --grad-clip 0.5 --grad-accum 2 "
                           "--dropout 0.1 --device sim:1GiB ";
  Result plain = run(args + "--log " + tmp.file("plain.jsonl"));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  Result gem = run(args + "--gemini auto --chunk-size 4000 --copy-worker on --log " +
                   tmp.file("gemini.jsonl") + " --save " + tmp.file("m"));
  ASSERT_EQ(gem.exit_code, 0) << gem.output;
  EXPECT_NE(gem.output.find("updates deferred"), std::string::npos) << gem.output;
  EXPECT_NE(gem.output.find("| copy worker"), std::string::npos) << gem.output;
  std::ifstream a(tmp.file("plain.jsonl")), b(tmp.file("gemini.jsonl"));
  int records = 0;
  std::string last_val;
  for (std::string la, lb; std::getline(a, la) && std::getline(b, lb); ++records) {
    const json::Value va = json::parse(la, "plain log"), vb = json::parse(lb, "gemini log");
    for (const char* key : {"loss", "grad_norm", "val_loss"})
      if (va.contains(key)) {
        EXPECT_EQ(va.get_double(key), vb.get_double(key)) << key << " in " << la << " vs " << lb;
      }
    if (va.contains("val_loss")) last_val = format_val(va.get_double("val_loss"));
  }
  EXPECT_EQ(records, 6);  // 3 steps, 3 evaluations
  Result e = run(std::string(kTiny) + "--eval-only --init-from " + tmp.file("m") + " --val-data " +
                 tmp.path() + " --eval-batches 2 --device sim:1GiB --gemini static " +
                 "--offload-param-frac 1 --chunk-size 4000");
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_NE(e.output.find("val loss: " + last_val), std::string::npos) << e.output << last_val;
}

TEST(Gpt2Train, OptionsThatWouldDoNothingAreRefused) {
  for (const char* args :
       {"--fraction 0.5", "--nvme-dir /tmp", "--eval-every 2", "--checkpoint-every 2",
        "--min-lr 0.0001", "--shuffle", "--eval-only --val-data x", "--keep 2",
        "--device sim:1GiB --gemini auto --offload-param-frac 1",
        "--device sim:1GiB --gemini const --offload-optim-frac 0.5",
        "--device sim:1GiB --gemini static --const-budget 1MiB",
        "--device sim:1GiB --gemini const --auto-margin 0.1", "--copy-worker on",
        "--device sim:1GiB --gemini static --copy-worker on",
        "--device sim:1GiB --gemini auto --optimizer-states device", "--save-dtype bf16",
        "--weight-decay-on all"}) {
    SCOPED_TRACE(args);
    Result r = run(std::string(kTiny) + args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
  }
}

// Options that a common command carries where they do nothing run with a warning naming them
// (--offload-activations on the CPU kept every activation, silently).
TEST(Gpt2Train, OptionsThatDoNothingHereAreNamedInAWarning) {
  Result r = run(std::string(kTiny) + "--offload-activations");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: --offload-activations has no effect on --device cpu"),
            std::string::npos)
      << r.output;
  r = run(std::string(kTiny) + "--offload-activations --device sim:1GiB");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("warning"), std::string::npos) << r.output;
  // Data parallel's options without mpirun: a forgotten launcher trained unsharded in silence.
  r = run(std::string(kTiny) + "--zero 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: --zero 2 in one process shards across that one rank"),
            std::string::npos)
      << r.output;
  r = run(std::string(kTiny) + "--bucket-mb 5 --dist-timeout 9");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* name : {"--bucket-mb", "--dist-timeout"})
    EXPECT_NE(r.output.find(std::string("warning: ") + name + " has no effect in one process"),
              std::string::npos)
        << r.output;
  // Fine-tuning at the from-scratch default rate, 10-100x what fine-tuning recipes use.
  const std::string pretrained = " --init-from " + std::string(MW_SOURCE_DIR) +
                                 "/tests/fixtures/gpt2_tiny --steps 1 --threads 2";
  r = run(pretrained);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: --init-from without --lr trains at the default 1e-3"),
            std::string::npos)
      << r.output;
  r = run(pretrained + " --lr 5e-5");
  EXPECT_EQ(r.output.find("warning"), std::string::npos) << r.output;
  // A kernel override with a typo fails before anything is built (it failed at the first op).
  for (const char* name : {"MW_F32_ISA", "MW_ADAM_ISA", "MW_CONVERT_ISA", "MW_BF16_GEMM"}) {
    ::setenv(name, "avx3", 1);
    r = run(pretrained + " --lr 5e-5");
    ::unsetenv(name);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_EQ(r.output.rfind(std::string("gpt2_train: error: ") + name + "='avx3'", 0), 0u)
        << r.output;
  }
  // A sample prompt's backslash-n is text, not the newline it was meant to be.
  r = run(pretrained + " --lr 5e-5 --sample-every 1 --sample-tokens 2 --sample-prompt 'a\\nb'");
  EXPECT_NE(r.output.find("warning: --sample-prompt holds a backslash and an n"), std::string::npos)
      << r.output;
}

// The line that says updates wait for the step names what asked for it: with --grad-accum and
// --update-in-backward off it blamed --grad-clip/fp16, neither of them given.
TEST(Gpt2Train, UpdatesAfterBackwardNameTheirReason) {
  for (const char* placement : {"", "--device sim:1GiB --gemini auto "}) {
    Result r = run(std::string(kTiny) + placement + "--grad-accum 2 --update-in-backward off");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("--update-in-backward off"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("--grad-clip/fp16"), std::string::npos) << r.output;
    r = run(std::string(kTiny) + placement + "--grad-clip 1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("--grad-clip/fp16 need every gradient first"), std::string::npos)
        << r.output;
  }
}

// The side-by-side offload bench: both models must see the same losses, bit for bit, or it fails.
// With fio on the PATH it prints the disk floor (the only test that runs fio here: 8 s); --no-fio
// skips it.
TEST(NvmeStepBench, TrainsBothModelsSideBySideWithEqualLosses) {
  // The states' private directory and fio's file go under TMPDIR: nothing may stay there (fio
  // remade the removed directory, and every run left it behind, before its removal was added).
  TempDir tmp;
  const char* saved = std::getenv("TMPDIR");
  const std::string restore = saved ? saved : "";
  ::setenv("TMPDIR", tmp.path().c_str(), 1);
  Result r = run_app("nvme_step_bench", "--model tiny --seq 16 --batch 2 --threads 2 --steps 3");
  saved ? ::setenv("TMPDIR", restore.c_str(), 1) : ::unsetenv("TMPDIR");
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path())) << "left behind in TMPDIR";
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("losses bitwise equal"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("median of per-pair ratios"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("disk floor per step:") != std::string::npos, bench::have_fio())
      << r.output;
  // Without --seq: tiny's 32 positions, not a default of 128 refused as out of range.
  r = run_app("nvme_step_bench", "--model tiny --batch 2 --threads 2 --steps 2 --no-fio");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("GPT-2 tiny, B2 T32"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("disk floor per step"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no disk floor (Note [Disk floor]): --no-fio"), std::string::npos)
      << r.output;
  Result bad = run_app("nvme_step_bench", "--fraction 2");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--fraction"), std::string::npos) << bad.output;
}

TEST(Gpt2Train, PrecisionBf16AndFp16TrainLikeFp32) {
  const std::string args = std::string(kTiny) + "--steps 3 ";
  Result f = run(args), b = run(args + "--precision bf16"), h = run(args + "--precision fp16");
  for (const Result* r : {&f, &b, &h}) ASSERT_EQ(r->exit_code, 0) << r->output;
  EXPECT_NE(h.output.find("Precision: fp16 autocast"), std::string::npos) << h.output;
  auto fl = loss_lines(f.output), bl = loss_lines(b.output), hl = loss_lines(h.output);
  ASSERT_EQ(bl.size(), 3u) << b.output;
  ASSERT_EQ(hl.size(), 3u) << h.output;
  for (size_t i = 0; i < 3; ++i) {
    const double lf = std::stod(fl[i].substr(fl[i].find("loss: ") + 6));
    // 1e-2: bf16's worst case on the tiny model (tests/precision/parity_test.cpp); fp16 is closer.
    EXPECT_NEAR(std::stod(bl[i].substr(bl[i].find("loss: ") + 6)), lf, 1e-2) << bl[i];
    EXPECT_NEAR(std::stod(hl[i].substr(hl[i].find("loss: ") + 6)), lf, 1e-2) << hl[i];
  }
  // Under Gemini fp16 scales the chunk gradients (Note [Loss scaling under Gemini]): the plain
  // fp16 run's losses to the printed digit.
  Result g = run(args + "--precision fp16 --gemini auto --device sim:64MiB");
  ASSERT_EQ(g.exit_code, 0) << g.output;
  EXPECT_EQ(loss_lines(g.output), hl) << g.output;
  for (const char* bad : {"--precision fp8", "--initial-loss-scale 1024",
                          "--precision fp16 --initial-loss-scale 1e6"}) {
    Result r = run(std::string(kTiny) + bad);
    EXPECT_EQ(r.exit_code, 2) << bad << "\n" << r.output;
  }
}

}  // namespace
}  // namespace mw
