// The stop-signal flag, the deferral, and the second signal's cleanup of Note [Stop signals].
#include "core/interrupt.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

namespace mw {

namespace {

volatile sig_atomic_t g_stop_signal = 0;
std::atomic<bool> g_deferred{false};
int g_wake_pipe[2] = {-1, -1};  // the handler writes the second signal's number into [1]

struct Temporaries {
  std::mutex mutex;
  std::map<int64_t, std::string> paths;
  int64_t next_id = 0;
};

Temporaries& temporaries() {
  static Temporaries* t = new Temporaries;  // never destroyed: the watcher may run during exit
  return *t;
}

extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal == 0) {
    g_stop_signal = sig;
    if (g_deferred) {  // said at once: nothing else shows that the signal arrived (write(2) is
                       // async-signal-safe)
      static const char kDeferred[] =
          "\nstop signal received: finishing what is under way (the step, its checkpoint, the "
          "saves); send it again to stop at once\n";
      [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, kDeferred, sizeof kDeferred - 1);
    }
    return;
  }
  ::signal(sig, SIG_DFL);  // a third signal kills even if the cleanup hangs
  const unsigned char byte = static_cast<unsigned char>(sig);
  if (g_wake_pipe[1] < 0 || ::write(g_wake_pipe[1], &byte, 1) != 1) ::raise(sig);
}

// Removes what is registered (twice: a file created meanwhile in a staged folder makes the first
// removal of that folder fail), says so on stderr, and exits 128 + the signal.
[[noreturn]] void second_signal_exit(int sig) {
  for (int pass = 0; pass < 2; ++pass) {
    std::lock_guard<std::mutex> lock(temporaries().mutex);
    for (const auto& [id, path] : temporaries().paths) {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  }
  const std::string msg = str("stopped at once by a second ", signal_name(sig),
                              "; temporary files removed, earlier saves left as they were\n");
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, msg.data(), msg.size());
  ::_exit(128 + sig);
}

void watch_for_second_signal() {
  unsigned char byte = 0;
  for (;;) {
    const ssize_t n = ::read(g_wake_pipe[0], &byte, 1);
    if (n == 1) second_signal_exit(byte);
    if (n == 0 || (n < 0 && errno != EINTR)) return;
  }
}

}  // namespace

void install_stop_signal_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (::pipe2(g_wake_pipe, O_CLOEXEC) == 0) {
      std::thread(watch_for_second_signal).detach();
    } else {
      g_wake_pipe[0] = g_wake_pipe[1] = -1;  // no cleanup: the second signal kills as before
    }
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // blocking calls resume; the flag is polled between them
    // A file size limit (ulimit -f, passed on by a batch scheduler) killed the run with SIGXFSZ:
    // no message, temporary files left. Ignored, the write fails with EFBIG, which the I/O paths
    // name ("the file size limit (ulimit -f)") and clean up after as after any failed write.
    ::signal(SIGXFSZ, SIG_IGN);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      // Ignored when we start: left so (Note [Stop signals]: nohup, a script's background job).
      struct sigaction before;
      if (::sigaction(sig, nullptr, &before) == 0 && before.sa_handler == SIG_IGN) continue;
      ::sigaction(sig, &sa, nullptr);
    }
  });
}

int stop_signal() { return g_stop_signal; }

std::string signal_name(int signal) {
  return signal == SIGINT    ? "SIGINT"
         : signal == SIGTERM ? "SIGTERM"
         : signal == SIGHUP  ? "SIGHUP"
                             : str("signal ", signal);
}

void throw_if_stop_requested(const char* while_doing) {
  const int sig = g_stop_signal;
  if (sig == 0 || g_deferred) return;
  throw Interrupted(str("interrupted by ", signal_name(sig), " ", while_doing,
                        "; temporary files removed, earlier saves left as they were"),
                    sig);
}

bool stop_deferred() { return g_deferred; }

void clear_stop_request_for_testing() { g_stop_signal = 0; }

StopDeferral::StopDeferral() { g_deferred = true; }
StopDeferral::~StopDeferral() { g_deferred = false; }

void TemporaryPath::set(const std::string& path) {
  release();
  Temporaries& t = temporaries();
  std::lock_guard<std::mutex> lock(t.mutex);
  id_ = t.next_id++;
  t.paths.emplace(id_, path);
}

void TemporaryPath::release() {
  if (id_ < 0) return;
  Temporaries& t = temporaries();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.paths.erase(id_);
  id_ = -1;
}

}  // namespace mw
