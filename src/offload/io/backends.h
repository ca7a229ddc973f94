// Internal: constructors of the two IoEngine backends, used by IoEngine::create().
#pragma once

#include <memory>
#include <string>

#include "offload/io/io_engine.h"

namespace mw::io::detail {

// Starts an io_uring engine. Throws DeviceError (with the errno text) if the kernel refuses.
std::unique_ptr<IoEngine> make_uring_engine(const IoOptions& options);
// Every io_uring_submit fails while set (Note [A broken ring]); for tests.
void set_uring_submit_failure_for_testing(bool fail);
// While set, rings of more than `entries` entries fail to start (ENOMEM), as a memlock limit or a
// seccomp filter may refuse the engine's ring where the probe's 4 entries passed; 0 = off.
void set_uring_init_limit_for_testing(int entries);
// Returns "" when io_uring can run READ/WRITE here, else the reason it cannot.
std::string probe_uring();
std::unique_ptr<IoEngine> make_thread_engine(const IoOptions& options);

// Runs one transfer attempt's result through Note [Every completion is checked]. Shared by both
// backends so they agree exactly. `result` is the syscall/CQE result (>= 0 bytes, or -errno).
// Returns true when the request is finished (state.failed tells how); false when it must be
// resumed with another attempt from state.done_bytes.
bool account_attempt(RequestState& state, int64_t result, IoStats& stats);
// Length of the next attempt (honours an injected short first transfer).
int64_t next_attempt_bytes(RequestState& state);

}  // namespace mw::io::detail
