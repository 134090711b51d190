#pragma once
// The project's seeded random numbers: xoshiro256** (Blackman and Vigna) with its state drawn by
// splitmix64. Platform-independent: the same seed gives the same numbers on every machine, which
// sampling (`--seed`) and make-tiny's checkpoints rely on. Functions on a bare state, so that
// classes whose headers must not include this one (the engine API's Sampler) can hold it.
#include <cstdint>

namespace dsv4 {

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The state is four splitmix64 draws from `seed`.
inline void xoshiro256_seed(uint64_t (&s)[4], uint64_t seed) {
  for (uint64_t& w : s) w = splitmix64(seed);
}

inline uint64_t xoshiro256_next(uint64_t (&s)[4]) {
  auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  const uint64_t result = rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

// Uniform in [0, 1) with 53 random bits (exact in double).
inline double xoshiro256_uniform(uint64_t (&s)[4]) { return static_cast<double>(xoshiro256_next(s) >> 11) * 0x1.0p-53; }

}  // namespace dsv4
