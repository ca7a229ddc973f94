// move_bytes_down (core/storage.h): a run moved down within one device's memory, as memmove. A
// GPU's copies may not overlap, so there an overlapping run goes through a temporary; the same
// path runs here on host and sim memory (host_memmove = false) against memmove itself. Gemini's
// 16-bit gathers move each rank's run down from its slot this way (offload/gemini/low_copies.cpp).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/storage.h"

namespace mw {
namespace {

TEST(MoveBytesDown, IsMemmoveWithOrWithoutOverlapOnEveryPath) {
  constexpr int64_t kBytes = 4096;
  std::vector<char> pattern(kBytes);
  for (int64_t i = 0; i < kBytes; ++i) pattern[static_cast<size_t>(i)] = static_cast<char>(i * 7);
  struct Move {
    int64_t dst, src, n;
  };
  // overlapping by most of the run, by one byte, touching, apart, in place, empty
  const Move moves[] = {{0, 4, 1000},    {100, 1099, 1000}, {0, 1000, 1000},
                        {10, 3000, 500}, {64, 64, 100},     {5, 9, 0}};
  for (Device d : {Device::cpu(), Device::sim(0)})
    for (bool host_memmove : {true, false})
      for (const Move& m : moves) {
        SCOPED_TRACE(testing::Message() << d.str() << (host_memmove ? " memmove" : " copies")
                                        << " dst " << m.dst << " src " << m.src << " n " << m.n);
        Storage s(kBytes, d);
        auto* bytes = static_cast<char*>(s.data());
        std::memcpy(bytes, pattern.data(), kBytes);
        std::vector<char> want = pattern;
        std::memmove(want.data() + m.dst, want.data() + m.src, static_cast<size_t>(m.n));
        move_bytes_down(bytes + m.dst, bytes + m.src, m.n, d, host_memmove);
        EXPECT_EQ(std::memcmp(bytes, want.data(), kBytes), 0);
      }
}

TEST(MoveBytesDown, RefusesToMoveUp) {
  std::vector<char> b(16);
  EXPECT_THROW(move_bytes_down(b.data() + 4, b.data(), 4, Device::cpu()), Error);
}

}  // namespace
}  // namespace mw
