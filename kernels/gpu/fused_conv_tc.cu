// fused_conv_tc.cu: the fused step's second convolution on Tensor Cores (fused.h,
// launch_fused_conv_forward with tensor_cores): the same bias, ReLU, 2x2 max pooling and
// winners as fused_conv.cu's kernel, but the products as an implicit GEMM through CUDA's
// warp matrix functions (nvcuda::wmma): TF32 multiplicands in FP32 (as cuDNN's and
// PyTorch's default convolutions on Ampere and later), half ones in FP16, f32 sums.
//
// The GEMM: a row per convolution output that some pooling window uses, a column per
// filter, and k = (tap r, t; channel c), the kernel's own (K, 3, 3, C) order, so that the B
// matrix is the weights as they lie in memory (column n of B is filter n's 9c weights: a
// col_major load with ldm = 9c). The rows are ordered window by window, the window's four
// positions q = 0..3 together, so that a tile of 16 rows is 4 whole windows and the pooling
// needs nothing from another tile. A row's k entries are not evenly spaced in memory (the
// taps step over the image's rows), so each warp copies its 16 rows' inputs for one tap
// and up to 32 channels into shared memory first (the im2col of 16 rows, never whole in
// memory), and loads its A fragments from there.
//
// A warp computes a tile of 16 rows by 32 filters (two 16x16 accumulators), one tap and
// one k step at a time; then, through shared memory again (a fragment's elements are
// spread over the lanes in a way CUDA does not specify), each lane pools two (window,
// filter) pairs of each accumulator: bias, ReLU, rounding to the storage type, the first
// of equal values, as the CUDA-core kernel does. The sums run in the Tensor Cores' order,
// not channel by channel: the same bits at every launch, not the CUDA-core kernel's bits.
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>

#include "kernels/gpu/fused.h"
#include "kernels/gpu/fused_conv_common.cuh"
#include "runtime/cuda_check.h"
#include "runtime/kernel_util.cuh"

namespace mf {

namespace {

using namespace fused_detail;
using namespace nvcuda;

constexpr int kRows = 16;                 // a tile's rows: 4 windows of 4 positions
constexpr int kWindows = kRows / 4;
constexpr int kTileFilters = 16;          // an accumulator's columns
constexpr int kTilesPerWarp = 2;          // a warp's filters: 32
constexpr int kWarpFilters = kTileFilters * kTilesPerWarp;
constexpr int kStageChannels = 32;        // channels of one tap staged at a time
constexpr int kTcWarps = 4;               // warps a block
constexpr int kTcThreads = kTcWarps * kLanes;

// What differs between the two precisions: the multiplicand type, the k of one product
// (m16n16k8 for TF32, m16n16k16 for half), and TF32's rounding of each loaded element.
template <class T>
struct Mma;
template <>
struct Mma<float> {
  using Precision = wmma::precision::tf32;
  static constexpr int kStep = 8;
  template <class Frag>
  __device__ static void round(Frag& f) {
    for (int i = 0; i < f.num_elements; ++i) f.x[i] = wmma::__float_to_tf32(f.x[i]);
  }
};
template <>
struct Mma<__half> {
  using Precision = __half;
  static constexpr int kStep = 16;
  template <class Frag>
  __device__ static void round(Frag&) {}
};

// A warp's shared memory: two stages of its 16 rows' inputs, filled in turn, so that one
// __syncwarp() a stage is enough (a row padded by 32 bytes, which keeps ldm a multiple of 16
// bytes and the k steps' columns 32-byte aligned), and its accumulator tiles. 32-byte
// aligned, as the warp matrix loads and stores need.
template <class T>
struct alignas(32) WarpTiles {
  static constexpr int kLd = kStageChannels + 32 / static_cast<int>(sizeof(T));
  T a[2][kRows][kLd];
  float out[kTilesPerWarp][kRows][kTileFilters];
};

// Grid: one warp per (tile of 16 rows, group of 32 filters), the groups of one tile in one
// block where they fit, so that they read the same inputs. Needs c a multiple of the k step
// and filters a multiple of 32 (fused_conv_takes_tensor_cores).
template <class T>
__global__ void conv_pool_forward_tc_kernel(FusedConvSizes g, const T* __restrict__ x, const T* __restrict__ w,
                                            const T* __restrict__ b, T* pooled, std::uint8_t* winners) {
  using M = Mma<T>;
  __shared__ WarpTiles<T> tiles[kTcWarps];
  const int lane = static_cast<int>(threadIdx.x) % kLanes, warp = static_cast<int>(threadIdx.x) / kLanes;
  const i64 ph = pooled_h(g), pw = pooled_w(g), positions = ph * pw, windows = g.n * positions;
  const i64 groups = g.filters / kWarpFilters, tiles_total = (windows + kWindows - 1) / kWindows;
  const i64 item = static_cast<i64>(blockIdx.x) * kTcWarps + warp;
  if (item >= tiles_total * groups) return;  // the whole warp: no lane is left waiting
  const i64 tile = item / groups, f0 = item % groups * kWarpFilters;
  WarpTiles<T>& sm = tiles[warp];

  // Where each of the 16 rows reads its tap (0, 0), channel 0: the convolution output
  // (2py + q/2, 2px + q%2) of its window; -1 for the rows past the last window.
  i64 row_at[kRows];
  for (int m = 0; m < kRows; ++m) {
    const i64 win = tile * kWindows + m / 4;
    const int q = m % 4;
    const i64 s = win / positions, pos = win % positions;
    row_at[m] = win < windows ? ((s * g.h + 2 * (pos / pw) + q / 2) * g.w + 2 * (pos % pw) + q % 2) * g.c : -1;
  }

  wmma::fragment<wmma::accumulator, kRows, kTileFilters, M::kStep, float> acc[kTilesPerWarp];
  for (auto& a : acc) wmma::fill_fragment(a, 0.0f);
  const i64 ldb = kK * kK * g.c;  // B is col_major: filter n's weights are column n
  int stage = 0;
  for (int tap = 0; tap < kK * kK; ++tap) {
    const i64 tap_at = (tap / kK * g.w + tap % kK) * g.c;
    for (i64 c0 = 0; c0 < g.c; c0 += kStageChannels, stage ^= 1) {
      const int cn = static_cast<int>(g.c - c0 < kStageChannels ? g.c - c0 : kStageChannels);
      // This stage's buffer was last read two stages ago, before every lane passed the
      // previous stage's __syncwarp(): it is free to fill.
      for (int m = 0; m < kRows; ++m)
        for (int cc = lane; cc < cn; cc += kLanes)  // a row's channels: one coalesced read
          sm.a[stage][m][cc] = row_at[m] < 0 ? from_f32<T>(0.0f) : x[row_at[m] + tap_at + c0 + cc];
      __syncwarp();  // the stage is whole before any lane loads from it
      for (int k0 = 0; k0 < cn; k0 += M::kStep) {
        wmma::fragment<wmma::matrix_a, kRows, kTileFilters, M::kStep, typename M::Precision, wmma::row_major> fa;
        wmma::load_matrix_sync(fa, &sm.a[stage][0][k0], WarpTiles<T>::kLd);
        M::round(fa);
        for (int j = 0; j < kTilesPerWarp; ++j) {
          wmma::fragment<wmma::matrix_b, kRows, kTileFilters, M::kStep, typename M::Precision, wmma::col_major> fb;
          wmma::load_matrix_sync(fb, w + (f0 + j * kTileFilters) * ldb + tap * g.c + c0 + k0, static_cast<unsigned>(ldb));
          M::round(fb);
          wmma::mma_sync(acc[j], fa, fb, acc[j]);
        }
      }
    }
  }

  // The epilogue: the accumulators through shared memory; for each, lane l pools the pairs
  // (window l / 16, filter l % 16) and (window 2 + l / 16, filter l % 16): 16 lanes write 16
  // consecutive filters of one window.
  for (int j = 0; j < kTilesPerWarp; ++j)
    wmma::store_matrix_sync(&sm.out[j][0][0], acc[j], kTileFilters, wmma::mem_row_major);
  __syncwarp();  // the tiles are whole before any lane reads another's part
  for (int j = 0; j < kTilesPerWarp; ++j) {
    const int fl = lane % kTileFilters;
    const i64 f = f0 + j * kTileFilters + fl;
    const float bias = to_f32(b[f]);
    for (int wl = lane / kTileFilters; wl < kWindows; wl += kLanes / kTileFilters) {
      const i64 win = tile * kWindows + wl;
      if (win >= windows) continue;
      float z[4];
      for (int q = 0; q < 4; ++q) z[q] = sm.out[j][wl * 4 + q][fl] + bias;
      pool_window(z, pooled, winners, win * g.filters + f);
    }
  }
}

// The kernel's blocks: a warp per (tile of 16 rows, group of 32 filters), kTcWarps a block.
i64 tc_blocks(const FusedConvSizes& g) {
  const i64 warps = (g.n * pooled_h(g) * pooled_w(g) + kWindows - 1) / kWindows * (g.filters / kWarpFilters);
  return (warps + kTcWarps - 1) / kTcWarps;
}

template <class T>
void forward_tc(const FusedConvSizes& g, const void* x, const void* w, const void* b, void* pooled,
                std::uint8_t* winners, cudaStream_t st) {
  const dim3 grid(static_cast<unsigned>(tc_blocks(g)));
  conv_pool_forward_tc_kernel<T><<<grid, kTcThreads, 0, st>>>(
      g, static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(b), static_cast<T*>(pooled),
      winners);
  MF_CHECK_LAUNCH();
}

}  // namespace

bool fused_conv_takes_tensor_cores(const FusedConvSizes& g, const void* w, bool half) {
  const i64 step = half ? Mma<__half>::kStep : Mma<float>::kStep;
  return g.c % step == 0 && g.filters % kWarpFilters == 0 && reinterpret_cast<std::uintptr_t>(w) % 32 == 0 &&
         tc_blocks(g) <= 2147483647;
}

namespace fused_detail {

void conv_forward_tensor_cores(const FusedConvSizes& g, const void* x, const void* w, const void* b, void* pooled,
                               std::uint8_t* winners, bool half, cudaStream_t stream) {
  if (half) forward_tc<__half>(g, x, w, b, pooled, winners, stream);
  else forward_tc<float>(g, x, w, b, pooled, winners, stream);
}

}  // namespace fused_detail

}  // namespace mf
