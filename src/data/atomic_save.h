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
//
// Note [Replacing only what a save wrote]: because the old folder is removed as a whole, a folder
// that exists may be replaced only when every entry in it is one that a save of that kind writes
// (`SavedEntries`: config.json, model.safetensors, ... for a model). Anything else (a user's
// files, another program's, an HF download's pytorch_model.bin) is refused before a byte is
// written, naming the entry, and checked again just before the swap. Without this, `gpt2_train
// --save /tmp` replaced the whole of /tmp with the model (found by a flag sweep, session 18).
#pragma once

#include <functional>
#include <string>

#include "core/interrupt.h"

namespace mw::data {

// The names a save of one kind writes into its folder (Note [Replacing only what a save wrote]).
using SavedEntries = std::function<bool(const std::string& name)>;

// IoError when `dir` exists and holds an entry `saved` refuses: names `option` (or "saving to"),
// the entry and what to do. Nothing when `dir` is missing or empty.
void check_only_saved_entries(const std::string& dir, const std::string& option,
                              const SavedEntries& saved);

class StagedDirectory {
 public:
  // Removes stale leftovers of `final_dir`, checks that `final_dir` is absent or a directory that
  // holds only entries `saved` accepts, and creates the empty temporary sibling (and missing
  // parents). IoError naming the path and `hint`.
  StagedDirectory(std::string final_dir, std::string hint, SavedEntries saved);
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
  SavedEntries saved_;
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
// creating and removing a probe file in it; nothing is left or created. A folder that a save
// replaces as a whole passes `saved` (check_only_saved_entries); a container (--checkpoint-dir)
// does not. IoError naming `option` ("--log"), the path, the errno and what to do.
void check_output_path(const std::string& path, const std::string& option, bool as_directory,
                       const SavedEntries& saved = {});

}  // namespace mw::data
