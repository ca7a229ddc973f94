// Launches a command under `mpirun -np N` on this machine (oversubscribed, as root if need be),
// bounded by `timeout` so that a hang fails the test instead of stalling ctest, and says why a
// test must be skipped (no mpirun, or no MPI backend module built).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "../apps/run_app.h"

namespace mw::testing {

inline std::string mpi_backend_module() {
  return std::string(MW_BINARY_DIR) + "/src/dist/libmw_dist_mpi.so";
}

// Empty when mpirun and the backend module are both here; else the reason to skip.
inline std::string mpi_unavailable() {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0)
    return "mpirun not found: install openmpi-bin libopenmpi-dev to run the multi-process tests";
  if (!std::filesystem::exists(mpi_backend_module()))
    return "the MPI backend module was not built (MPI not found at configure time)";
  return "";
}

// Open MPI's session directory base, one per test process and removed at its exit: two mpirun
// started at once (ctest -j2) otherwise race to create /tmp/ompi.HOST.UID and one of them fails
// ("A call to mkdir was unable to create the desired directory ... File exists": seen twice in
// whole-suite runs here).
inline std::string ompi_session_base() {
  struct Base {
    std::string path;
    Base() {
      const char* tmp = std::getenv("TMPDIR");
      path = std::string(tmp && *tmp ? tmp : "/tmp") + "/mw-ompi-" + std::to_string(::getpid());
    }
    ~Base() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Base base;
  return base.path;
}

// The environment for mpirun: root allowed, and oversubscribed ranks yield the core when idle.
// In the sanitizer build (CI), LeakSanitizer is off for the ranks: Open MPI itself leaves about
// 120 KB from MPI_Init in components it dlclose()s at MPI_Finalize, so the frames cannot be
// matched by a suppression, and every rank would exit 1 (a plain MPI_Allreduce program shows it).
// ASan's other checks stay on, and the single-process tests keep leak detection.
inline std::string mpirun_prefix(int ranks, int timeout_s) {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1 "
         "OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_orte_tmpdir_base=" +
         ompi_session_base() +
         " "
         "ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0\" "
         "timeout -k 5 " +
         std::to_string(timeout_s) + " mpirun --oversubscribe -np " + std::to_string(ranks) + " ";
}

// `ranks` copies of this test executable running the tests matched by `filter` as MPI workers
// (MW_DIST_WORKER=1 makes them run instead of skipping).
inline AppResult run_mpi_workers(int ranks, const std::string& filter, int timeout_s = 60,
                                 const std::string& env = "") {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  return run_command(env + " " + mpirun_prefix(ranks, timeout_s) + "-x MW_DIST_WORKER=1 " + self +
                     " --gtest_color=no --gtest_filter='" + filter + "'");
}

inline bool is_mpi_worker() { return std::getenv("MW_DIST_WORKER") != nullptr; }

}  // namespace mw::testing
