// SpaceAllocator: hands out byte ranges of one file, reusing freed ranges.
//
// Invariants:
//  - Every range is a multiple of the granule (4096 by default, so O_DIRECT offsets stay aligned).
//  - Holes (free ranges) never touch each other: free() coalesces with both neighbours.
//  - No hole ever ends at end_bytes(): a free range at the tail shrinks the tail instead, after
//    merging with the hole just before it. (TensorNVMe's free list forgets that hole, so a file
//    that is filled and emptied repeatedly keeps growing; see tests/io/space_allocator_test.cpp.)
//  - allocate() is best-fit over holes (smallest hole that fits, lowest offset on ties), else it
//    grows the tail.
// Not thread-safe; SwapSpace serialises access.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace mw::io {

class SpaceAllocator {
 public:
  explicit SpaceAllocator(int64_t granule_bytes = 4096);

  // Returns the offset of a range of round_up(nbytes, granule) bytes. nbytes > 0.
  int64_t allocate(int64_t nbytes);
  // Returns a range from allocate() (same nbytes). Throws InvalidArgument if the range is not
  // inside the allocated area or overlaps a hole (a double free).
  void free(int64_t offset, int64_t nbytes);

  int64_t end_bytes() const { return end_bytes_; }    // the file must be this long
  int64_t hole_bytes() const { return hole_bytes_; }  // free bytes below end_bytes()
  int64_t used_bytes() const { return end_bytes_ - hole_bytes_; }
  int64_t granule_bytes() const { return granule_bytes_; }
  // Holes as (offset, length), by offset.
  std::vector<std::pair<int64_t, int64_t>> holes() const;

 private:
  void insert_hole(int64_t offset, int64_t length);
  void erase_hole(std::map<int64_t, int64_t>::iterator it);

  int64_t granule_bytes_;
  int64_t end_bytes_ = 0;
  int64_t hole_bytes_ = 0;
  std::map<int64_t, int64_t> by_offset_;           // offset -> length
  std::set<std::pair<int64_t, int64_t>> by_size_;  // (length, offset)
};

}  // namespace mw::io
