// The Trainer tests' small runs (trainer_test.cpp, resume_test.cpp): a shard of random tokens,
// GPT-2 tiny's options, Gemini auto on a sim device, and a run's weights.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "../data/temp_dir.h"
#include "data/token_shard.h"
#include "train/trainer.h"

namespace mw::train::testing {

using data::testing::TempDir;

// A shard of 4096 random tokens below tiny's vocabulary of 97.
inline std::string write_shard(const TempDir& tmp, const std::string& name, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint16_t> tokens(4096);
  for (auto& t : tokens) t = static_cast<uint16_t>(gen() % 97);
  data::write_token_shard(tmp.file(name), tokens);
  return tmp.file(name);
}

inline TrainOptions tiny(const std::string& data, int64_t steps) {
  TrainOptions o;
  o.model = "tiny";
  o.batch = 2;
  o.seq = 16;
  o.threads = 2;
  o.steps = steps;
  o.data = data;
  o.dropout = 0;
  o.seed = 3;
  return o;
}

// Gemini auto on a 1 GiB sim device, quietly.
inline void on_gemini_auto(TrainOptions& o) {
  o.device = Device::sim(0);
  o.device_capacity_limit_bytes = int64_t{1} << 30;
  o.gemini = "auto";
  o.gemini_options.policy = gemini::Policy::kAuto;
  o.gemini_options.device = o.device;
  o.gemini_options.verbose = false;
}

inline std::vector<std::vector<float>> weights(Trainer& t) {
  std::vector<std::vector<float>> w;
  for (const Tensor& p : t.model().parameters()) w.push_back(p.contiguous().to_vector<float>());
  return w;
}

}  // namespace mw::train::testing
