// What the NCCL tests share (nccl_communicator_test.cpp, nccl_train_test.cpp): where this build's
// NCCL module is, and whether `ranks` NCCL ranks can run on this machine.
#pragma once

#include <filesystem>
#include <string>

#include "core/cuda_stream.h"
#include "mpi_launch.h"

namespace mw::testing {

inline std::string nccl_module() {
  return std::string(MW_BINARY_DIR) + "/src/dist/libmw_dist_nccl.so";
}

// Empty when `ranks` NCCL ranks (one GPU each) can run here; else why not.
inline std::string nccl_unavailable(int ranks) {
  if (is_mpi_worker()) return "inside a worker";
  if (cuda_device_count() < ranks)
    return "no CUDA device: " + std::to_string(ranks) + " GPU(s) needed, " +
           std::to_string(cuda_device_count()) +
           " visible (or a build without CUDA); the NCCL backend has not run here";
  if (!std::filesystem::exists(nccl_module()))
    return "the NCCL backend module was not built (cmake: 'memwall: NCCL backend OFF')";
  return mpi_unavailable();
}

}  // namespace mw::testing
