// cast.cu: element-wise dtype conversions on the GPU (f32 -> f16, f16 -> f32, u8 -> f32, and
// an f32 added into f16).
//
// These are pure memory traffic: each element is read once and written once, so the only
// things that matter are wide, coalesced accesses and enough threads in flight. Every
// kernel moves four elements per thread and iteration (one 16-byte float4 on the f32
// side) when the pointers allow it, in a grid-stride loop, and finishes the n % 4 leftover
// elements one per thread in the same launch.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "runtime/cuda_check.h"
#include "runtime/kernel_util.cuh"
#include "tensor/cast.h"

namespace mf {

namespace {

using namespace gpu;

// float -> half, bit for bit what the host's float_to_half gives: the hardware conversion
// rounds to nearest even, overflows to inf at 65520 and keeps half subnormals (nvcc
// flushes nothing without --use_fast_math); only NaN differs, since the hardware returns
// one canonical NaN, so NaN is spelled out as float_to_half does: sign kept, quiet bit set.
__device__ __forceinline__ __half to_half_exact(float f) {
  if (isnan(f)) return __ushort_as_half(static_cast<unsigned short>(((__float_as_uint(f) >> 16) & 0x8000u) | 0x7e00u));
  return __float2half_rn(f);
}

// half -> float is exact for every finite half and inf; a NaN keeps its sign and payload,
// as the host's half_to_float does.
__device__ __forceinline__ float to_float_exact(__half h) {
  const unsigned int b = __half_as_ushort(h);
  if ((b & 0x7c00u) == 0x7c00u && (b & 0x3ffu) != 0u)
    return __uint_as_float(((b & 0x8000u) << 16) | 0x7f800000u | ((b & 0x3ffu) << 13));
  return __half2float(h);
}

// Thread t of the grid converts groups t, t + stride, ... of four floats (one 16-byte load,
// one 8-byte store); n_vec is the number of such groups (0 when the pointers are not
// aligned for it), and the elements past 4 * n_vec go one per thread.
__global__ void cast_f32_to_f16_kernel(const float* __restrict__ x, __half* __restrict__ y, std::int64_t n,
                                       std::int64_t n_vec) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t tid = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::int64_t i = tid; i < n_vec; i += stride) {
    const float4 v = reinterpret_cast<const float4*>(x)[i];
    const __half h[4] = {to_half_exact(v.x), to_half_exact(v.y), to_half_exact(v.z), to_half_exact(v.w)};
    uint2 packed;
    memcpy(&packed, h, sizeof packed);  // reinterpret the four halves as one 8-byte word
    reinterpret_cast<uint2*>(y)[i] = packed;
  }
  for (std::int64_t i = 4 * n_vec + tid; i < n; i += stride) y[i] = to_half_exact(x[i]);
}

// Same mapping: four halves in (8 bytes), four floats out (16 bytes).
__global__ void cast_f16_to_f32_kernel(const __half* __restrict__ x, float* __restrict__ y, std::int64_t n,
                                       std::int64_t n_vec) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t tid = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::int64_t i = tid; i < n_vec; i += stride) {
    const uint2 packed = reinterpret_cast<const uint2*>(x)[i];
    __half h[4];
    memcpy(h, &packed, sizeof packed);
    reinterpret_cast<float4*>(y)[i] =
        make_float4(to_float_exact(h[0]), to_float_exact(h[1]), to_float_exact(h[2]), to_float_exact(h[3]));
  }
  for (std::int64_t i = 4 * n_vec + tid; i < n; i += stride) y[i] = to_float_exact(x[i]);
}

// Same mapping: four bytes in (one 4-byte load), four floats out. y = x * scale, one
// rounding (a byte times a float is exact before the product is rounded).
__global__ void cast_u8_to_f32_kernel(const std::uint8_t* __restrict__ x, float* __restrict__ y, std::int64_t n,
                                      std::int64_t n_vec, float scale) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t tid = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::int64_t i = tid; i < n_vec; i += stride) {
    const uchar4 b = reinterpret_cast<const uchar4*>(x)[i];
    reinterpret_cast<float4*>(y)[i] = make_float4(b.x * scale, b.y * scale, b.z * scale, b.w * scale);
  }
  for (std::int64_t i = 4 * n_vec + tid; i < n; i += stride) y[i] = x[i] * scale;
}

// y = half(float(y) + x), one element per thread (grid-stride): a gradient computed in f32
// added into an f16 gradient, rounded once. Small tensors only (a layer's weights).
__global__ void add_f32_to_f16_kernel(const float* __restrict__ x, __half* __restrict__ y, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = __float2half_rn(__half2float(y[i]) + x[i]);
}

}  // namespace

void launch_add_f32_to_f16(const float* x, Half* y, std::int64_t n, GpuStream stream) {
  if (n <= 0) return;
  add_f32_to_f16_kernel<<<blocks_for(n), kBlock, 0, stream>>>(x, reinterpret_cast<__half*>(y), n);
  MF_CHECK_LAUNCH();
}

void launch_cast_f32_to_f16(const float* x, Half* y, std::int64_t n, GpuStream stream) {
  if (n <= 0) return;
  const std::int64_t n_vec = aligned(x, 16) && aligned(y, 8) ? n / 4 : 0;
  cast_f32_to_f16_kernel<<<blocks_for(std::max<std::int64_t>(n_vec, n - 4 * n_vec)), kBlock, 0, stream>>>(
      x, reinterpret_cast<__half*>(y), n, n_vec);
  MF_CHECK_LAUNCH();
}

void launch_cast_f16_to_f32(const Half* x, float* y, std::int64_t n, GpuStream stream) {
  if (n <= 0) return;
  const std::int64_t n_vec = aligned(x, 8) && aligned(y, 16) ? n / 4 : 0;
  cast_f16_to_f32_kernel<<<blocks_for(std::max<std::int64_t>(n_vec, n - 4 * n_vec)), kBlock, 0, stream>>>(
      reinterpret_cast<const __half*>(x), y, n, n_vec);
  MF_CHECK_LAUNCH();
}

void launch_cast_u8_to_f32(const std::uint8_t* x, float* y, std::int64_t n, float scale, GpuStream stream) {
  if (n <= 0) return;
  const std::int64_t n_vec = aligned(x, 4) && aligned(y, 16) ? n / 4 : 0;
  cast_u8_to_f32_kernel<<<blocks_for(std::max<std::int64_t>(n_vec, n - 4 * n_vec)), kBlock, 0, stream>>>(
      x, y, n, n_vec, scale);
  MF_CHECK_LAUNCH();
}

}  // namespace mf
