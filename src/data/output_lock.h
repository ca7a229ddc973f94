// One writer per output: a run holds an exclusive lock on its --checkpoint-dir and its --log (and
// gpt2_tokenize on its --out) for its whole life, so a second run started on them (the same job
// launched twice, a scheduler's requeue while the first still runs) is refused before its first
// step.
//
// Note [One writer per output]: two runs writing one checkpoint folder overwrite each other's
// step_NNNNNN folders and prune each other's with --keep (measured: two resumes of one folder, the
// second failed after its first checkpoint with "cannot remove all ... step_002002", the folder
// then held the other run's steps); two runs on one --log write over each other's lines; two
// gpt2_tokenize runs on one --out replace each other's shards, and one interrupted removes the
// other's (Note [Not text]'s cleanup, apps/gpt2_tokenize.cpp). The lock
// is flock(2) on the folder itself and on the log file: it leaves no file behind, and the kernel
// drops it when the process ends, kill -9 included, so a stale lock cannot block a resume. It holds
// among processes of one machine and on file systems that support flock (NFS emulates it with
// byte-range locks, which a folder cannot take: there, and wherever flock is not supported, the
// run goes on unlocked). Under data parallel rank 0 alone writes these outputs, so it alone locks.
#pragma once

#include <string>
#include <vector>

namespace mw::data {

class OutputLock {
 public:
  OutputLock() = default;
  // Locks the folder `path` or, with directory = false, the file `path`, creating what is
  // missing of it (the folders above it too); the destructor removes again what it created while
  // it is still empty, so a run refused after taking its locks leaves nothing. `what` names the
  // option in messages ("--checkpoint-dir"), `harm` what two writers would do ("would overwrite
  // each other's checkpoints"). InvalidArgument when another process holds the lock, naming that
  // process where /proc/locks tells.
  OutputLock(const std::string& path, bool directory, const std::string& what,
             const std::string& harm);
  ~OutputLock();
  OutputLock(OutputLock&& other) noexcept;
  OutputLock& operator=(OutputLock&& other) noexcept;
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

  bool held() const { return fd_ >= 0; }

 private:
  void release();
  int fd_ = -1;
  std::string created_file_;               // removed on release when still empty
  std::vector<std::string> created_dirs_;  // outermost first; removed when still empty
};

}  // namespace mw::data
