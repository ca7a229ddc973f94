// CachingAllocator (core/caching_allocator.h): segments carved into blocks, best-fit reuse with
// splitting and merging, the capacity, the cache bound, return-the-cache-and-retry, statistics.
#include "core/caching_allocator.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace mw {

CachingAllocator::CachingAllocator(Device device, std::unique_ptr<MemorySource> source,
                                   CachePolicy policy, int64_t capacity_bytes, bool hard_capacity)
    : device_(device), source_(std::move(source)), policy_(policy), hard_capacity_(hard_capacity) {
  MW_CHECK_T(InvalidArgument, policy_.granule_bytes > 0 && policy_.min_split_bytes > 0,
             "CachingAllocator: a policy needs a positive granule and split threshold");
  MW_CHECK_T(
      InvalidArgument,
      policy_.small_max_bytes == 0 || (policy_.small_segment_bytes >= policy_.small_max_bytes &&
                                       policy_.small_segment_bytes % policy_.granule_bytes == 0),
      "CachingAllocator: small segments must hold the largest small request");
  MW_CHECK_T(InvalidArgument, !policy_.reserve_capacity || hard_capacity_,
             "CachingAllocator: only a hard capacity can be reserved");
  set_capacity(capacity_bytes);
  reported_capacity_ = capacity_bytes;
}

// Wholly free segments go back; a segment with live blocks (tensors held by statics at exit) is
// kept for them, only its bookkeeping is freed.
CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (FreeSet* set : {&free_small_, &free_large_}) {
    for (Block* b : *set)
      if (b->whole()) source_->release(b->ptr, b->bytes);
    for (Block* b : *set) delete b;
  }
  for (auto& [ptr, b] : live_) delete b;
  drop_spare_locked();
}

void CachingAllocator::check_capacity_locked(int64_t rounded) const {
  if (!hard_capacity_ || stats_.capacity_bytes == 0 ||
      stats_.current_bytes + rounded <= stats_.capacity_bytes)
    return;
  const int64_t free_bytes = stats_.capacity_bytes - stats_.current_bytes;
  throw OutOfMemory(str(device_.str(), " out of memory: requested ", rounded, " bytes, ",
                        free_bytes, " bytes free of a ", stats_.capacity_bytes,
                        "-byte capacity. Raise the capacity (--device sim:SIZE or cuda:SIZE), "
                        "lower the batch, or enable checkpointing/offload."),
                    rounded, free_bytes, stats_.capacity_bytes);
}

// Note [Memory pressure] (allocator.h): a refused request goes to the handler, outside the lock
// (the handler frees blocks of this allocator), and is tried again while the handler frees memory.
void* CachingAllocator::allocate(int64_t nbytes) {
  for (;;) {
    try {
      return allocate_once(nbytes);
    } catch (const OutOfMemory&) {
      PressureHandler handler;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        handler = pressure_handler_;
      }
      if (!handler || !handler(nbytes)) throw;
    }
  }
}

void CachingAllocator::set_pressure_handler(PressureHandler handler) {
  std::lock_guard<std::mutex> lock(mutex_);
  pressure_handler_ = std::move(handler);
}

void* CachingAllocator::allocate_once(int64_t nbytes) {
  MW_CHECK_T(InvalidArgument, nbytes >= 0, "allocate: negative size ", nbytes);
  const int64_t rounded = round_up(std::max<int64_t>(nbytes, 1), policy_.granule_bytes);
  const bool small = rounded <= policy_.small_max_bytes;
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.alloc_count;
  check_capacity_locked(rounded);
  Block* b = take_free_locked(small, rounded);
  if (b)
    ++stats_.cache_hits;
  else
    b = new_segment_locked(small, rounded);
  split_locked(b, rounded);
  b->free = false;
  live_.emplace(b->ptr, b);
  stats_.current_bytes += b->bytes;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
  stats_.window_peak_bytes = std::max(stats_.window_peak_bytes, stats_.current_bytes);
  return b->ptr;
}

// The smallest free block of the class that holds `rounded` (the most recently freed among equal
// sizes: its pages are the likeliest to be in the CPU's caches), if it can be split or is not too
// large to hand out whole.
CachingAllocator::Block* CachingAllocator::take_free_locked(bool small, int64_t rounded) {
  FreeSet& set = free_set(small);
  Block probe;
  probe.bytes = rounded;
  probe.order = std::numeric_limits<int64_t>::min();
  auto it = set.lower_bound(&probe);
  if (it == set.end()) return nullptr;
  Block* b = *it;
  const int64_t min_split = small ? policy_.granule_bytes : policy_.min_split_bytes;
  const bool splits = b->bytes - rounded >= min_split;
  if (!splits && policy_.max_reuse_bytes && b->bytes > policy_.max_reuse_bytes(rounded))
    return nullptr;
  erase_free_locked(b);
  return b;
}

// Cuts `rounded` bytes off the front of free block b when the rest is worth keeping; the rest
// stays free, merged with a free block after it.
void CachingAllocator::split_locked(Block* b, int64_t rounded) {
  const int64_t rest = b->bytes - rounded;
  if (rest < (b->small ? policy_.granule_bytes : policy_.min_split_bytes)) return;
  Block* r = new Block;
  r->ptr = b->ptr + rounded;
  r->bytes = rest;
  r->prev = b;
  r->next = b->next;
  r->small = b->small;
  r->kind = b->kind;
  if (b->next) b->next->prev = r;
  b->next = r;
  b->bytes = rounded;
  r->free = true;  // its next neighbour is live: a free one would have been merged into b
  insert_free_locked(r);
}

// A segment for a request the free blocks could not serve. With a reserved capacity, the reserved
// segment was too fragmented: an exact segment from the source, returned when freed, still counted
// against the capacity (Note [Sim arena]).
CachingAllocator::Block* CachingAllocator::new_segment_locked(bool small, int64_t rounded) {
  const bool reserved_exists =
      policy_.reserve_capacity && hard_capacity_ && stats_.capacity_bytes > 0;
  int64_t bytes = rounded;
  if (small)
    bytes = policy_.small_segment_bytes;
  else if (policy_.large_segment_bytes && !reserved_exists)
    bytes = round_up(policy_.large_segment_bytes(rounded), policy_.granule_bytes);
  if (reserved_exists) ++stats_.arena_fallbacks;
  // Note [Freeing just enough]: without a reserved segment, a hard capacity holds the cache too.
  const int64_t over = segment_bytes_ + bytes - stats_.capacity_bytes;
  if (hard_capacity_ && !reserved_exists && stats_.capacity_bytes > 0 && over > 0) {
    free_cached_locked(over);
    // What is still over is free space inside segments in use, which a GPU of that size would
    // not have either: a segment of the request alone where that fits, else out of memory (the
    // segment was taken regardless, 40 MiB reserved under a 32 MiB cuda:32MiB).
    if (segment_bytes_ + bytes > stats_.capacity_bytes && bytes > rounded &&
        segment_bytes_ + rounded <= stats_.capacity_bytes)
      bytes = rounded;
    if (segment_bytes_ + bytes > stats_.capacity_bytes) {
      const int64_t free_bytes = std::max<int64_t>(0, stats_.capacity_bytes - segment_bytes_);
      throw OutOfMemory(
          str(device_.str(), " out of memory: requested ", rounded, " bytes, ", free_bytes,
              " bytes unreserved of a ", stats_.capacity_bytes, "-byte capacity (",
              stats_.capacity_bytes - stats_.current_bytes,
              " free in all, split among cached segments). Raise the capacity (--device "
              "cuda:SIZE), lower the batch, or enable checkpointing/offload."),
          rounded, free_bytes, stats_.capacity_bytes);
    }
  }
  char* ptr = nullptr;
  if (reserved_exists && spare_ptr_ && spare_bytes_ == bytes)  // its pages are backed already
    ptr = std::exchange(spare_ptr_, nullptr);
  else
    ptr = static_cast<char*>(acquire_locked(bytes));  // may throw: nothing to free yet
  Block* b = new Block;
  b->ptr = ptr;
  b->bytes = bytes;
  b->small = small;
  b->kind = reserved_exists ? Kind::Overflow : Kind::Cached;
  segment_bytes_ += bytes;
  ++segments_;
  stats_.miss_bytes += bytes;
  return b;
}

void* CachingAllocator::acquire_locked(int64_t bytes) {
  if (void* ptr = source_->acquire(bytes)) return ptr;
  ++stats_.retries;
  free_cached_locked(-1);
  drop_spare_locked();
  if (void* ptr = source_->acquire(bytes)) return ptr;
  AllocatorStats s = stats_;
  s.cached_bytes = segment_bytes_ - stats_.current_bytes;
  throw source_->refused(bytes, s);
}

void CachingAllocator::deallocate(void* ptr, int64_t /*nbytes*/) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = live_.find(ptr);
  MW_CHECK(found != live_.end(), device_.str(),
           ": deallocate of a pointer this allocator did not give");
  Block* b = found->second;
  live_.erase(found);
  stats_.current_bytes -= b->bytes;
  if (Block* p = b->prev; p && p->free) {  // merge a free neighbour before...
    erase_free_locked(p);
    b->ptr = p->ptr;
    b->bytes += p->bytes;
    b->prev = p->prev;
    if (b->prev) b->prev->next = b;
    delete p;
  }
  if (Block* n = b->next; n && n->free) {  // ...and after
    erase_free_locked(n);
    b->bytes += n->bytes;
    b->next = n->next;
    if (b->next) b->next->prev = b;
    delete n;
  }
  b->free = true;
  const bool keep =
      !b->whole() || b->kind == Kind::Reserved ||
      (b->kind == Kind::Cached && whole_free_bytes_ + b->bytes <= policy_.max_cached_bytes);
  if (keep)
    insert_free_locked(b);
  else
    release_segment_locked(b);
}

void CachingAllocator::insert_free_locked(Block* b) {
  b->free = true;
  b->order = --free_order_;
  free_set(b->small).insert(b);
  if (b->whole() && b->kind == Kind::Cached) whole_free_bytes_ += b->bytes;
}

void CachingAllocator::erase_free_locked(Block* b) {
  free_set(b->small).erase(b);
  b->free = false;
  if (b->whole() && b->kind == Kind::Cached) whole_free_bytes_ -= b->bytes;
}

// b is a wholly free segment, out of the free sets. An Overflow segment's pages become the spare.
void CachingAllocator::release_segment_locked(Block* b) {
  if (b->kind == Kind::Overflow && b->bytes + whole_free_bytes_ <= policy_.max_cached_bytes) {
    drop_spare_locked();  // within the cache's bound, as a cached segment would be
    spare_ptr_ = b->ptr;
    spare_bytes_ = b->bytes;
  } else {
    source_->release(b->ptr, b->bytes);
  }
  segment_bytes_ -= b->bytes;
  --segments_;
  delete b;
}

// Note [Freeing just enough]: a capped device whose next segment does not fit beside its cache
// returns wholly free segments only until it does: the smallest that covers what is still
// missing, else the largest, again. Returned memory comes back as fresh pages the kernel must
// fault in and clear, so emptying the whole cache at every miss (as this once did) made Gemini on
// a tight sim device fault in 2.5x the pages of the plain run (measured: 1.40M minor faults in 4
// GPT-2 small steps on sim:768MiB against 0.56M).
void CachingAllocator::free_cached_locked(int64_t needed_bytes) {
  std::set<std::pair<int64_t, Block*>> whole;  // wholly free Cached segments by size
  for (FreeSet* set : {&free_small_, &free_large_})
    for (Block* b : *set)
      if (b->whole() && b->kind == Kind::Cached) whole.emplace(b->bytes, b);
  int64_t need = needed_bytes < 0 ? whole_free_bytes_ : needed_bytes;
  while (need > 0 && !whole.empty()) {
    auto it = whole.lower_bound({need, nullptr});
    if (it == whole.end()) it = std::prev(whole.end());
    Block* b = it->second;
    whole.erase(it);
    need -= b->bytes;
    erase_free_locked(b);
    release_segment_locked(b);
  }
}

void CachingAllocator::drop_spare_locked() {
  if (!spare_ptr_) return;
  source_->release(spare_ptr_, spare_bytes_);
  spare_ptr_ = nullptr;
  spare_bytes_ = 0;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  AllocatorStats s = stats_;
  s.cached_bytes = segment_bytes_ - stats_.current_bytes;
  return s;
}

int64_t CachingAllocator::segment_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return segments_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_bytes = stats_.current_bytes;
}

void CachingAllocator::reset_window_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.window_peak_bytes = stats_.current_bytes;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  free_cached_locked(-1);
  drop_spare_locked();
}

void CachingAllocator::set_limit(int64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    MW_CHECK_T(InvalidArgument, !policy_.reserve_capacity, device_.str(),
               ": set_limit is for a GPU's cache; use set_capacity");
    MW_CHECK_T(InvalidArgument,
               bytes >= 0 && (reported_capacity_ == 0 || bytes <= reported_capacity_),
               device_.str(), ": a memory limit of ", bytes, " bytes; expected one in [1, ",
               reported_capacity_, "], the device's memory (0 = no limit)");
    hard_capacity_ = bytes > 0;
  }
  set_capacity(bytes > 0 ? bytes : reported_capacity_);
}

// The old capacity's reserved segment goes back now if wholly free, else when it becomes so; the
// new one is got now, so a capacity the system cannot back fails here, with the device named.
void CachingAllocator::set_capacity(int64_t capacity_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  MW_CHECK_T(InvalidArgument, capacity_bytes >= 0, device_.str(), ": negative capacity ",
             capacity_bytes);
  stats_.capacity_bytes = capacity_bytes;
  free_cached_locked(-1);
  drop_spare_locked();
  if (!policy_.reserve_capacity) return;
  std::vector<Block*> old_reserved;
  for (Block* b : free_large_)
    if (b->kind == Kind::Reserved && b->whole()) old_reserved.push_back(b);
  for (Block* b : old_reserved) {
    erase_free_locked(b);
    release_segment_locked(b);
  }
  auto retire = [](Block* b) {
    for (Block* p = b; p; p = p->prev) p->kind = Kind::Transient;
    for (Block* n = b; n; n = n->next) n->kind = Kind::Transient;
  };
  for (auto& [ptr, b] : live_)
    if (b->kind == Kind::Reserved) retire(b);
  if (capacity_bytes == 0) return;
  const int64_t bytes = round_up(capacity_bytes, policy_.granule_bytes);
  char* ptr = static_cast<char*>(acquire_locked(bytes));
  Block* b = new Block;
  b->ptr = ptr;
  b->bytes = bytes;
  b->kind = Kind::Reserved;
  segment_bytes_ += bytes;
  ++segments_;
  insert_free_locked(b);
}

void CachingAllocator::set_max_cached_bytes(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  policy_.max_cached_bytes = bytes;
  if (whole_free_bytes_ > bytes) free_cached_locked(whole_free_bytes_ - bytes);
  if (spare_bytes_ + whole_free_bytes_ > bytes) drop_spare_locked();
}

}  // namespace mw
