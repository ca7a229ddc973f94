// Note [Tensor states] (tensor_state.h).
#include "offload/gemini/tensor_state.h"

#include <cstdio>

namespace mw::gemini {

const char* state_name(TensorState s) {
  switch (s) {
    case TensorState::kFree: return "FREE";
    case TensorState::kCompute: return "COMPUTE";
    case TensorState::kHold: return "HOLD";
    case TensorState::kHoldAfterBwd: return "HOLD_AFTER_BWD";
    case TensorState::kReadyForReduce: return "READY_FOR_REDUCE";
  }
  return "?";
}

bool is_legal_transition(TensorState from, TensorState to) {
  using S = TensorState;
  switch (from) {
    case S::kFree: return to == S::kHold || to == S::kCompute;
    case S::kHold: return to == S::kFree || to == S::kCompute;
    case S::kCompute: return to == S::kHold || to == S::kHoldAfterBwd;
    case S::kHoldAfterBwd: return to == S::kCompute || to == S::kReadyForReduce;
    case S::kReadyForReduce: return to == S::kHold;
  }
  return false;
}

TensorStates::TensorStates(std::vector<std::string> names)
    : names_(std::move(names)),
      states_(names_.size(), TensorState::kFree),
      logged_(names_.size(), 0) {}

void TensorStates::set(size_t i, TensorState to) {
  const TensorState from = states_[i];
  if (from == to) return;
  if (!is_legal_transition(from, to)) {
    ++illegal_;
    if (!logged_[i]) {
      logged_[i] = 1;
      std::fprintf(stderr, "gemini: illegal tensor state transition %s -> %s of '%s'\n",
                   state_name(from), state_name(to), names_[i].c_str());
    }
  }
  states_[i] = to;
}

}  // namespace mw::gemini
