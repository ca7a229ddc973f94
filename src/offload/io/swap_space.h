// SwapSpace: named blobs (tensor bytes) stored in scratch files, one per directory, read and
// written asynchronously through an IoEngine.
//
// Layout: a blob of n bytes occupies round_up(n, 4096) bytes on disk (O_DIRECT needs whole
// blocks), split into chunks of SwapOptions::chunk_bytes dealt round-robin over the directories, so
// that one large blob fills the engine's queue and, with several drives, stripes across them as
// DeepSpeed's list of NVMe paths does. Each directory's share of a blob is one contiguous range
// from that file's SpaceAllocator.
//
// Invariants:
//  - Files are created (with missing directories) in the constructor and unlinked by the
//    destructor, which first waits for this space's outstanding I/O (its errors stay with their
//    handles and the engine's wait_all).
//  - Callers' buffers are 4096-aligned and hold round_up(nbytes, 4096) bytes (an AlignedBuffer of
//    nbytes always does); the padding past nbytes is written to and read from disk.
//  - The caller waits for a key's handle before it erases, rewrites or reads that key again, and
//    before it reuses the buffer. SwapSpace's own bookkeeping is thread-safe.
//  - Rewriting a key with the same padded size reuses its ranges in place; another size frees them
//    and allocates anew.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "offload/io/file.h"
#include "offload/io/io_engine.h"
#include "offload/io/space_allocator.h"

namespace mw::io {

struct SwapOptions {
  int64_t chunk_bytes = int64_t{1} << 20;  // a blob is split into requests of this size
  bool direct_io = true;                   // O_DIRECT (Note [O_DIRECT fallback])
  std::string file_stem = "memwall-swap";
};

class SwapSpace {
 public:
  // One file per directory in `dirs` (at least one). Throws IoError if a directory cannot be made
  // or written, InvalidArgument on bad options.
  SwapSpace(std::vector<std::string> dirs, IoEngine& engine, SwapOptions options = {});
  ~SwapSpace();
  SwapSpace(const SwapSpace&) = delete;
  SwapSpace& operator=(const SwapSpace&) = delete;

  // Stores nbytes of buf under key (replacing an earlier value). buf: see the invariants.
  IoHandle write(const std::string& key, const void* buf, int64_t nbytes);
  // Reads the value of key into buf (round_up(nbytes(key), 4096) bytes). Throws InvalidArgument
  // for an unknown key.
  IoHandle read(const std::string& key, void* buf);
  // Frees the key's space. Returns false if there was no such key.
  bool erase(const std::string& key);
  bool contains(const std::string& key) const;
  // Size given to write(). Throws InvalidArgument for an unknown key.
  int64_t nbytes(const std::string& key) const;
  int64_t size() const;  // number of keys

  // Sum of the files' allocated ends: the disk space in use, holes included.
  int64_t file_bytes() const;
  // Sum of the files' holes.
  int64_t hole_bytes() const;
  // False when some file fell back to buffered I/O.
  bool direct() const;
  const std::vector<std::string>& file_paths() const { return paths_; }

 private:
  struct Extent {
    int file;        // index into files_
    int64_t offset;  // in the file
    int64_t length;  // bytes, a multiple of 4096
  };
  struct Blob {
    int64_t nbytes = 0;
    std::vector<Extent> extents;  // one per file used, in file order
  };
  Blob allocate_locked(int64_t nbytes);
  void free_locked(const Blob& blob);
  void remember(const IoHandle& handle);
  std::vector<IoRequest> requests_locked(const Blob& blob, void* buf, IoOp op) const;

  IoEngine& engine_;
  SwapOptions options_;
  std::vector<ScratchFile> files_;
  std::vector<SpaceAllocator> allocators_;
  std::vector<std::string> paths_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Blob> blobs_;
  std::vector<IoHandle> issued_;  // handles not yet seen done, joined by the destructor
};

}  // namespace mw::io
