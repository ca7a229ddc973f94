// Counter-based random numbers.
//
// Note [Counter-based dropout]: every random draw is a pure function of (seed, offset + index),
// hashed with splitmix64. An op that needs n numbers takes an RngState and the generator advances
// its offset by n. So a mask can be regenerated in backward instead of stored, recomputation
// replays the same masks by restoring (seed, offset), and results do not depend on the number of
// threads. splitmix64, random_bits and random_uniform are __host__ __device__ under nvcc: the CUDA
// kernels call the very same functions, so a dropout mask is bitwise identical on either device.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define MW_HOST_DEVICE __host__ __device__
#else
#define MW_HOST_DEVICE
#endif

namespace mw {

struct RngState {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

MW_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A 64-bit random number for element `index` of a draw that starts at `rng`.
MW_HOST_DEVICE inline uint64_t random_bits(RngState rng, uint64_t index) {
  return splitmix64(splitmix64(rng.seed) ^ (rng.offset + index));
}

// Uniform in [0, 1) with 24 random bits (exact in float and double).
MW_HOST_DEVICE inline double random_uniform(RngState rng, uint64_t index) {
  return static_cast<double>(random_bits(rng, index) >> 40) * (1.0 / 16777216.0);
}

// Standard normals by Box-Muller: draw `pair` gives two independent normals, r cos(theta) for
// element 2*pair and r sin(theta) for element 2*pair + 1, from one log, one sqrt and one sincos.
inline void random_normal_pair(RngState rng, uint64_t pair, double* even, double* odd) {
  uint64_t bits = random_bits(rng, pair);
  double u1 = (static_cast<double>(bits >> 11) + 1.0) * (1.0 / 9007199254740993.0);  // (0, 1]
  double u2 = static_cast<double>(splitmix64(bits) >> 11) * (1.0 / 9007199254740992.0);
  double r = std::sqrt(-2.0 * std::log(u1));
  double theta = 6.283185307179586 * u2;
  *even = r * std::cos(theta);
  *odd = r * std::sin(theta);
}

// Element `index` of the normal sequence of random_normal_pair.
inline double random_normal(RngState rng, uint64_t index) {
  double even, odd;
  random_normal_pair(rng, index / 2, &even, &odd);
  return index % 2 ? odd : even;
}

// out[i] = stddev * random_normal(rng, i) for i in [begin, end), two elements per draw.
template <typename T>
void fill_normal(T* out, uint64_t begin, uint64_t end, RngState rng, double stddev) {
  uint64_t i = begin;
  if (i < end && i % 2) out[i - begin] = static_cast<T>(stddev * random_normal(rng, i)), ++i;
  for (; i + 1 < end; i += 2) {
    double even, odd;
    random_normal_pair(rng, i / 2, &even, &odd);
    out[i - begin] = static_cast<T>(stddev * even);
    out[i + 1 - begin] = static_cast<T>(stddev * odd);
  }
  if (i < end) out[i - begin] = static_cast<T>(stddev * random_normal(rng, i));
}

// A seed plus a running offset. reserve(n) hands out a state for n draws and advances.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : state_{seed, 0} {}
  RngState reserve(uint64_t n) {
    RngState s = state_;
    state_.offset += n;
    return s;
  }
  RngState state() const { return state_; }
  void set_state(RngState s) { state_ = s; }
  void manual_seed(uint64_t seed) { state_ = {seed, 0}; }

 private:
  RngState state_;
};

// The process-wide generator that dropout layers draw from. Checkpointing saves and restores its
// state around recomputation (nn/checkpoint.h), as PyTorch does with its default generator.
Generator& default_generator();

}  // namespace mw
