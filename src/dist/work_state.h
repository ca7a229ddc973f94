// The shared state behind a Work handle (communicator.h): completed once by the backend, waited on
// by any number of callers. Internal to src/dist.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>

#include "dist/communicator.h"

namespace mw::dist {

struct Work::State {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  std::function<void(double wait_ms)> on_wait;  // adds to the communicator's wait_ms
  void finish(std::exception_ptr e = nullptr);
};

// Checks reduce_scatter (scatter) and all_gather shapes: the whole is size x the piece; and both
// tensors as check_collective_tensor(.., cuda_device).
void check_shard_shapes(const Tensor& input, const Tensor& output, int64_t size, bool scatter,
                        int cuda_device = -1);

}  // namespace mw::dist
