// kernel_util.cuh: small pieces the custom kernels share: the element-wise launch shape,
// the device's SM count, alignment checks, f32/f16 conversions, and vector memory accesses.
#pragma once
#include <cuda_fp16.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "runtime/cuda_check.h"

namespace mf::gpu {

// Launch shape of the element-wise kernels. They loop grid-stride, so a capped grid covers
// any n; 4096 blocks of 256 threads is ~8 resident blocks on each of the H200's 132 SMs,
// four times over.
constexpr int kBlock = 256;
constexpr std::int64_t kMaxBlocks = 4096;
// Blocks for `work` threads' worth of items: at least 1, at most kMaxBlocks.
inline int blocks_for(std::int64_t work) {
  return static_cast<int>(std::clamp<std::int64_t>((work + kBlock - 1) / kBlock, 1, kMaxBlocks));
}

// Streaming multiprocessors of the current device (132 on an H200), asked once: the
// reductions size their grids by it.
inline int sm_count() {
  static const int count = [] {
    int dev = 0, sms = 0;
    MF_GPU_CHECK(cudaGetDevice(&dev));
    MF_GPU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return std::max(sms, 1);
  }();
  return count;
}

// True when p is a multiple of `bytes`: the vectorised paths need it, the launchers check.
inline bool aligned(const void* p, std::size_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

// Storage type <-> f32: every kernel computes in f32, whatever it stores.
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
template <class T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

// N elements of T moved as one memory access of sizeof(T) * N bytes (16 for float x 4 or
// half x 8: one 128-bit load per thread, the widest there is). The pointer must be aligned
// to that size; the launchers check and fall back to N = 1.
template <int kBytes> struct Word;
template <> struct Word<16> { using type = uint4; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<4> { using type = unsigned int; };
template <> struct Word<2> { using type = unsigned short; };
template <> struct Word<1> { using type = unsigned char; };
template <class T, int N> struct Vec {
  T v[N];
};
template <class T, int N> __device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  using W = typename Word<sizeof(T) * N>::type;
  const W w = *reinterpret_cast<const W*>(p);
  Vec<T, N> r;
  memcpy(&r, &w, sizeof w);  // a register move: reinterprets the word as N elements
  return r;
}
template <class T, int N> __device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& r) {
  using W = typename Word<sizeof(T) * N>::type;
  W w;
  memcpy(&w, &r, sizeof w);
  *reinterpret_cast<W*>(p) = w;
}

}  // namespace mf::gpu
