// SwapSpace of swap_space.h.
//
// Chunk placement: chunk i of a blob (chunk_bytes each, the last one shorter) goes to file
// (i mod F). The chunks a file receives sit back to back in that file's extent, so chunk i lives at
// extent[i mod F].offset + (i div F) * chunk_bytes.
#include "offload/io/swap_space.h"

#include <algorithm>

#include "core/allocator.h"
#include "core/error.h"
#include "offload/io/log.h"

namespace mw::io {

SwapSpace::SwapSpace(std::vector<std::string> dirs, IoEngine& engine, SwapOptions options)
    : engine_(engine), options_(std::move(options)) {
  MW_CHECK_T(InvalidArgument, !dirs.empty(), "SwapSpace needs at least one directory");
  MW_CHECK_T(InvalidArgument,
             options_.chunk_bytes > 0 && options_.chunk_bytes % kHostAlignment == 0,
             "SwapOptions::chunk_bytes must be a positive multiple of ", kHostAlignment, "; got ",
             options_.chunk_bytes);
  bool warned = false;
  for (const std::string& dir : dirs) {
    files_.emplace_back(dir, options_.file_stem, options_.direct_io);  // unlinked if we throw
    allocators_.emplace_back(kHostAlignment);
    paths_.push_back(files_.back().path());
    if (options_.direct_io && !files_.back().direct() && !warned) {
      warned = true;
      log_warning(str("the file system of '", dir,
                      "' refuses O_DIRECT; using buffered I/O there, so the page cache will keep "
                      "the offloaded bytes in RAM and offload will save little memory. Point the "
                      "offload directory at a disk file system (ext4, xfs) to fix this."));
    }
  }
}

SwapSpace::~SwapSpace() {
  // Outstanding requests may target our files; let them finish before the files go. Errors
  // belong to their handles, so none is thrown from here.
  for (const IoHandle& h : issued_) h.join();
}

SwapSpace::Blob SwapSpace::allocate_locked(int64_t nbytes) {
  Blob blob;
  blob.nbytes = nbytes;
  const int64_t padded = round_up(nbytes, kHostAlignment);
  const int64_t chunks = (padded + options_.chunk_bytes - 1) / options_.chunk_bytes;
  const int nfiles = static_cast<int>(files_.size());
  for (int f = 0; f < nfiles && f < chunks; ++f) {
    // Bytes of the chunks f, f+F, f+2F, ...: full chunks, plus the short last one if it is ours.
    int64_t count = (chunks - f + nfiles - 1) / nfiles;
    int64_t length = count * options_.chunk_bytes;
    if ((chunks - 1) % nfiles == f) length -= chunks * options_.chunk_bytes - padded;
    int64_t offset = allocators_[f].allocate(length);
    try {
      files_[f].reserve(allocators_[f].end_bytes());
    } catch (...) {
      allocators_[f].free(offset, length);
      free_locked(blob);
      throw;
    }
    blob.extents.push_back({f, offset, length});
  }
  return blob;
}

void SwapSpace::free_locked(const Blob& blob) {
  for (const Extent& e : blob.extents) {
    allocators_[e.file].free(e.offset, e.length);
    files_[e.file].truncate(allocators_[e.file].end_bytes());
  }
}

std::vector<IoRequest> SwapSpace::requests_locked(const Blob& blob, void* buf, IoOp op) const {
  const int64_t padded = round_up(blob.nbytes, kHostAlignment);
  const int nfiles = static_cast<int>(blob.extents.size());
  std::vector<IoRequest> requests;
  char* base = static_cast<char*>(buf);
  for (int64_t pos = 0, i = 0; pos < padded; pos += options_.chunk_bytes, ++i) {
    const Extent& e = blob.extents[i % nfiles];
    IoRequest r;
    r.fd = files_[e.file].fd();
    r.path = files_[e.file].path();
    r.offset = e.offset + (i / nfiles) * options_.chunk_bytes;
    r.buf = base + pos;
    r.length = std::min(options_.chunk_bytes, padded - pos);
    r.op = op;
    requests.push_back(std::move(r));
  }
  return requests;
}

IoHandle SwapSpace::write(const std::string& key, const void* buf, int64_t nbytes) {
  MW_CHECK_T(InvalidArgument, nbytes > 0, "SwapSpace::write('", key, "'): size must be > 0, got ",
             nbytes);
  MW_CHECK_T(InvalidArgument, reinterpret_cast<uintptr_t>(buf) % kHostAlignment == 0,
             "SwapSpace::write('", key, "'): buffer ", buf, " is not ", kHostAlignment,
             "-byte aligned; allocate it with mw::AlignedBuffer");
  std::vector<IoRequest> requests;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blobs_.find(key);
    if (it != blobs_.end() &&
        round_up(it->second.nbytes, kHostAlignment) != round_up(nbytes, kHostAlignment)) {
      free_locked(it->second);
      blobs_.erase(it);
      it = blobs_.end();
    }
    if (it == blobs_.end()) it = blobs_.emplace(key, allocate_locked(nbytes)).first;
    it->second.nbytes = nbytes;
    requests = requests_locked(it->second, const_cast<void*>(buf), IoOp::kWrite);
  }
  IoHandle handle;
  for (const IoHandle& h : engine_.submit(requests)) handle.merge(h);
  remember(handle);
  return handle;
}

IoHandle SwapSpace::read(const std::string& key, void* buf) {
  MW_CHECK_T(InvalidArgument, reinterpret_cast<uintptr_t>(buf) % kHostAlignment == 0,
             "SwapSpace::read('", key, "'): buffer ", buf, " is not ", kHostAlignment,
             "-byte aligned; allocate it with mw::AlignedBuffer");
  std::vector<IoRequest> requests;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blobs_.find(key);
    MW_CHECK_T(InvalidArgument, it != blobs_.end(), "SwapSpace::read: no blob named '", key,
               "' was written");
    requests = requests_locked(it->second, buf, IoOp::kRead);
  }
  IoHandle handle;
  for (const IoHandle& h : engine_.submit(requests)) handle.merge(h);
  remember(handle);
  return handle;
}

void SwapSpace::remember(const IoHandle& handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(issued_, [](const IoHandle& h) { return h.done(); });
  issued_.push_back(handle);
}

bool SwapSpace::erase(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blobs_.find(key);
  if (it == blobs_.end()) return false;
  free_locked(it->second);
  blobs_.erase(it);
  return true;
}

bool SwapSpace::contains(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return blobs_.count(key) != 0;
}

int64_t SwapSpace::nbytes(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blobs_.find(key);
  MW_CHECK_T(InvalidArgument, it != blobs_.end(), "SwapSpace::nbytes: no blob named '", key, "'");
  return it->second.nbytes;
}

int64_t SwapSpace::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(blobs_.size());
}

int64_t SwapSpace::file_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t total = 0;
  for (const auto& a : allocators_) total += a.end_bytes();
  return total;
}

int64_t SwapSpace::hole_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t total = 0;
  for (const auto& a : allocators_) total += a.hole_bytes();
  return total;
}

bool SwapSpace::direct() const {
  for (const auto& f : files_)
    if (!f.direct()) return false;
  return true;
}

}  // namespace mw::io
