// Loading and saving stream through Gemini's tiers (Note [Streaming load], Note [Streaming save] in
// models/gpt2/hf_io.h, .cpp): a model whose chunks live on disk is built straight from a
// safetensors file and saved back one chunk at a time, with the same bytes as a plain model, while
// the host holds far less than the whole model.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <limits>

#include "../data/temp_dir.h"
#include "core/allocator.h"
#include "data/safetensors.h"
#include "models/gpt2/hf_io.h"
#include "models/gpt2/model.h"
#include "offload/gemini/gemini.h"

namespace mw::gemini {
namespace {

using data::testing::expect_throw_with;
using data::testing::read_bytes;
using data::testing::TempDir;

constexpr int kSim = 4;

gpt2::Config test_config() {
  gpt2::Config c = gpt2::Config::preset("tiny");
  c.n_layer = 3;
  c.n_embd = 64;
  c.vocab_size = 257;
  return c;
}

// Gemini with most chunks homed on disk: 80 KB chunks, a host budget of the Adam window, the
// transient reserve (three chunks) and two more chunks.
GeminiOptions three_tier_options() {
  GeminiOptions o;
  o.device = Device::sim(kSim);
  o.offload_param_frac = o.offload_optim_frac = 1;
  o.chunk_numel = 20000;
  o.verbose = false;
  o.host_capacity_bytes = (64 << 10) + 5 * 80000;
  o.adam.nvme.slice_numel = 1024;
  o.adam.nvme.window_bytes = 8 << 13;
  return o;
}

struct Built {
  std::unique_ptr<Gemini> gem;
  std::unique_ptr<gpt2::GPT2> model;
  int64_t host_growth_bytes = 0;  // host allocator peak during construction, above the start
};

// The streaming construction of gpt2_train: each parameter made in its chunk, filled from the
// file, and its chunk written to disk once full.
Built build_from(const std::string& dir) {
  const gpt2::Config config = test_config();
  std::vector<std::pair<std::string, Shape>> tensors;
  for (const auto& spec : gpt2::tensor_specs(config)) tensors.emplace_back(spec.name, spec.shape);
  Built b;
  b.gem = std::make_unique<Gemini>(three_tier_options(), tensors);
  gpt2::HfWeights weights(dir, config);
  gpt2::ParameterFactory f;
  f.make = [&](const gpt2::TensorSpec& s) { return b.gem->make_parameter(s.name); };
  f.fill = weights.filler();
  f.ready = [&](const gpt2::TensorSpec& s) { b.gem->parameter_ready(s.name); };
  Allocator& host = allocator_for(Device::cpu());
  host.reset_peak();
  const int64_t before = host.stats().current_bytes;
  b.model = std::make_unique<gpt2::GPT2>(config, 99, DType::F32, Device::cpu(), f);
  b.host_growth_bytes = host.stats().peak_bytes - before;
  b.gem->attach(*b.model);
  return b;
}

int64_t model_bytes() { return gpt2::num_parameters(test_config()) * 4; }

TEST(GeminiStreaming, LoadIntoDiskChunksAndSaveBackGiveTheSameFileHoldingLittleInRam) {
  TempDir tmp;
  gpt2::GPT2 plain(test_config(), 21);  // another seed than build_from's: the file must win
  gpt2::save_hf(plain, tmp.file("in"));
  Built b = build_from(tmp.file("in"));
  ASSERT_GT(b.gem->nvme_chunk_bytes(), model_bytes() / 2) << "too few chunks homed on disk";
  // Built chunk by chunk: the host held the chunks it keeps, one chunk being filled and one
  // tensor being read, never the whole model.
  EXPECT_LT(b.host_growth_bytes, model_bytes() / 2);

  Allocator& host = allocator_for(Device::cpu());
  host.reset_peak();
  const int64_t before = host.stats().current_bytes;
  b.gem->with_parameters_streamed([&](const Gemini::Touch& touch) {
    gpt2::save_hf(*b.model, tmp.file("out"), test_config(), touch);
  });
  // One disk chunk read in at a time, plus one tensor's f32 copy: well under the model.
  EXPECT_LT(host.stats().peak_bytes - before, model_bytes() / 2);
  EXPECT_EQ(host.stats().current_bytes, before) << "the save left chunk bytes in RAM";
  const std::string in = read_bytes(tmp.file("in/model.safetensors"));
  const std::string out = read_bytes(tmp.file("out/model.safetensors"));
  ASSERT_EQ(in.size(), out.size());
  EXPECT_TRUE(in == out) << "the streamed save differs from the plain model's file";
}

TEST(GeminiStreaming, ANonFiniteWeightFailsTheBuildNamingTheTensor) {
  TempDir tmp;
  gpt2::GPT2 plain(test_config(), 21);
  {
    NoGradGuard no_grad;
    Tensor p = plain.parameter("transformer.h.2.mlp.c_fc.weight");
    p.data<float>()[7] = std::numeric_limits<float>::quiet_NaN();
  }
  // save_hf refuses a non-finite model, so the file is written by hand from the tensors.
  data::SafeTensorsWriter w;
  std::vector<Tensor> keep;
  for (const auto& spec : plain.specs()) {
    keep.push_back(plain.parameter(spec.name));
    w.add(spec.name, DType::F32, spec.shape, keep.back().raw_data());
  }
  std::filesystem::create_directories(tmp.file("bad"));
  w.write(tmp.file("bad/model.safetensors"));
  expect_throw_with<FormatError>([&] { build_from(tmp.file("bad")); },
                                 {"h.2.mlp.c_fc.weight", "nan", "element 7"});
}

TEST(GeminiStreaming, ASaveThatFailsMidwayKeepsTheEarlierFolderAndFreesTheChunk) {
  TempDir tmp;
  gpt2::GPT2 plain(test_config(), 21);
  gpt2::save_hf(plain, tmp.file("in"));
  gpt2::save_hf(plain, tmp.file("out"));
  const std::string earlier = read_bytes(tmp.file("out/model.safetensors"));
  Built b = build_from(tmp.file("in"));
  Allocator& host = allocator_for(Device::cpu());
  const int64_t before = host.stats().current_bytes;
  int touched = 0;
  expect_throw_with<IoError>(
      [&] {
        b.gem->with_parameters_streamed([&](const Gemini::Touch& touch) {
          gpt2::save_hf(*b.model, tmp.file("out"), test_config(), [&](const std::string& name) {
            touch(name);
            if (++touched == 20) throw IoError("injected: the disk went away");
          });
        });
      },
      {"injected", "kept as it was"});
  EXPECT_EQ(host.stats().current_bytes, before) << "a chunk's RAM copy outlived the failed save";
  EXPECT_TRUE(read_bytes(tmp.file("out/model.safetensors")) == earlier);
}

}  // namespace
}  // namespace mw::gemini
