// The optimizer checkpoint reader (HybridAdam::load_state, Note [Optimizer checkpoint format])
// against hand-built files: a well-formed file loads and saves back byte for byte, and each
// corruption the fuzz target (fuzz/optim_checkpoint_fuzz.cpp) found is a FormatError naming the
// file, not undefined behaviour or a silently accepted file.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "optim/hybrid_adam.h"
#include "optim/optimizer.h"

namespace mw::optim {
namespace {

namespace fs = std::filesystem;

struct Segment {
  int64_t offset, numel, step;
};

// The bytes of a checkpoint: header, per-parameter segment tables, then m (all 0.5) and v (all
// 0.25) of every segment, little-endian as on x86.
std::string checkpoint_bytes(int64_t step,
                             const std::vector<std::pair<int64_t, std::vector<Segment>>>& params) {
  std::string out = "MWADAMv1";
  auto i64 = [&](int64_t x) { out.append(reinterpret_cast<const char*>(&x), 8); };
  auto f32 = [&](float x) { out.append(reinterpret_cast<const char*>(&x), 4); };
  i64(step);
  i64(static_cast<int64_t>(params.size()));
  for (const auto& [numel, segs] : params) {
    i64(numel);
    i64(static_cast<int64_t>(segs.size()));
    for (const Segment& s : segs) {
      i64(s.offset);
      i64(s.numel);
      i64(s.step);
    }
  }
  for (const auto& [numel, segs] : params) {
    for (const Segment& s : segs) {
      for (int64_t i = 0; i < s.numel && i < 64; ++i) f32(0.5f);
      for (int64_t i = 0; i < s.numel && i < 64; ++i) f32(0.25f);
    }
  }
  return out;
}

class CheckpointFormat : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("mw_ckpt_format_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  std::vector<Tensor> params_ = {Tensor::zeros({5}), Tensor::zeros({6})};
  fs::path dir_;
};

TEST_F(CheckpointFormat, AHandBuiltFileLoadsAndSavesBackByteForByte) {
  const std::string bytes = checkpoint_bytes(3, {{5, {{0, 5, 3}}}, {6, {{0, 6, 3}}}});
  HybridAdam opt(params_);
  opt.load_state(write("in.ckpt", bytes));
  const std::string out = (dir_ / "out.ckpt").string();
  opt.save_state(out);
  std::ifstream in(out, std::ios::binary);
  std::stringstream saved;
  saved << in.rdbuf();
  EXPECT_EQ(saved.str(), bytes) << "the test's builder and the reader disagree on the format";
}

// AdamW writes the same file (one format for both optimizers): the hand-built file loads into
// AdamW and saves back byte for byte; HybridAdam's slices (three segments, one step) load too, and
// a partially applied step (segments of different steps) is refused naming the file.
TEST_F(CheckpointFormat, AdamWReadsAndWritesTheSameFile) {
  const std::string bytes = checkpoint_bytes(3, {{5, {{0, 5, 3}}}, {6, {{0, 6, 3}}}});
  AdamW opt(params_);
  opt.load_state(write("in.ckpt", bytes));
  EXPECT_EQ(opt.step_count(), 3);
  EXPECT_EQ(opt.exp_avg(1).data<float>()[5], 0.5f);
  EXPECT_EQ(opt.exp_avg_sq(0).data<float>()[0], 0.25f);
  const std::string out = (dir_ / "out.ckpt").string();
  opt.save_state(out);
  std::ifstream in(out, std::ios::binary);
  std::stringstream saved;
  saved << in.rdbuf();
  EXPECT_EQ(saved.str(), bytes);

  AdamW sliced(params_);
  sliced.load_state(
      write("sliced.ckpt", checkpoint_bytes(3, {{5, {{0, 2, 3}, {2, 3, 3}}}, {6, {}}})));
  EXPECT_EQ(sliced.exp_avg(0).data<float>()[4], 0.5f);
  EXPECT_FALSE(sliced.exp_avg(1).defined());  // never stepped
  const std::string partial =
      write("partial.ckpt", checkpoint_bytes(3, {{5, {{0, 2, 3}, {2, 3, 2}}}, {6, {{0, 6, 3}}}}));
  try {
    AdamW(params_).load_state(partial);
    FAIL() << "a partially applied step loaded into AdamW";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(partial), std::string::npos) << e.what();
  }
}

// Found while writing fuzz_optim_checkpoint: the bounds check computed offset + numel, which
// overflows int64 for a huge segment count (undefined behaviour; UBSan aborts, and where the sum
// wraps negative it passes the check and the corrupt file is accepted).
TEST_F(CheckpointFormat, ASegmentReachingPastTheParameterIsRefusedWithoutOverflow) {
  const int64_t huge = std::numeric_limits<int64_t>::max();
  for (int64_t numel : {huge, huge - 1, int64_t{6}}) {
    SCOPED_TRACE(numel);
    const std::string path =
        write("bad.ckpt", checkpoint_bytes(3, {{5, {{0, 5, 3}}}, {6, {{0, 1, 3}, {1, numel, 3}}}}));
    HybridAdam opt(params_);
    try {
      opt.load_state(path);
      FAIL() << "a segment of " << numel << " elements at offset 1 of a 6-element parameter loaded";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("do not tile"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
}

// Segments that stop short of the parameter's end loaded the rest as zeros and read every later
// parameter's data from the wrong place; a partially applied step loaded into HybridAdam too, where
// the old segment would get the next step's bias correction (AdamW refused it).
TEST_F(CheckpointFormat, SegmentsStoppingShortAndPartialStepsAreRefused) {
  const std::string shorter =
      write("short.ckpt", checkpoint_bytes(3, {{5, {{0, 3, 3}}}, {6, {{0, 6, 3}}}}));
  try {
    HybridAdam(params_).load_state(shorter);
    FAIL() << "segments covering 3 of 5 elements loaded";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("cover 3 of its 5 elements"), std::string::npos)
        << e.what();
  }
  const std::string partial =
      write("partial.ckpt", checkpoint_bytes(3, {{5, {{0, 2, 3}, {2, 3, 2}}}, {6, {{0, 6, 3}}}}));
  HybridAdam opt(params_);
  opt.load_state(write("whole.ckpt", checkpoint_bytes(1, {{5, {{0, 5, 1}}}, {6, {{0, 6, 1}}}})));
  EXPECT_THROW(opt.load_state(partial), FormatError);
  EXPECT_EQ(opt.step_count(), 1);  // as it was
  EXPECT_EQ(opt.state_copy(0).first.data<float>()[0], 0.5f);
}

// Note [Checked optimizer values]: the format has no checksum. A step of INT64_MAX trained zero
// steps and overflowed the schedule, -5 failed in the data reader with an internal message, and a
// NaN or negative v was reported a step later as a diverging gradient (lower --lr). Each is a
// FormatError naming the file now, in both optimizers.
TEST_F(CheckpointFormat, DamagedStepsAndMomentsAreRefusedNamingTheFile) {
  const auto file = [&](int64_t step, int64_t segment_step) {
    return checkpoint_bytes(step, {{5, {{0, 5, segment_step}}}, {6, {{0, 6, 3}}}});
  };
  // 24 bytes of header, two tables of 16 + 24: m of parameter 0 at 104, its v at 124.
  const auto with_float = [&](size_t at, float x) {
    std::string bytes = file(3, 3);
    std::memcpy(bytes.data() + at, &x, 4);
    return bytes;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {file(std::numeric_limits<int64_t>::max(), 3), "outside [0, 2^40]"},
      {file(-5, 3), "is at step -5"},
      {file(3, -1), "is at step -1"},
      {with_float(104 + 8, nan), "holds m = nan"},
      {with_float(124 + 4, -0.5f), "v = -0.5 at element 1"},
      {with_float(124, std::numeric_limits<float>::infinity()), "v = inf at element 0"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = write("damaged" + std::to_string(i) + ".ckpt", cases[i].first);
    for (int which = 0; which < 2; ++which) {
      SCOPED_TRACE(cases[i].second + (which ? " (AdamW)" : " (HybridAdam)"));
      try {
        if (which == 0)
          HybridAdam(params_).load_state(path);
        else
          AdamW(params_).load_state(path);
        ADD_FAILURE() << "the damaged file loaded";
      } catch (const FormatError& e) {
        EXPECT_NE(std::string(e.what()).find(cases[i].second), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace mw::optim
