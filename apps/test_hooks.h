// Test-only hooks of gpt2_train (tests/dist, tests/apps), apart from its options and loop.
#pragma once

#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace mw {

// Test-only (tests/dist, tests/apps): MW_TEST_EXIT_RANK=R MW_TEST_EXIT_STEP=S make rank R (0 in
// one process) vanish after step S as a crashed rank does, without a message and without
// finalising MPI; with MW_TEST_EXIT_HOW=stall it hangs instead (the others must time out), with
// MW_TEST_EXIT_HOW=sigterm it raises SIGTERM (a signal between two steps).
inline void exit_if_test_asks(int rank, int64_t step) {
  const char* r = std::getenv("MW_TEST_EXIT_RANK");
  const char* s = std::getenv("MW_TEST_EXIT_STEP");
  if (!r || !s || std::atoi(r) != rank || std::atoll(s) != step) return;
  const char* how = std::getenv("MW_TEST_EXIT_HOW");
  if (how && std::string(how) == "stall") ::sleep(3600);
  if (how && std::string(how) == "sigterm") {  // this rank alone is asked to stop
    std::raise(SIGTERM);
    return;
  }
  std::_Exit(3);
}

}  // namespace mw
