// Per-op time of a training step (issue #13: "find the time outside GEMM first"), for gpt2_bench.
//
// Note [Op profile]: each differentiable function (autograd/functions.cpp) opens a Scope named
// after its op for its forward, and the autograd engine one named after the node for each backward
// node it runs (AccumulateGrad includes the grad-ready hooks: HybridAdam's updates in backward). A
// Scope's time is exclusive: a Scope opened inside another on the same thread pauses the outer one
// (a recomputed forward inside a checkpoint's backward, `mean` calling `sum`), so the entries add
// up to the time the thread spent inside any Scope. Each entry also holds the gemm() time inside it
// (ops::gemm_stats), so the table shows what is GEMM and what is not. Off by default: then a Scope
// costs one relaxed atomic load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mw::profile {

struct OpTime {
  std::string name;
  int64_t calls = 0;
  double ms = 0, gemm_ms = 0;  // exclusive time; the gemm() time within it
};

// Starts (with an empty table) or stops recording, for every thread.
void enable(bool on);
bool enabled();
// The table recorded since enable(true) or the last take(), longest first; empties it.
std::vector<OpTime> take();

class Scope {
 public:
  explicit Scope(const char* name);
  explicit Scope(const std::string& name) : Scope(name.c_str()) {}
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void pause(int64_t now_ns, int64_t gemm_ns);
  void resume(int64_t now_ns, int64_t gemm_ns);
  bool active_ = false;
  std::string name_;
  Scope* outer_ = nullptr;
  int64_t start_ns_ = 0, gemm_start_ns_ = 0, ns_ = 0, gemm_ns_ = 0;
};

}  // namespace mw::profile
