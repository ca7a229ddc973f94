// BlockCache: the freed blocks a caching allocator keeps for reuse (core/caching_allocator.h). It
// only keeps pointers and sizes; it never allocates or frees a block itself.
//
// Invariants:
//  - take(n, max_block) returns the smallest cached block of at least n and at most max_block
//    bytes (best fit), or nothing; among blocks of one size the last one cached (its pages are
//    the most likely to be in the CPU's caches).
//  - cached_bytes() is the sum of the cached blocks' sizes and never exceeds max_cached_bytes:
//    put() refuses a block that would pass it, and the caller frees that block.
//  - take_to_free(need) follows Note [Freeing just enough] (core/caching_allocator.cpp).
// Not thread-safe: the owning allocator holds its own lock around every call.
#pragma once

#include <cstdint>
#include <iterator>
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

  explicit BlockCache(int64_t max_cached_bytes) : max_cached_bytes_(max_cached_bytes) {}

  std::optional<Block> take(int64_t nbytes, int64_t max_block_bytes) {
    auto it = free_.lower_bound(nbytes);
    if (it == free_.end() || it->first > max_block_bytes) return std::nullopt;
    return pop(it);
  }

  // false: not cached (it would pass max_cached_bytes); the caller frees the block.
  bool put(void* ptr, int64_t bytes) {
    if (cached_bytes_ + bytes > max_cached_bytes_) return false;
    free_[bytes].push_back(ptr);
    cached_bytes_ += bytes;
    ++cached_blocks_;
    return true;
  }

  // Removes cached blocks worth at least needed_bytes (-1: all) and returns them for the caller
  // to free: the smallest block that covers what is still missing, else the largest, again.
  std::vector<Block> take_to_free(int64_t needed_bytes) {
    std::vector<Block> out;
    int64_t need = needed_bytes < 0 ? cached_bytes_ : needed_bytes;
    while (need > 0 && !free_.empty()) {
      auto it = free_.lower_bound(need);
      if (it == free_.end()) it = std::prev(free_.end());
      out.push_back(pop(it));
      need -= out.back().bytes;
    }
    return out;
  }

  // Lowers the bound; returns the blocks that no longer fit under it, for the caller to free.
  std::vector<Block> set_max_cached_bytes(int64_t bytes) {
    max_cached_bytes_ = bytes;
    return cached_bytes_ > bytes ? take_to_free(cached_bytes_ - bytes) : std::vector<Block>{};
  }

  int64_t cached_bytes() const { return cached_bytes_; }
  int64_t cached_blocks() const { return cached_blocks_; }

 private:
  using Map = std::map<int64_t, std::vector<void*>>;
  Block pop(Map::iterator it) {
    Block b{it->second.back(), it->first};
    it->second.pop_back();
    if (it->second.empty()) free_.erase(it);
    cached_bytes_ -= b.bytes;
    --cached_blocks_;
    return b;
  }

  int64_t max_cached_bytes_;
  int64_t cached_bytes_ = 0;
  int64_t cached_blocks_ = 0;
  Map free_;  // block size -> free blocks of that size, the most recently freed last
};

}  // namespace mw
