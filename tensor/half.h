// half.h: IEEE 754 binary16 on the host, bit-compatible with CUDA's __half, for CPU
// emulation of FP16 storage and for tests. Conversions round to nearest, ties to even.
#pragma once
#include <cstdint>
#include <cstring>

namespace mf {

struct Half {
  std::uint16_t bits = 0;
};
static_assert(sizeof(Half) == 2, "Half must be two bytes, like __half");

inline Half float_to_half(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  Half h;
  if (abs >= 0x7f800000u) {  // inf or NaN (NaN keeps a quiet payload bit)
    h.bits = static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    return h;
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
    h.bits = static_cast<std::uint16_t>(sign | 0x7c00u);
    return h;
  }
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (abs < 0x33000000u) {  // < 2^-25 rounds to zero (2^-25 itself is a tie to even: 0)
      h.bits = static_cast<std::uint16_t>(sign);
      return h;
    }
    const std::uint32_t exp = abs >> 23;               // biased float exponent, 102..112
    const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exp;            // so that the result is in units of 2^-24
    std::uint32_t v = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (v & 1u))) ++v;
    h.bits = static_cast<std::uint16_t>(sign | v);
    return h;
  }
  // normal: rebias exponent 127 -> 15, keep 10 mantissa bits, round to nearest even
  std::uint32_t v = ((abs - 0x38000000u) >> 13);
  const std::uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (v & 1u))) ++v;  // may carry into the exponent: fine
  h.bits = static_cast<std::uint16_t>(sign | v);
  return h;
}

inline float half_to_float(Half h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  std::uint32_t mant = h.bits & 0x3ffu;
  std::uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { ++e; mant <<= 1; } while ((mant & 0x400u) == 0);
      x = sign | ((112u - static_cast<std::uint32_t>(e)) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// Rounds a float to the nearest value representable in half (the CPU emulation of storing
// an activation in FP16).
inline float round_to_half(float f) { return half_to_float(float_to_half(f)); }

}  // namespace mf
