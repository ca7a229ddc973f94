// BlockCache: a bounded best-fit cache of freed blocks, for allocators whose underlying allocate
// and free are expensive (cudaHostAlloc / cudaFreeHost pin and unpin pages and take milliseconds
// for large blocks). It only keeps pointers and sizes; it never allocates or frees a block itself.
//
// Invariants:
//  - take(n) returns the smallest cached block of at least n bytes and at most max_slack * n bytes
//    (best fit, as in Note [CUDA caching allocator]), or nothing.
//  - cached_bytes() is the sum of the cached blocks' sizes and never exceeds max_cached_bytes:
//    put() refuses a block that would pass it, and the caller frees that block.
// Not thread-safe: the owning allocator holds its own lock around every call.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace mw {

class BlockCache {
 public:
  struct Block {
    void* ptr = nullptr;
    int64_t bytes = 0;
  };

  BlockCache(int64_t max_cached_bytes, int64_t max_slack)
      : max_cached_bytes_(max_cached_bytes), max_slack_(max_slack) {}

  std::optional<Block> take(int64_t nbytes) {
    auto it = free_.lower_bound(nbytes);
    if (it == free_.end() || it->first > max_slack_ * nbytes) return std::nullopt;
    Block b{it->second, it->first};
    free_.erase(it);
    cached_bytes_ -= b.bytes;
    return b;
  }

  // false: not cached (it would pass max_cached_bytes); the caller frees the block.
  bool put(void* ptr, int64_t bytes) {
    if (cached_bytes_ + bytes > max_cached_bytes_) return false;
    free_.emplace(bytes, ptr);
    cached_bytes_ += bytes;
    return true;
  }

  // Empties the cache; the caller frees every block returned.
  std::vector<Block> take_all() {
    std::vector<Block> all;
    all.reserve(free_.size());
    for (auto& [bytes, ptr] : free_) all.push_back({ptr, bytes});
    free_.clear();
    cached_bytes_ = 0;
    return all;
  }

  int64_t cached_bytes() const { return cached_bytes_; }
  int64_t cached_blocks() const { return static_cast<int64_t>(free_.size()); }

 private:
  int64_t max_cached_bytes_;
  int64_t max_slack_;
  int64_t cached_bytes_ = 0;
  std::multimap<int64_t, void*> free_;  // size -> block
};

}  // namespace mw
