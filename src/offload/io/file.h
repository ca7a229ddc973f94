// Files for offloaded data: directory creation, O_DIRECT with a logged buffered fallback, and a
// scratch file that is unlinked when its owner goes away.
//
// Note [O_DIRECT fallback]: offloaded bytes must not stay in RAM, so files are opened with
// O_DIRECT. Some file systems refuse it (open fails with EINVAL, e.g. tmpfs on older kernels);
// then the file is reopened buffered and the caller is told, so it can warn once that the page
// cache will keep the offloaded bytes in RAM.
#pragma once

#include <cstdint>
#include <string>

namespace mw::io {

// Creates `dir` and its missing parents (mode 0755). Throws IoError (path, errno) when it cannot,
// or when the directory is not writable.
void ensure_directory(const std::string& dir);

// A new, uniquely named file "<dir>/<stem>-<pid>-<n>.bin", opened read/write with O_DIRECT when
// `want_direct` and the file system allows it. Closed and unlinked by the destructor. Move-only.
class ScratchFile {
 public:
  ScratchFile() = default;
  ScratchFile(const std::string& dir, const std::string& stem, bool want_direct);
  ~ScratchFile();
  ScratchFile(ScratchFile&& other) noexcept;
  ScratchFile& operator=(ScratchFile&& other) noexcept;
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // False when O_DIRECT was asked for and refused (Note [O_DIRECT fallback]), or not asked for.
  bool direct() const { return direct_; }
  // Makes the file at least `nbytes` long with real blocks (fallocate), so that later writes do
  // not extend it. Throws IoError on ENOSPC/EFBIG; silently skips file systems without fallocate.
  void reserve(int64_t nbytes);
  // Removes the file's name now, keeping it open: nothing is left behind even if the process is
  // killed. path() stays for messages. Throws IoError when unlink fails.
  void unlink_now();
  // Cuts the file to `nbytes` (ftruncate), returning space at the tail to the file system.
  void truncate(int64_t nbytes);
  int64_t size_bytes() const { return size_bytes_; }

 private:
  void release() noexcept;
  int fd_ = -1;
  std::string path_;
  bool direct_ = false;
  bool linked_ = true;  // false after unlink_now()
  int64_t size_bytes_ = 0;
};

// Test hook: while set, ScratchFile behaves as if open(O_DIRECT) failed with EINVAL, so the
// fallback path of Note [O_DIRECT fallback] can be tested on file systems that accept O_DIRECT.
void set_refuse_direct_for_testing(bool refuse);

}  // namespace mw::io
