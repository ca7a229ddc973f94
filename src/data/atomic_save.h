// Saving a folder as a whole, and checking output paths before a run spends time.
//
// Note [Atomic folder save]: a model folder (config.json, model.safetensors, ...) is replaced as
// one thing. StagedDirectory writes every file into a temporary sibling ".DIR.tmp-PID", fsyncs the
// files (write_file) and the directory, then swaps it with DIR in one renameat2(RENAME_EXCHANGE)
// and removes the old contents (now under the temporary name). On file systems without
// RENAME_EXCHANGE the old DIR is first renamed aside to ".DIR.old-PID", the new one renamed in,
// then the old one removed. Any failure or stop signal before the swap removes the temporary
// folder and leaves DIR as it was; a kill -9 at any moment leaves DIR whole (or, in the fallback's
// window between its two renames, whole under ".DIR.old-PID"), and the next save to DIR removes
// the leftovers of dead processes, first putting an orphaned ".DIR.old-PID" back as DIR if DIR is
// missing. The same names are used for files (AtomicFileWriter, file_io.h).
#pragma once

#include <string>

#include "core/interrupt.h"

namespace mw::data {

class StagedDirectory {
 public:
  // Removes stale leftovers of `final_dir`, checks that `final_dir` is a directory or absent, and
  // creates the empty temporary sibling (and missing parents). IoError naming the path and `hint`.
  StagedDirectory(std::string final_dir, std::string hint);
  ~StagedDirectory();  // without commit(): removes the temporary folder
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;
  // Where to write the files: "<tmp>/<name>".
  std::string file(const std::string& name) const;
  // fsyncs the staged folder, swaps it into place, removes the old one, fsyncs the parent.
  void commit();

 private:
  [[noreturn]] void fail_move(int err) const;
  std::string final_, tmp_, hint_;
  bool committed_ = false;
  TemporaryPath registered_;  // removed by a second stop signal (Note [Stop signals])
};

// Removes ".NAME.tmp-PID" and ".NAME.old-PID" beside `path` left by processes no longer running
// (restoring an orphaned ".NAME.old-PID" when `path` is missing). Returns how many were removed.
int remove_stale_temporaries(const std::string& path);

// Test hook: while set, the swap behaves as on a file system without RENAME_EXCHANGE (EINVAL), so
// the rename-aside fallback of Note [Atomic folder save] runs.
void set_refuse_rename_exchange_for_testing(bool refuse);

// Checks, before a run starts, that `path` can be written: `as_directory` (a --save folder) must be
// a directory or absent, a file output must not be a directory; its directory, or the nearest
// existing ancestor when it is missing (the save creates it), must accept a new file, proven by
// creating and removing a probe file in it; nothing is left or created. IoError
// naming `option` ("--log"), the path, the errno and what to do.
void check_output_path(const std::string& path, const std::string& option, bool as_directory);

}  // namespace mw::data
