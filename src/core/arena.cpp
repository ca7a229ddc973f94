// Arena (arena.h): best fit over free runs kept by size, merged with their neighbours on free.
#include "core/arena.h"

#include <sys/mman.h>

#include <cerrno>

#include "core/error.h"

namespace mw {

Arena::Arena(int64_t bytes, int64_t granule) : size_(bytes), granule_(granule) {
  MW_CHECK_T(InvalidArgument, bytes > 0 && granule > 0 && bytes % granule == 0, "Arena: ", bytes,
             " bytes is not a positive multiple of the ", granule, "-byte granule");
  // MAP_NORESERVE: address space only; a page costs memory once it is touched.
  void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw OutOfMemory(str("cannot reserve ", bytes, " bytes of address space for a sim device: ",
                          errno_text(errno), "; choose a smaller --device sim:SIZE"),
                      bytes, 0, bytes);
  base_ = static_cast<char*>(p);
  insert_free(0, bytes);
}

Arena::~Arena() { ::munmap(base_, static_cast<size_t>(size_)); }

bool Arena::owns(const void* ptr) const {
  const char* p = static_cast<const char*>(ptr);
  return p >= base_ && p < base_ + size_;
}

int64_t Arena::largest_free_bytes() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

void Arena::insert_free(int64_t offset, int64_t bytes) {
  free_by_offset_.emplace(offset, bytes);
  free_by_size_.emplace(bytes, offset);
}

void Arena::erase_free(int64_t offset, int64_t bytes) {
  free_by_offset_.erase(offset);
  free_by_size_.erase({bytes, offset});
}

void* Arena::allocate(int64_t bytes) {
  MW_CHECK(bytes > 0 && bytes % granule_ == 0, "Arena::allocate: ", bytes,
           " bytes is not a positive multiple of the granule");
  auto it = free_by_size_.lower_bound({bytes, -1});  // the smallest run that holds it
  if (it == free_by_size_.end()) return nullptr;
  const auto [run, offset] = *it;
  erase_free(offset, run);
  if (run > bytes) insert_free(offset + bytes, run - bytes);
  in_use_ += bytes;
  return base_ + offset;
}

void Arena::deallocate(void* ptr, int64_t bytes) {
  MW_CHECK(owns(ptr), "Arena::deallocate: a pointer outside the arena");
  int64_t offset = static_cast<char*>(ptr) - base_, run = bytes;
  auto next = free_by_offset_.lower_bound(offset);
  MW_CHECK(next == free_by_offset_.end() || next->first >= offset + run,
           "Arena::deallocate: the block overlaps a free run (freed twice?)");
  if (next != free_by_offset_.end() && next->first == offset + run) {  // merge the run after
    run += next->second;
    erase_free(next->first, next->second);
  }
  auto prev = free_by_offset_.lower_bound(offset);
  if (prev != free_by_offset_.begin()) {
    --prev;
    MW_CHECK(prev->first + prev->second <= offset,
             "Arena::deallocate: the block overlaps a free run (freed twice?)");
    if (prev->first + prev->second == offset) {  // merge the run before
      offset = prev->first;
      run += prev->second;
      erase_free(prev->first, prev->second);
    }
  }
  insert_free(offset, run);
  in_use_ -= bytes;
}

}  // namespace mw
