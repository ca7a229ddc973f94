// Counter-based random tokens (splitmix64 + Lemire's bounded sampling). See random_tokens.h.
#include "data/random_tokens.h"

#include "core/error.h"

namespace mw::data {

namespace {
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;  // 2^64 / phi, splitmix64's increment
}  // namespace

void random_tokens(uint64_t seed, int64_t step, int64_t B, int64_t T, int64_t vocab_size,
                   int32_t* out) {
  MW_CHECK_T(InvalidArgument, step >= 0 && B >= 1 && T >= 1,
             "random_tokens needs step >= 0, B >= 1 and T >= 1; got step ", step, ", B ", B, ", T ",
             T);
  MW_CHECK_T(InvalidArgument, vocab_size >= 1 && vocab_size <= INT32_MAX,
             "random_tokens needs vocab_size in [1, 2^31), got ", vocab_size);
  const uint64_t range = static_cast<uint64_t>(vocab_size);
  // Lemire: x * range / 2^64 is unbiased once products whose low half falls below
  // 2^64 mod range are rejected.
  const uint64_t threshold = (0 - range) % range;
  const uint64_t step_key = splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(step));
  const int64_t total = B * T;
  for (int64_t i = 0; i < total; ++i) {
    const uint64_t element_key = splitmix64(step_key + static_cast<uint64_t>(i) * kGolden);
    for (uint64_t attempt = 0;; ++attempt) {
      const uint64_t x = splitmix64(element_key ^ (attempt * 0xd1b54a32d192ed03ull));
      const unsigned __int128 m = static_cast<unsigned __int128>(x) * range;
      if (static_cast<uint64_t>(m) >= threshold) {
        out[i] = static_cast<int32_t>(m >> 64);
        break;
      }
    }
  }
}

}  // namespace mw::data
