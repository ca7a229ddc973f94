// SpaceAllocator of space_allocator.h: two indexes over the same holes (by offset for coalescing,
// by size for best fit), kept in step by insert_hole/erase_hole.
#include "offload/io/space_allocator.h"

#include "core/allocator.h"
#include "core/error.h"

namespace mw::io {

SpaceAllocator::SpaceAllocator(int64_t granule_bytes) : granule_bytes_(granule_bytes) {
  MW_CHECK_T(InvalidArgument, granule_bytes > 0, "SpaceAllocator: granule must be > 0, got ",
             granule_bytes);
}

void SpaceAllocator::insert_hole(int64_t offset, int64_t length) {
  by_offset_.emplace(offset, length);
  by_size_.emplace(length, offset);
  hole_bytes_ += length;
}

void SpaceAllocator::erase_hole(std::map<int64_t, int64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  hole_bytes_ -= it->second;
  by_offset_.erase(it);
}

int64_t SpaceAllocator::allocate(int64_t nbytes) {
  MW_CHECK_T(InvalidArgument, nbytes > 0, "SpaceAllocator::allocate: size must be > 0, got ",
             nbytes);
  int64_t length = round_up(nbytes, granule_bytes_);
  auto fit = by_size_.lower_bound({length, INT64_MIN});
  if (fit == by_size_.end()) {
    int64_t offset = end_bytes_;
    end_bytes_ += length;
    return offset;
  }
  auto [hole_length, offset] = *fit;
  erase_hole(by_offset_.find(offset));
  if (hole_length > length) insert_hole(offset + length, hole_length - length);
  return offset;
}

void SpaceAllocator::free(int64_t offset, int64_t nbytes) {
  int64_t length = round_up(nbytes, granule_bytes_);
  MW_CHECK_T(
      InvalidArgument,
      nbytes > 0 && offset >= 0 && offset % granule_bytes_ == 0 && offset + length <= end_bytes_,
      "SpaceAllocator::free: range [", offset, ", ", offset + length,
      ") is not an allocated range of a file whose allocated end is ", end_bytes_);
  auto next = by_offset_.lower_bound(offset);
  MW_CHECK_T(InvalidArgument, next == by_offset_.end() || next->first >= offset + length,
             "SpaceAllocator::free: range [", offset, ", ", offset + length,
             ") overlaps the free range starting at ", next->first, " (double free?)");
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    MW_CHECK_T(InvalidArgument, prev->first + prev->second <= offset,
               "SpaceAllocator::free: range [", offset, ", ", offset + length,
               ") overlaps the free range [", prev->first, ", ", prev->first + prev->second,
               ") (double free?)");
    if (prev->first + prev->second == offset) {  // merge with the hole before
      offset = prev->first;
      length += prev->second;
      erase_hole(prev);
    }
  }
  if (next != by_offset_.end() && next->first == offset + length) {  // and the one after
    length += next->second;
    erase_hole(next);
  }
  if (offset + length == end_bytes_) {
    end_bytes_ = offset;  // tail: give it back instead of keeping a hole
  } else {
    insert_hole(offset, length);
  }
}

std::vector<std::pair<int64_t, int64_t>> SpaceAllocator::holes() const {
  return {by_offset_.begin(), by_offset_.end()};
}

}  // namespace mw::io
