// Note [ZeRO stage 3] (train/zero3.cpp) without the app, in one process (the local communicator,
// on the sim device, whose allocator counts every byte): the model is built into its buckets one at
// a time and saved out of them one at a time, so memory never holds the parameters twice over; the
// values are the plain model's. (Under mpirun the same code runs in tests/dist/train_test.cpp.)
#include <gtest/gtest.h>

#include <algorithm>

#include "core/allocator.h"
#include "dist/communicator.h"
#include "models/gpt2/model.h"
#include "train/data_parallel.h"

namespace mw {
namespace {

TEST(Zero3, BuildsAndStreamsTheModelOneBucketAtATime) {
  gpt2::Config config = gpt2::Config::preset("tiny");
  config.n_layer = 4;
  const Device sim = Device::sim(0);
  set_sim_capacity(0, int64_t{1} << 30);
  std::vector<std::pair<std::string, Shape>> layout;
  for (const auto& spec : gpt2::tensor_specs(config)) layout.emplace_back(spec.name, spec.shape);
  constexpr int64_t kBucketNumel = 3000;  // ~20 buckets: wte (97 x 32) alone, blocks cut in pieces
  Allocator& a = allocator_for(sim);
  const int64_t before = a.stats().current_bytes;
  a.reset_peak();
  train::DataParallel dp(dist::make_local_communicator(), layout, 4 * kBucketNumel, sim);
  gpt2::ParameterFactory factory;
  factory.make = [&](const gpt2::TensorSpec& s) { return dp.make_parameter(s.name); };
  factory.ready = [&](const gpt2::TensorSpec& s) { dp.parameter_ready(s.name); };
  gpt2::GPT2 model(config, 7, DType::F32, sim, factory);
  dp.adopt(model);

  const int64_t psi_bytes = model.num_parameters() * 4;
  int64_t largest = 0;
  for (const auto& [name, shape] : layout) largest = std::max(largest, shape_numel(shape) * 4);
  // One rank's pieces are the whole model, each bucket's rounded up by the sim allocator (4 KiB
  // blocks). Building holds, beyond them, the bucket being filled: at most a bucket of
  // kBucketNumel or one tensor larger than that (wte) and the start of the next, never the whole
  // model a second time (the old way: 2 Psi).
  constexpr int64_t kBlock = 4096;
  const int64_t pieces = a.stats().current_bytes - before;
  EXPECT_GE(pieces, psi_bytes);
  EXPECT_LE(pieces, psi_bytes + 64 * kBlock);
  const int64_t bucket_bound = std::max(4 * kBucketNumel, largest) + 4 * kBucketNumel + 2 * kBlock;
  EXPECT_LE(a.stats().peak_bytes - before, pieces + bucket_bound) << "Psi " << psi_bytes;
  EXPECT_LT(bucket_bound, psi_bytes / 3);  // so the bound above tells the two ways apart
  for (const Tensor& p : model.parameters()) EXPECT_TRUE(p.storage()->is_released());

  // Streaming the parameters out (what --save does): the plain model's values, bit for bit, with
  // one bucket gathered at a time.
  gpt2::GPT2 plain(config, 7, DType::F32, Device::cpu());
  a.reset_peak();
  int64_t touched = 0;
  dp.stream_parameters([&](const train::DataParallel::Touch& touch) {
    for (const auto& spec : model.specs()) {
      touch(spec.name);
      const std::vector<float> got =
          model.parameter(spec.name).to(Device::cpu()).to_vector<float>();
      EXPECT_EQ(got, plain.parameter(spec.name).to_vector<float>()) << spec.name;
      ++touched;
    }
  });
  EXPECT_EQ(touched, static_cast<int64_t>(model.specs().size()));
  EXPECT_LE(a.stats().peak_bytes - before, pieces + std::max(4 * kBucketNumel, largest) + kBlock);
  EXPECT_EQ(a.stats().current_bytes - before, pieces);  // the last bucket released again
  for (const Tensor& p : model.parameters()) EXPECT_TRUE(p.storage()->is_released());
}

}  // namespace
}  // namespace mw
