// rng.h: a small, fast, platform-independent random generator (xoshiro256** seeded by
// SplitMix64), so the same seed gives the same weights everywhere.
#pragma once
#include <cstdint>

namespace mf {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) {
    for (auto& s : s_) s = splitmix64(seed);
  }
  std::uint64_t next_u64() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 24 random bits (every float in the range is equally spaced).
  float uniform01() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform01(); }
  // Uniform integer in [0, n) without modulo bias (Lemire's method); 0 when n is 0.
  std::uint64_t below(std::uint64_t n) {
    if (n == 0) return 0;
    unsigned __int128 m = static_cast<unsigned __int128>(next_u64()) * n;
    std::uint64_t low = static_cast<std::uint64_t>(m);
    if (low < n) {
      const std::uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(next_u64()) * n;
        low = static_cast<std::uint64_t>(m);
      }
    }
    return static_cast<std::uint64_t>(m >> 64);
  }

  // SplitMix64 (Steele, Lea & Flood): its step and its output function, a bijective
  // 64-bit mixer (the shuffles hash a seed and an epoch with it too).
  static constexpr std::uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ULL;  // 2^64 / golden ratio, odd
  static std::uint64_t mix64(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

 private:
  static std::uint64_t splitmix64(std::uint64_t& x) { return mix64(x += kGoldenGamma); }
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
};

}  // namespace mf
