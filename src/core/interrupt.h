// Stopping cleanly on SIGINT / SIGTERM / SIGHUP.
//
// Note [Stop signals]: a long run must not die inside a save, leaving temporary files behind, nor
// lose an earlier save. install_stop_signal_handlers() makes the first SIGINT, SIGTERM or SIGHUP
// only set a flag (the handler does nothing else, so it is async-signal-safe). SIGHUP is a
// terminal closing (an ssh session dropped): it used to kill the run at once, losing the step
// under way and its checkpoint. A signal ignored when the process starts stays ignored, as the
// shell's conventions expect: `nohup` ignores SIGHUP (the run goes on after the terminal closes),
// and a script's background job (`cmd &`) ignores SIGINT (Ctrl-C stops the script, not it).
//  - Normally the run polls the flag between steps and between file writes
//    (throw_if_stop_requested) and throws Interrupted, whose unwinding removes temporary files
//    (their owners' destructors) before main() exits with 128 + the signal (130 for SIGINT, 143
//    for SIGTERM, 129 for SIGHUP), the shell's convention.
//  - A run that can checkpoint (gpt2_train --checkpoint-dir) defers the flag instead
//    (StopDeferral): the polls do not throw, so the step under way (an xl step takes a minute)
//    finishes, and so does a save under way; the loop then writes a checkpoint and exits 130/143,
//    and --resume continues bit for bit. Abandoning a step half-way is not done: HybridAdam may
//    already have updated some parameters and their NVMe states, which no checkpoint could undo.
//  - A second signal of either kind exits at once, whatever the run is doing: the handler writes
//    one byte to a pipe, and a watcher thread (ordinary code, not the handler) removes every
//    TemporaryPath still registered (".NAME.tmp-PID" save files and folders) and calls _exit(128 +
//    signal). The handler also restores the default action, so a third signal kills even if the
//    cleanup hangs. NVMe swap files need no removal: they are unlinked at creation (Note [NVMe
//    files]). What a kill -9 leaves is recognisable by name and removed by the next save to the
//    same place (data/atomic_save.h).
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"

namespace mw {

// Thrown by throw_if_stop_requested(); carries the signal number.
class Interrupted : public Error {
 public:
  Interrupted(const std::string& what, int signal) : Error(what), signal(signal) {}
  int signal;
  int exit_code() const { return 128 + signal; }
};

// Installs the handlers for SIGINT, SIGTERM and SIGHUP (those not ignored at start) and starts the
// watcher thread (idempotent).
void install_stop_signal_handlers();
// The signal received since installation, or 0.
int stop_signal();
// "SIGINT", "SIGTERM", "SIGHUP" (or "signal N").
std::string signal_name(int signal);
// Throws Interrupted ("interrupted by SIGINT <while>") when a stop signal has arrived, unless a
// StopDeferral is alive (then the caller's loop polls stop_signal() at its own safe points).
void throw_if_stop_requested(const char* while_doing);
// True while a StopDeferral is alive.
bool stop_deferred();
// Test hook: clears the flag.
void clear_stop_request_for_testing();

// While alive, a first stop signal only sets the flag (Note [Stop signals]). Not nestable.
class StopDeferral {
 public:
  StopDeferral();
  ~StopDeferral();
  StopDeferral(const StopDeferral&) = delete;
  StopDeferral& operator=(const StopDeferral&) = delete;
};

// A temporary file or folder that a second stop signal removes before exiting (Note [Stop
// signals]). Registered by set(), unregistered by release() or the destructor; the owner still
// removes it itself on every other path.
class TemporaryPath {
 public:
  TemporaryPath() = default;
  ~TemporaryPath() { release(); }
  TemporaryPath(const TemporaryPath&) = delete;
  TemporaryPath& operator=(const TemporaryPath&) = delete;
  void set(const std::string& path);
  void release();

 private:
  int64_t id_ = -1;
};

}  // namespace mw
