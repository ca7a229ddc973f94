// What the end-to-end data parallel tests share: gpt2_train at N ranks or alone, its log's losses
// and its saved weights, and the tolerances of comparing runs at different rank counts.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "../data/temp_dir.h"
#include "data/json.h"
#include "data/safetensors.h"
#include "data/token_shard.h"
#include "mpi_launch.h"

namespace mw::testing::dist_train {

inline const std::string kTiny =
    "--model tiny --batch 4 --seq 32 --dropout 0 --threads 1 --lr 1e-2 --eps 1e-3 --bucket-mb "
    "0.02 ";

// ranks 0: one process without mpirun.
inline AppResult train(int ranks, const std::string& args, int timeout_s = 60,
                       const std::string& env = "") {
  const std::string app = std::string(MW_BINARY_DIR) + "/apps/gpt2_train ";
  const std::string launch = ranks == 0 ? "" : mpirun_prefix(ranks, timeout_s);
  return run_command(env + " " + launch + app + args + " </dev/null");
}

// One field of every step's line of a JSON log.
inline std::vector<double> per_step(const std::string& log_path, const std::string& field) {
  std::vector<double> out;
  std::ifstream in(log_path);
  for (std::string line; std::getline(in, line);) {
    const json::Value v = json::parse(line, log_path);
    if (v.contains("loss") && v.contains(field)) out.push_back(v.at(field).as_double());
  }
  return out;
}

inline std::vector<double> losses(const std::string& log_path) {
  return per_step(log_path, "loss");
}

inline std::map<std::string, std::vector<float>> weights(const std::string& dir) {
  data::SafeTensorsReader reader(dir + "/model.safetensors");
  std::map<std::string, std::vector<float>> out;
  for (const auto& rec : reader.tensors()) out[rec.name] = reader.read_as_f32(rec);
  return out;
}

// Tolerances: the ranks' mean gradients are averaged, so the f32 sums run in another order than
// one process's mean over the whole batch (relative differences of a few 1e-7 per gradient). Adam
// divides by sqrt(v) + eps: a gradient that is zero up to rounding (the attention's key bias has a
// zero gradient in exact arithmetic) would be blown up to +-lr per step, noise, not a difference
// between the runs; --eps 1e-3 keeps such noise below 1e-7 while real gradients (1e-3 .. 1e-1)
// still move weights by ~lr. Measured: 1.2e-7 (one f32 ulp at 1.0) after 4 steps. 2e-6 is 0.02%
// of one step (lr 1e-2): a missed, doubled or unreduced update is 1e-3 or more.
constexpr double kWeightTol = 2e-6;
constexpr double kLossTol = 1e-5;  // losses are means over 128 tokens of values ~4.6

// `resumed_at`: b resumed a's run at that step, so its log holds the steps from there on.
inline void expect_same_run(const std::string& a_dir, const std::string& b_dir,
                            size_t resumed_at = 0) {
  const auto la = losses(a_dir + "/log.jsonl"), lb = losses(b_dir + "/log.jsonl");
  ASSERT_EQ(la.size(), lb.size() + resumed_at);
  ASSERT_FALSE(lb.empty());
  for (size_t i = 0; i < lb.size(); ++i)
    EXPECT_NEAR(la[i + resumed_at], lb[i], kLossTol) << "step " << i + resumed_at;
  const auto wa = weights(a_dir + "/model"), wb = weights(b_dir + "/model");
  ASSERT_EQ(wa.size(), wb.size());
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, va] : wa) {
    const auto& vb = wb.at(name);
    ASSERT_EQ(va.size(), vb.size()) << name;
    for (size_t i = 0; i < va.size(); ++i)
      if (std::abs(va[i] - vb[i]) > worst) worst = std::abs(va[i] - vb[i]), worst_name = name;
  }
  EXPECT_LT(worst, kWeightTol) << "largest weight difference in " << worst_name;
  std::printf("largest weight difference %.3g (%s), losses %zu steps\n", worst, worst_name.c_str(),
              la.size());
}

#define SKIP_WITHOUT_MPI()                                               \
  if (::mw::testing::is_mpi_worker()) GTEST_SKIP() << "inside a worker"; \
  if (auto why = ::mw::testing::mpi_unavailable(); !why.empty()) GTEST_SKIP() << why

// A validation shard in `tmp` and the options that evaluate on it and sample greedily at steps 2
// and 4.
inline std::string eval_and_sample(const data::testing::TempDir& tmp) {
  std::vector<uint16_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7) % 97);
  data::write_token_shard(tmp.path() + "/val_000000.bin", tokens);
  return "--val-data " + tmp.path() +
         " --eval-every 2 --eval-batches 2 --sample-every 2 --sample-tokens 6 "
         "--sample-temperature 0 ";
}

// b printed a's validation losses and samples (eval_and_sample's steps).
inline void expect_same_evals_and_samples(const AppResult& a, const AppResult& b) {
  for (const char* line :
       {"[2] val loss: ", "[4] val loss: ", "[2] sample ids:", "[4] sample ids:"}) {
    const size_t at = a.output.find(line);
    ASSERT_NE(at, std::string::npos) << a.output;
    const std::string expected = a.output.substr(at, a.output.find('\n', at) - at);
    EXPECT_NE(b.output.find(expected), std::string::npos) << expected << "\n" << b.output;
  }
}

inline std::string outputs(const std::string& dir) {
  std::filesystem::create_directories(dir);
  return " --log " + dir + "/log.jsonl --save " + dir + "/model ";
}

}  // namespace mw::testing::dist_train
