// The state of each parameter tensor in a chunk (ColossalAI's TensorState), with the whitelist of
// legal transitions (docs/references.md, "Gemini").
//
// Note [Tensor states]: FREE (no bytes yet) -> HOLD (has values, not in use) -> COMPUTE (an op is
// using it) -> HOLD (forward done) ... COMPUTE -> HOLD_AFTER_BWD (its backward is done) ->
// READY_FOR_REDUCE (its gradient is final) -> HOLD (the gradient is in its chunk's buffer). Every
// transition outside the whitelist is an error in the hook logic: ColossalAI silently ignores it;
// here it is applied anyway (so the run goes on), counted, logged once per tensor with the tensor's
// name, and reported in the training log as illegal_transitions. A normal run has zero. Setting the
// state a tensor already has is not a transition.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mw::gemini {

enum class TensorState : uint8_t { kFree, kCompute, kHold, kHoldAfterBwd, kReadyForReduce };

const char* state_name(TensorState s);
bool is_legal_transition(TensorState from, TensorState to);

class TensorStates {
 public:
  explicit TensorStates(std::vector<std::string> names);
  TensorState get(size_t i) const { return states_[i]; }
  // Moves tensor i to `to`; an illegal move is applied, counted and logged once (Note [Tensor
  // states]).
  void set(size_t i, TensorState to);
  int64_t illegal_transitions() const { return illegal_; }
  size_t size() const { return states_.size(); }
  const std::string& name(size_t i) const { return names_[i]; }

 private:
  std::vector<std::string> names_;
  std::vector<TensorState> states_;
  std::vector<char> logged_;
  int64_t illegal_ = 0;
};

}  // namespace mw::gemini
