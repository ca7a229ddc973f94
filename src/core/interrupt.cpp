// The stop-signal flag of Note [Stop signals].
#include "core/interrupt.h"

#include <signal.h>

#include <cstring>

namespace mw {

namespace {

volatile sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal != 0) {  // the second one: the default action, now
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  g_stop_signal = sig;
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking calls resume; the flag is polled between them
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

int stop_signal() { return g_stop_signal; }

void throw_if_stop_requested(const char* while_doing) {
  const int sig = g_stop_signal;
  if (sig == 0) return;
  throw Interrupted(str("interrupted by ", sig == SIGINT ? "SIGINT" : "SIGTERM", " ", while_doing,
                        "; temporary files removed, earlier saves left as they were"),
                    sig);
}

void clear_stop_request_for_testing() { g_stop_signal = 0; }

}  // namespace mw
