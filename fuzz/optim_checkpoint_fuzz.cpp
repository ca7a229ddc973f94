// libFuzzer target: the optimizer checkpoint reader (HybridAdam::load_state, Note [Optimizer
// checkpoint format] in src/optim/hybrid_adam.cpp). Two optimizers over the same small parameters
// load every input: one with its states in memory, one with all of them on disk in 1024-element
// slices (the smallest the store takes), so that segments are mapped onto two slices of the first
// parameter. Loading must succeed or throw a typed error. fuzz/make_corpus.py writes seeds for
// these shapes.
#include <cstdint>
#include <memory>
#include <vector>

#include "core/error.h"
#include "fuzz_input.h"
#include "optim/hybrid_adam.h"

namespace {

std::vector<mw::Tensor> make_params() {
  return {mw::Tensor::zeros({1030}), mw::Tensor::zeros({2, 3}), mw::Tensor::zeros({1})};
}

struct Optimizers {
  std::vector<mw::Tensor> in_memory_params = make_params();
  std::vector<mw::Tensor> on_disk_params = make_params();
  mw::optim::HybridAdam in_memory{in_memory_params};
  std::unique_ptr<mw::optim::HybridAdam> on_disk;
  Optimizers() {
    mw::optim::NvmeOffloadOptions nvme;
    nvme.fraction = 1.0;
    nvme.dir = mw::fuzz::input_file().dir();
    nvme.slice_numel = 1024;
    nvme.window_bytes = 4 * 8 * 1024;
    on_disk = std::make_unique<mw::optim::HybridAdam>(on_disk_params,
                                                      mw::optim::HybridAdamOptions({}, -1.f, nvme));
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Optimizers opt;
  const std::string& path = mw::fuzz::input_file().write(data, size);
  for (mw::optim::HybridAdam* o : {&opt.in_memory, opt.on_disk.get()}) {
    try {
      o->load_state(path);
    } catch (const mw::Error&) {
    }
  }
  return 0;
}
