// IoEngine's backend-independent half: request validation, fault injection, handles, waiting,
// the completion accounting both backends share, and the backend choice of IoEngine::create().
//
// Note [Backend choice]: an explicit IoOptions::backend wins; with kAuto the environment variable
// MW_IO_BACKEND (uring|threads|auto) decides; otherwise a probe sets up a small ring and runs a
// NOP, READ and WRITE opcode check. If the probe fails, the thread pool is used. The choice and its
// reason are logged once per engine.
#include "offload/io/io_engine.h"

#include <atomic>
#include <cerrno>
#include <cstdlib>

#include "core/error.h"
#include "core/numbers.h"
#include "offload/io/backends.h"
#include "offload/io/log.h"

namespace mw::io {

using detail::RequestState;

const char* backend_kind_name(BackendKind kind) {
  switch (kind) {
    case BackendKind::kAuto: return "auto";
    case BackendKind::kUring: return "uring";
    case BackendKind::kThreads: return "threads";
  }
  return "?";
}

BackendKind parse_backend_kind(const std::string& text) {
  if (text == "auto" || text.empty()) return BackendKind::kAuto;
  if (text == "uring" || text == "io_uring") return BackendKind::kUring;
  if (text == "threads") return BackendKind::kThreads;
  throw InvalidArgument(
      str("I/O backend '", text, "' is unknown; expected one of auto, uring, threads"));
}

// ---- handles ---------------------------------------------------------------------------------

namespace {
bool all_complete(const std::vector<std::shared_ptr<RequestState>>& states) {
  for (const auto& s : states)
    if (!s->complete.load(std::memory_order_acquire)) return false;
  return true;
}
}  // namespace

bool IoHandle::done() const {
  if (all_complete(states_)) return true;  // without touching the engine (it may be gone)
  engine_->poll();
  return all_complete(states_);
}

bool IoHandle::failed() const {
  if (!all_complete(states_)) return false;
  for (const auto& s : states_)
    if (s->failed) return true;
  return false;
}

void IoHandle::wait() const {
  if (!all_complete(states_)) engine_->wait_states(states_);
  for (const auto& s : states_) {
    if (s->failed) {
      s->observed.store(true, std::memory_order_relaxed);
      throw IoError(s->error_message, s->request.path, s->request.offset, s->request.length,
                    s->err);
    }
  }
}

void IoHandle::join() const {
  if (!all_complete(states_)) engine_->wait_states(states_);
}

void IoHandle::merge(const IoHandle& other) {
  if (!engine_) engine_ = other.engine_;
  states_.insert(states_.end(), other.states_.begin(), other.states_.end());
}

// ---- engine ----------------------------------------------------------------------------------

IoEngine::IoEngine(int queue_depth) : queue_depth_(queue_depth) {}

IoEngine::~IoEngine() = default;  // backends drain before tearing down their machinery

void IoEngine::set_fault_injector(FaultInjector injector) {
  std::lock_guard<std::mutex> lock(mutex_);
  injector_ = std::move(injector);
}

IoStats IoEngine::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

IoHandle IoEngine::submit(const IoRequest& request) {
  return submit(std::span<const IoRequest>(&request, 1))[0];
}

std::vector<IoHandle> IoEngine::submit(std::span<const IoRequest> requests) {
  for (const IoRequest& r : requests) {
    MW_CHECK_T(InvalidArgument, r.fd >= 0, "IoEngine::submit: request on '", r.path,
               "' has no open file descriptor (fd ", r.fd, ")");
    MW_CHECK_T(InvalidArgument, r.offset >= 0 && r.length >= 0, "IoEngine::submit: request on '",
               r.path, "' has offset ", r.offset, " and length ", r.length, "; both must be >= 0");
    MW_CHECK_T(InvalidArgument, r.buf != nullptr || r.length == 0, "IoEngine::submit: request on '",
               r.path, "' has a null buffer");
  }
  std::vector<IoHandle> handles(requests.size());
  std::vector<std::shared_ptr<RequestState>> to_start;
  to_start.reserve(requests.size());
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < requests.size(); ++i) {
    auto state = std::make_shared<RequestState>();
    state->request = requests[i];
    state->seq = next_seq_++;
    if (injector_) {
      Fault fault = injector_(state->request, state->seq);
      state->fault_error = fault.error;
      state->first_limit_bytes = fault.short_bytes;
    }
    handles[i].engine_ = this;
    handles[i].states_.push_back(state);
    ++outstanding_;
    if (state->request.length == 0 && state->fault_error == 0) {
      finish_locked(state);  // nothing to move
    } else {
      to_start.push_back(std::move(state));
    }
  }
  if (!to_start.empty()) enqueue_locked(to_start);
  return handles;
}

void IoEngine::finish_locked(const std::shared_ptr<RequestState>& state) {
  ++stats_.requests_completed;
  if (state->failed) {
    ++stats_.requests_failed;
    failed_.push_back(state);
  }
  --outstanding_;
  state->complete.store(true, std::memory_order_release);
  completed_cv_.notify_all();
}

void IoEngine::wait_states(const std::vector<std::shared_ptr<RequestState>>& states) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!all_complete(states)) await_progress(lock);
}

int64_t IoEngine::wait_any(std::span<const IoHandle> handles) {
  if (handles.empty()) return -1;
  auto first_done = [&]() -> int64_t {
    for (size_t i = 0; i < handles.size(); ++i)
      if (all_complete(handles[i].states_)) return static_cast<int64_t>(i);
    return -1;
  };
  int64_t i = first_done();
  if (i >= 0) return i;
  std::unique_lock<std::mutex> lock(mutex_);
  poll_locked();
  while ((i = first_done()) < 0) await_progress(lock);
  return i;
}

void IoEngine::poll() {
  std::lock_guard<std::mutex> lock(mutex_);
  poll_locked();
}

void IoEngine::drain(std::unique_lock<std::mutex>& lock) {
  while (outstanding_ > 0) await_progress(lock);
}

void IoEngine::wait_all() {
  std::unique_lock<std::mutex> lock(mutex_);
  drain(lock);
  std::vector<std::shared_ptr<RequestState>> failed;
  failed.swap(failed_);
  std::shared_ptr<RequestState> first;
  int64_t unreported = 0;
  for (auto& s : failed) {
    if (s->observed.load(std::memory_order_relaxed)) continue;
    s->observed.store(true, std::memory_order_relaxed);
    if (!first) first = s;
    ++unreported;
  }
  if (!first) return;
  const IoRequest& r = first->request;
  std::string what = first->error_message;
  if (unreported > 1) what += str(" (and ", unreported - 1, " more failed requests)");
  throw IoError(what, r.path, r.offset, r.length, first->err);
}

// ---- completion accounting (Note [Every completion is checked]) --------------------------------

namespace detail {

int64_t next_attempt_bytes(RequestState& state) {
  int64_t remaining = state.request.length - state.done_bytes;
  if (state.first_attempt && state.first_limit_bytes >= 0 && state.first_limit_bytes < remaining)
    return state.first_limit_bytes;
  return remaining;
}

bool account_attempt(RequestState& state, int64_t result, IoStats& stats) {
  state.first_attempt = false;
  const IoRequest& r = state.request;
  const char* verb = r.op == IoOp::kRead ? "read" : "write";
  if (state.fault_error != 0) result = -state.fault_error;
  if (result == -EINTR || result == -EAGAIN) return false;  // retry the same range
  if (result < 0) {
    int err = static_cast<int>(-result);
    state.failed = true;
    state.err = err;
    std::string hint;
    if (err == EINVAL)
      hint = "; with O_DIRECT the buffer address, offset and length must be multiples of 4096";
    else if (err == ENOSPC)
      hint = "; free space on that drive or point the offload directory elsewhere";
    else if (err == EFBIG)
      hint = str("; ", kFileTooLargeHint);
    else if (err == EIO)
      hint =
          "; the drive or its file system reported an error (the kernel log, dmesg, may say "
          "which); saved models and checkpoints are other files, kept as they were";
    state.error_message =
        str(verb, " of ", r.length, " bytes at offset ", r.offset, " of '", r.path,
            "' failed after ", state.done_bytes, " bytes: ", errno_text(err), hint);
    return true;
  }
  if (result == 0 && state.done_bytes < r.length) {
    state.failed = true;
    state.err = 0;
    state.error_message =
        r.op == IoOp::kRead
            ? str("read of ", r.length, " bytes at offset ", r.offset, " of '", r.path,
                  "' hit end of file after ", state.done_bytes,
                  " bytes; the file is shorter than expected (truncated or never written)")
            : str("write of ", r.length, " bytes at offset ", r.offset, " of '", r.path,
                  "' made no progress after ", state.done_bytes, " bytes (the kernel wrote 0)");
    return true;
  }
  state.done_bytes += result;
  (r.op == IoOp::kRead ? stats.bytes_read : stats.bytes_written) += result;
  if (state.done_bytes < r.length) {
    ++stats.resumed_transfers;
    return false;
  }
  return true;
}

}  // namespace detail

// ---- backend choice (Note [Backend choice]) ----------------------------------------------------

// MW_IO_FAULT="eio@N" | "read-eio@N" (a test hook for whole processes, as MW_WRITE_FAULT is for
// file writes): the Nth request (1-based) over every engine of this process, or the Nth read, and
// each one after it, fails with EIO; a bad value is refused.
static void install_env_fault(IoEngine& engine) {
  struct Spec {
    int64_t at = 0;
    bool reads_only = false;
  };
  static const Spec spec = [] {
    Spec out;
    const char* env = std::getenv("MW_IO_FAULT");
    if (!env || !*env) return out;
    std::string text = env;
    out.reads_only = text.rfind("read-", 0) == 0;
    if (out.reads_only) text = text.substr(5);
    MW_CHECK_T(InvalidArgument, text.rfind("eio@", 0) == 0, "MW_IO_FAULT '", env,
               "': expected eio@N or read-eio@N (the Nth I/O request, or read, of this process "
               "fails)");
    out.at = parse_integer(text.substr(4), "MW_IO_FAULT", 1, INT64_MAX);
    return out;
  }();
  if (spec.at == 0) return;
  static std::atomic<int64_t> seen{0};
  engine.set_fault_injector([](const IoRequest& r, int64_t) {
    Fault f;
    if (spec.reads_only && r.op != IoOp::kRead) return f;
    if (seen.fetch_add(1) + 1 >= spec.at) f.error = EIO;
    return f;
  });
}

std::unique_ptr<IoEngine> create_engine_with_reason(BackendKind kind, const IoOptions& options,
                                                    std::string reason) {
  std::unique_ptr<IoEngine> engine = kind == BackendKind::kUring
                                         ? detail::make_uring_engine(options)
                                         : detail::make_thread_engine(options);
  install_env_fault(*engine);
  engine->choice_reason_ = reason;
  log_info(str("backend ", engine->backend_name(), " (queue depth ", options.queue_depth,
               "): ", reason));
  return engine;
}

std::unique_ptr<IoEngine> IoEngine::create(const IoOptions& options) {
  MW_CHECK_T(InvalidArgument, options.queue_depth >= 1 && options.queue_depth <= 4096,
             "IoOptions::queue_depth must be in [1, 4096]; got ", options.queue_depth);
  MW_CHECK_T(InvalidArgument, options.threads >= 0 && options.threads <= 1024,
             "IoOptions::threads must be in [0, 1024]; got ", options.threads);
  if (options.backend != BackendKind::kAuto) {
    std::string why = str("requested by IoOptions (", backend_kind_name(options.backend), ")");
    if (options.backend == BackendKind::kUring) {
      std::string problem = detail::probe_uring();
      MW_CHECK_T(DeviceError, problem.empty(), "the io_uring backend was requested but ", problem,
                 "; use the threads backend (MW_IO_BACKEND=threads)");
    }
    return create_engine_with_reason(options.backend, options, why);
  }
  if (const char* env = std::getenv("MW_IO_BACKEND"); env && *env) {
    BackendKind kind = parse_backend_kind(env);
    if (kind != BackendKind::kAuto) {
      if (kind == BackendKind::kUring) {
        std::string problem = detail::probe_uring();
        MW_CHECK_T(DeviceError, problem.empty(), "MW_IO_BACKEND=uring but ", problem,
                   "; set MW_IO_BACKEND=threads");
      }
      return create_engine_with_reason(kind, options, str("MW_IO_BACKEND=", env));
    }
  }
  std::string problem = detail::probe_uring();
  if (problem.empty()) {
    // The probe's ring has 4 entries; the engine's has queue_depth, which a memlock limit (kernels
    // before 5.12 charge rings to it) or a seccomp filter may refuse where the probe's passed. The
    // pool is auto's answer to that too (docs/io.md).
    try {
      return create_engine_with_reason(BackendKind::kUring, options,
                                       "probe: io_uring works (NOP ran; READ/WRITE supported)");
    } catch (const DeviceError& e) {
      problem =
          str("the probe's 4-entry ring ran, but the engine's did not start (", e.what(), ")");
    }
  }
  return create_engine_with_reason(BackendKind::kThreads, options,
                                   str("probe: ", problem, "; using the pread/pwrite pool"));
}

}  // namespace mw::io
