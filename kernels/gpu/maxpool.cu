// maxpool.cu: 2x2 / stride-2 max pooling on NHWC tensors (floor: an odd last row or column
// is dropped), forward with the winner's position kept, and backward from it.
//
// In NHWC the C channels of a pixel are contiguous, so one thread can take N neighbouring
// channels of one output pixel (N = 4 floats or 8 halves: 16 bytes) and read its four
// window pixels with four 16-byte loads. Neighbouring threads take the next channels, then
// the next output pixel, so the loads of a warp are contiguous runs.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "runtime/cuda_check.h"
#include "runtime/kernel_util.cuh"
#include "kernels/gpu/launchers.h"

namespace mf {

namespace {

using namespace gpu;

// Where output vector i sits: i runs over (n, oi, oj, channel vector cv), cv fastest.
struct PoolIndex {
  std::int64_t n, oi, oj, cv;
};
__device__ __forceinline__ PoolIndex pool_index(std::int64_t i, std::int64_t oh, std::int64_t ow,
                                                std::int64_t c_vec) {
  PoolIndex p;
  p.cv = i % c_vec;
  i /= c_vec;
  p.oj = i % ow;
  i /= ow;
  p.oi = i % oh;
  p.n = i / oh;
  return p;
}

// One thread per output vector (N channels of one output pixel), grid-stride. The window's
// four pixels are (2oi, 2oj), (2oi, 2oj+1), (2oi+1, 2oj), (2oi+1, 2oj+1): argmax 0..3 in that
// order. A strict '>' keeps the first of equal values, and the first NaN wins over any
// number, as on the CPU path (layers/maxpool2d_cpu.cpp): a NaN input gives a NaN output.
template <class T, int N>
__global__ void maxpool2x2_forward_kernel(const T* __restrict__ x, T* __restrict__ y, std::uint8_t* __restrict__ argmax,
                                          std::int64_t total_vec, std::int64_t h, std::int64_t w, std::int64_t c) {
  const std::int64_t oh = h / 2, ow = w / 2, c_vec = c / N;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total_vec; i += stride) {
    const PoolIndex p = pool_index(i, oh, ow, c_vec);
    const T* x00 = x + ((p.n * h + 2 * p.oi) * w + 2 * p.oj) * c + p.cv * N;
    const Vec<T, N> win[4] = {load_vec<T, N>(x00), load_vec<T, N>(x00 + c), load_vec<T, N>(x00 + w * c),
                              load_vec<T, N>(x00 + w * c + c)};
    Vec<T, N> best = win[0];
    Vec<std::uint8_t, N> arg;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      arg.v[k] = 0;
#pragma unroll
      for (int q = 1; q < 4; ++q) {
        const float v = to_f32(win[q].v[k]), b = to_f32(best.v[k]);
        if (v > b || (v != v && b == b)) best.v[k] = win[q].v[k], arg.v[k] = static_cast<std::uint8_t>(q);
      }
    }
    store_vec<T, N>(y + i * N, best);  // output vectors are laid out in the order of i
    store_vec<std::uint8_t, N>(argmax + i * N, arg);
  }
}

// One thread per output vector again, scattering instead of gathering: it writes all four
// window pixels (dy at the winner, 0 at the other three), so every element of dx is written
// exactly once and nothing needs zeroing first. The thread of the last window column also
// zeroes the column that the floor dropped (odd W), the thread of the last window row the
// dropped row (odd H), and the corner when both are odd.
template <class T, int N>
__global__ void maxpool2x2_backward_kernel(const T* __restrict__ dy, const std::uint8_t* __restrict__ argmax,
                                           T* __restrict__ dx, std::int64_t total_vec, std::int64_t h, std::int64_t w,
                                           std::int64_t c) {
  const std::int64_t oh = h / 2, ow = w / 2, c_vec = c / N;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  Vec<T, N> zero;
#pragma unroll
  for (int k = 0; k < N; ++k) zero.v[k] = T(0.0f);
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total_vec; i += stride) {
    const PoolIndex p = pool_index(i, oh, ow, c_vec);
    const Vec<T, N> g = load_vec<T, N>(dy + i * N);
    const Vec<std::uint8_t, N> arg = load_vec<std::uint8_t, N>(argmax + i * N);
    T* d00 = dx + ((p.n * h + 2 * p.oi) * w + 2 * p.oj) * c + p.cv * N;
    T* const win[4] = {d00, d00 + c, d00 + w * c, d00 + w * c + c};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      Vec<T, N> out;
#pragma unroll
      for (int k = 0; k < N; ++k) out.v[k] = arg.v[k] == q ? g.v[k] : zero.v[k];
      store_vec<T, N>(win[q], out);
    }
    const bool last_col = (w & 1) && p.oj == ow - 1, last_row = (h & 1) && p.oi == oh - 1;
    if (last_col) {  // pixels (2oi, w-1) and (2oi+1, w-1)
      store_vec<T, N>(d00 + 2 * c, zero);
      store_vec<T, N>(d00 + w * c + 2 * c, zero);
    }
    if (last_row) {  // pixels (h-1, 2oj) and (h-1, 2oj+1)
      store_vec<T, N>(d00 + 2 * w * c, zero);
      store_vec<T, N>(d00 + 2 * w * c + c, zero);
    }
    if (last_col && last_row) store_vec<T, N>(d00 + 2 * w * c + 2 * c, zero);  // pixel (h-1, w-1)
  }
}

template <class T, int N>
void maxpool_forward(const void* x, void* y, std::uint8_t* argmax, std::int64_t n, std::int64_t h, std::int64_t w,
                     std::int64_t c, cudaStream_t stream) {
  const std::int64_t total_vec = n * (h / 2) * (w / 2) * (c / N);
  maxpool2x2_forward_kernel<T, N><<<blocks_for(total_vec), kBlock, 0, stream>>>(
      static_cast<const T*>(x), static_cast<T*>(y), argmax, total_vec, h, w, c);
  MF_CHECK_LAUNCH();
}

template <class T, int N>
void maxpool_backward(const void* dy, const std::uint8_t* argmax, void* dx, std::int64_t n, std::int64_t h,
                      std::int64_t w, std::int64_t c, cudaStream_t stream) {
  const std::int64_t total_vec = n * (h / 2) * (w / 2) * (c / N);
  maxpool2x2_backward_kernel<T, N><<<blocks_for(total_vec), kBlock, 0, stream>>>(
      static_cast<const T*>(dy), argmax, static_cast<T*>(dx), total_vec, h, w, c);
  MF_CHECK_LAUNCH();
}

}  // namespace

void launch_maxpool2x2_forward(const void* x, void* y, std::uint8_t* argmax, bool half, std::int64_t n,
                               std::int64_t h, std::int64_t w, std::int64_t c, GpuStream stream) {
  if (n <= 0 || h < 2 || w < 2 || c <= 0) return;  // no output element
  if (half) {
    if (c % 8 == 0 && aligned(x, 16) && aligned(y, 16) && aligned(argmax, 8))
      maxpool_forward<__half, 8>(x, y, argmax, n, h, w, c, stream);
    else
      maxpool_forward<__half, 1>(x, y, argmax, n, h, w, c, stream);
  } else {
    if (c % 4 == 0 && aligned(x, 16) && aligned(y, 16) && aligned(argmax, 4))
      maxpool_forward<float, 4>(x, y, argmax, n, h, w, c, stream);
    else
      maxpool_forward<float, 1>(x, y, argmax, n, h, w, c, stream);
  }
}

void launch_maxpool2x2_backward(const void* dy, const std::uint8_t* argmax, void* dx, bool half, std::int64_t n,
                                std::int64_t h, std::int64_t w, std::int64_t c, GpuStream stream) {
  if (n <= 0 || h <= 0 || w <= 0 || c <= 0) return;
  if (h < 2 || w < 2) {  // no window at all: every input was dropped, so dx is all zero
    MF_GPU_CHECK(cudaMemsetAsync(dx, 0, static_cast<std::size_t>(n * h * w * c) * (half ? 2 : 4), stream));
    return;
  }
  if (half) {
    if (c % 8 == 0 && aligned(dy, 16) && aligned(dx, 16) && aligned(argmax, 8))
      maxpool_backward<__half, 8>(dy, argmax, dx, n, h, w, c, stream);
    else
      maxpool_backward<__half, 1>(dy, argmax, dx, n, h, w, c, stream);
  } else {
    if (c % 4 == 0 && aligned(dy, 16) && aligned(dx, 16) && aligned(argmax, 4))
      maxpool_backward<float, 4>(dy, argmax, dx, n, h, w, c, stream);
    else
      maxpool_backward<float, 1>(dy, argmax, dx, n, h, w, c, stream);
  }
}

}  // namespace mf
