// dtype.h: element types and devices a Tensor can have.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "tensor/half.h"

namespace mf {

enum class DType : std::uint8_t { kF32, kF16, kU8, kI32 };
enum class Device : std::uint8_t { kCpu, kGpu };

inline std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kU8: return 1;
    case DType::kI32: return 4;
  }
  return 0;
}
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kU8: return "u8";
    case DType::kI32: return "i32";
  }
  return "?";
}
inline const char* device_name(Device d) { return d == Device::kCpu ? "cpu" : "gpu"; }

// The DType of a C++ element type, for Tensor::data<T>() checks.
template <class T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kF32; };
template <> struct DTypeOf<Half> { static constexpr DType value = DType::kF16; };
template <> struct DTypeOf<std::uint8_t> { static constexpr DType value = DType::kU8; };
template <> struct DTypeOf<std::int32_t> { static constexpr DType value = DType::kI32; };

}  // namespace mf
