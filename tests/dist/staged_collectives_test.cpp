// Note [Staged collectives] (src/dist/communicator.h): collectives on tensors outside the
// communicator's memory run on copies there and copy their result back when waited for. Without a
// GPU the memory a communicator requires is played by the sim device: a stand-in communicator
// that requires sim tensors, and computes each collective as two ranks holding the same tensors
// would (an all_reduce doubles, an all_gather repeats), so that a result not copied back, or read
// from the caller's tensor instead of the copy, shows.
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "core/tensor.h"
#include "dist/communicator.h"

namespace mw {
namespace {

using dist::Work;

class TwinRanksOnSim : public dist::Communicator {
 public:
  explicit TwinRanksOnSim(std::optional<Device> memory) : memory_(memory) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string backend() const override { return "twin"; }
  std::optional<Device> required_memory() const override { return memory_; }
  Work all_reduce(const Tensor& t) override {
    see(t);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] *= 2;
    return Work();
  }
  Work reduce_scatter(const Tensor& in, const Tensor& out) override {
    see(in), see(out);
    for (int64_t i = 0; i < out.numel(); ++i) out.data<float>()[i] = 2 * in.data<float>()[i];
    return Work();
  }
  Work all_gather(const Tensor& in, const Tensor& out) override {
    see(in), see(out);
    for (int64_t i = 0; i < out.numel(); ++i)
      out.data<float>()[i] = in.data<float>()[i % in.numel()];
    return Work();
  }
  Work broadcast(const Tensor& t, int) override {
    see(t);
    return Work();
  }
  Work barrier() override { return Work(); }
  dist::CommStats stats() const override { return {}; }
  void reset_stats() override {}
  void set_timeout_ms(double) override {}
  void abandon() override {}

  std::vector<Device> seen;            // the devices of the tensors each collective got
  std::vector<const void*> addresses;  // and their bytes

 private:
  void see(const Tensor& t) {
    seen.push_back(t.device());
    addresses.push_back(t.raw_data());
  }
  std::optional<Device> memory_;
};

Tensor values(std::vector<float> v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

std::vector<float> read(const Tensor& t) {
  const Tensor h = t.to(Device::cpu());
  return {h.data<float>(), h.data<float>() + h.numel()};
}

TEST(StagedCollectives, HostTensorsRunOnCopiesInTheRequiredMemoryAndTakeTheResultAtWait) {
  TwinRanksOnSim comm(Device::sim());
  Tensor t = values({1, 2, 3});
  dist::StagedWork w = dist::staged_all_reduce(comm, t);
  EXPECT_EQ(read(t), (std::vector<float>{1, 2, 3}));  // the collective ran on the copy
  w.wait();
  EXPECT_EQ(read(t), (std::vector<float>{2, 4, 6}));
  Tensor in = values({1, 2}), out = values({-1, -1, -1, -1});
  dist::StagedWork g = dist::staged_all_gather(comm, in, out);
  EXPECT_EQ(read(out), (std::vector<float>{-1, -1, -1, -1}));
  g.wait();
  EXPECT_EQ(read(out), (std::vector<float>{1, 2, 1, 2}));
  Tensor whole = values({1, 2, 3, 4}), piece = values({0, 0});
  dist::staged_reduce_scatter(comm, whole, piece).wait();
  EXPECT_EQ(read(piece), (std::vector<float>{2, 4}));
  for (const Device& d : comm.seen) EXPECT_EQ(d, Device::sim());
  g.wait();  // a second wait copies nothing again
  EXPECT_EQ(read(out), (std::vector<float>{1, 2, 1, 2}));
}

// An in-place reduce_scatter (the output is the input's front, as Gemini's chunk gradients) stays
// in place on the copy: the collective gets the same bytes for both.
TEST(StagedCollectives, AnInPlaceReduceScatterStaysInPlaceOnTheCopy) {
  TwinRanksOnSim comm(Device::sim());
  Tensor grad = values({1, 2, 3, 4});
  dist::staged_reduce_scatter(comm, grad, grad.narrow(0, 0, 2)).wait();
  EXPECT_EQ(read(grad.narrow(0, 0, 2)), (std::vector<float>{2, 4}));
  ASSERT_EQ(comm.addresses.size(), 2u);
  EXPECT_EQ(comm.addresses[0], comm.addresses[1]);
  EXPECT_NE(comm.addresses[0], grad.raw_data());
}

TEST(StagedCollectives, TensorsAlreadyThereAndHostBackendsCopyNothing) {
  for (std::optional<Device> memory : {std::optional<Device>(), std::optional(Device::sim())}) {
    TwinRanksOnSim comm(memory);
    Tensor t = memory ? values({1, 2}).to(Device::sim()) : values({1, 2});
    dist::staged_all_reduce(comm, t).wait();
    dist::staged_broadcast(comm, t, 0).wait();
    ASSERT_EQ(comm.addresses.size(), 2u);
    EXPECT_EQ(comm.addresses[0], t.raw_data());
    EXPECT_EQ(comm.addresses[1], t.raw_data());
    EXPECT_EQ(read(t), (std::vector<float>{2, 4}));
  }
}

}  // namespace
}  // namespace mw
