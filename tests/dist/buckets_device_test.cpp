// Note [Buckets on CUDA] (src/train/data_parallel.cpp): a DataParallel takes its parameters in the
// communicator's memory, host tensors for the host backends and the rank's GPU for NCCL, and says
// which when they are elsewhere. Runs without a GPU: a communicator that reports a CUDA device
// (as the NCCL one does) stands in for NCCL; the buckets on a device are measured on a GPU only
// (nccl_train_test.cpp).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "core/error.h"
#include "core/tensor.h"
#include "dist/communicator.h"
#include "train/data_parallel.h"

namespace mw {
namespace {

// The local communicator, but claiming the memory of cuda:`device`, as NCCL's rank would.
class CudaClaimingCommunicator : public dist::Communicator {
 public:
  explicit CudaClaimingCommunicator(int device) : device_(device) {}
  int rank() const override { return local_->rank(); }
  int size() const override { return local_->size(); }
  std::string backend() const override { return "nccl-like"; }
  int cuda_device() const override { return device_; }
  dist::Work all_reduce(const Tensor& t) override { return local_->all_reduce(t); }
  dist::Work reduce_scatter(const Tensor& in, const Tensor& out) override {
    return local_->reduce_scatter(in, out);
  }
  dist::Work all_gather(const Tensor& in, const Tensor& out) override {
    return local_->all_gather(in, out);
  }
  dist::Work broadcast(const Tensor& t, int root) override { return local_->broadcast(t, root); }
  dist::Work barrier() override { return local_->barrier(); }
  dist::CommStats stats() const override { return local_->stats(); }
  void reset_stats() override { local_->reset_stats(); }
  void set_timeout_ms(double ms) override { local_->set_timeout_ms(ms); }
  void abandon() override { local_->abandon(); }

 private:
  int device_;
  std::shared_ptr<dist::Communicator> local_ = dist::make_local_communicator();
};

std::string refusal(std::shared_ptr<dist::Communicator> comm, const Tensor& param) {
  try {
    train::DataParallel dp(std::move(comm), {param}, 0, 1 << 20);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(BucketsDevice, HostParametersOverACudaBackendAreRefusedNamingItsDevice) {
  const Tensor p = Tensor::zeros({4, 3});
  const std::string why = refusal(std::make_shared<CudaClaimingCommunicator>(1), p);
  EXPECT_NE(why.find("data parallel over the nccl-like backend takes tensors on cuda:1 (this "
                     "rank's NCCL device); found one on cpu (NCCL takes CUDA tensors)"),
            std::string::npos)
      << why;
  EXPECT_NE(refusal(std::make_shared<CudaClaimingCommunicator>(0),
                    Tensor::zeros({3}, DType::F32, Device::sim())),
            "");
}

TEST(BucketsDevice, HostBackendsKeepHostParametersAndBuffers) {
  auto comm = dist::make_local_communicator();
  EXPECT_EQ(refusal(comm, Tensor::zeros({4, 3})), "");
  EXPECT_EQ(refusal(comm, Tensor::zeros({4, 3}, DType::F32, Device::sim())), "");
  const Tensor p = Tensor::zeros({4, 3}, DType::F32, Device::sim());
  train::DataParallel dp(comm, {p}, 1, 1 << 20);
  EXPECT_EQ(dp.comm_device(), Device::cpu());
  EXPECT_DOUBLE_EQ(dp.sum_over_ranks(2.5), 2.5);
  EXPECT_DOUBLE_EQ(dp.mean_over_ranks(2.5), 2.5);
}

}  // namespace
}  // namespace mw
