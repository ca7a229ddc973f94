// Stopping cleanly on SIGINT / SIGTERM.
//
// Note [Stop signals]: a long run must not die inside a save, leaving temporary files behind, nor
// lose an earlier save. install_stop_signal_handlers() makes the first SIGINT or SIGTERM only set
// a flag (the handler does nothing else, so it is async-signal-safe); the run polls it between
// steps and between file writes (throw_if_stop_requested) and throws Interrupted, whose unwinding
// removes temporary files (their owners' destructors) before main() exits with 128 + the signal
// (130 for SIGINT, 143 for SIGTERM), the shell's convention. A second signal of either kind
// restores the default action and re-raises, so an impatient user can always kill the process;
// what that leaves is recognisable by name and removed by the next save to the same place
// (data/file_io.h).
#pragma once

#include "core/error.h"

namespace mw {

// Thrown by throw_if_stop_requested(); carries the signal number.
class Interrupted : public Error {
 public:
  Interrupted(const std::string& what, int signal) : Error(what), signal(signal) {}
  int signal;
  int exit_code() const { return 128 + signal; }
};

// Installs the handlers for SIGINT and SIGTERM (idempotent).
void install_stop_signal_handlers();
// The signal received since installation, or 0.
int stop_signal();
// Throws Interrupted ("interrupted by SIGINT <while>") when a stop signal has arrived.
void throw_if_stop_requested(const char* while_doing);
// Test hook: clears the flag.
void clear_stop_request_for_testing();

}  // namespace mw
