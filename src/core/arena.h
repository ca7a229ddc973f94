// Arena: one reserved range of address space carved into blocks, best fit, with freed neighbours
// merged. The sim device's memory (Note [Sim arena] in allocator.h).
//
// Invariants: blocks are multiples of the granule and lie inside the range; the free list holds
// maximal runs (two free neighbours are always merged); free + in use = the range's size. Not
// thread-safe: the owning allocator locks.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <utility>

namespace mw {

class Arena {
 public:
  // Reserves `bytes` (a multiple of `granule`) of address space; pages are backed on first touch
  // and stay backed, so a block reused at another size is not faulted in again.
  Arena(int64_t bytes, int64_t granule);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // The smallest free run that holds `bytes` (a multiple of the granule), split; nullptr when no
  // run is large enough (fragmentation).
  void* allocate(int64_t bytes);
  // `ptr` must come from allocate() with the same `bytes`.
  void deallocate(void* ptr, int64_t bytes);
  bool owns(const void* ptr) const;
  int64_t in_use_bytes() const { return in_use_; }
  int64_t size_bytes() const { return size_; }
  int64_t largest_free_bytes() const;

 private:
  void insert_free(int64_t offset, int64_t bytes);
  void erase_free(int64_t offset, int64_t bytes);
  char* base_ = nullptr;
  int64_t size_ = 0, granule_ = 0, in_use_ = 0;
  std::map<int64_t, int64_t> free_by_offset_;           // offset -> run length
  std::set<std::pair<int64_t, int64_t>> free_by_size_;  // (run length, offset)
};

}  // namespace mw
