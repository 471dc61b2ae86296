// fused_dgrad_tc.cuh: the fused step's second convolution's data gradient on Tensor Cores
// (fused.h, launch_fused_conv_dgrad and launch_fused_conv_backward with tensor_cores), for
// fused_conv_grad.cu, whose kernels run it: the same dx as its CUDA-core data_grad, the
// products through CUDA's warp matrix functions (TF32 in FP32, half in FP16, f32 sums).
//
// The GEMM, per image: a row per convolution output the pooling uses, k = the filters, and
// a column per (tap r, t; channel c): G = dconv W, where dconv holds each window's gradient
// at its winner (0 at the other three outputs, and where ReLU stopped it) and W is the
// kernel as it lies in memory, (K, 3, 3, C): row f of W is filter f's 9c weights, so tap
// (r, t)'s 16 channels from c0 are a row_major B tile with ldm 9c. Then input (y + r,
// x + t) adds G's column (r, t) of output (y, x) (the im2col's inverse, col2im).
//
// A tile is one row y of convolution outputs, x = 0 .. 15 (the pooling uses 2 * pooled_w of
// them, at most 16 here; the rest are rows of zeros), so that its 16 sums for tap (r, t)
// land on 16 consecutive inputs of input row y + r: the accumulator is loaded from the
// image's dx in shared memory, multiplied onto and stored back, and col2im costs nothing.
// A block is one image and 16 channels (one accumulator's columns); its warps take the
// tiles y = warp, warp + 4, ..., each staging its tile's dconv (16 x filters) once and
// doing its three tap rows in three steps with a block barrier after each: in a step every
// warp writes input row y + r with the same r and its own y, so no two warps write the same
// row at once, and every input's sum runs in one order, tap row by tap row (the same bits
// at every launch). Unlike data_grad it multiplies the zeros too (the three outputs of each
// window that lost, the padding of a tile: at 5 x 5 windows, 6.4 times the winners'
// products), but at Tensor Core rates and with no search for the taps a winner reaches.
#pragma once
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>

#include "kernels/gpu/fused_conv_common.cuh"
#include "kernels/gpu/fused_wmma.cuh"

namespace mf::fused_detail {

constexpr int kDgradWarps = 4;                             // warps a block
constexpr int kDgradThreads = kDgradWarps * kLanes;
constexpr int kDgradChannels = 16;                         // a block's channels: an accumulator's columns
constexpr int kDgradRow = 16;                              // a tile: outputs x = 0 .. 15 of one row
constexpr int kDgradMaxRows = 16;                          // output rows the pooling uses, at most
constexpr int kDgradMaxFilters = 64;                       // k: the filters, staged at once
constexpr int kDxRows = kDgradMaxRows + kK - 1, kDxCols = kDgradRow + kK - 1;

// A block's shared memory (39 KB in FP32): its image's dx for its 16 channels, in f32, and
// each warp's staged tile of dconv (a row padded by 32 bytes: ldm a multiple of 16 bytes,
// each k step's columns 32-byte aligned). 32-byte aligned, as the warp matrix loads need.
template <class T>
struct alignas(32) DgradTiles {
  static constexpr int kLd = kDgradMaxFilters + 32 / static_cast<int>(sizeof(T));
  float dx[kDxRows][kDxCols][kDgradChannels];
  T a[kDgradWarps][kDgradRow][kLd];
};

// Whether the sizes fit the kernel: c a multiple of 16, filters a multiple of the k step
// and at most 64, the pooled outputs at most 8 x 8 (so that a row of the outputs the
// pooling uses is one tile, and the image's dx fits the block's shared memory).
__host__ __device__ inline bool dgrad_tc_fits(const FusedConvSizes& g, int k_step) {
  return g.c % kDgradChannels == 0 && g.filters % k_step == 0 && g.filters <= kDgradMaxFilters &&
         2 * pooled_h(g) <= kDgradMaxRows && 2 * pooled_w(g) <= kDgradRow;
}
inline i64 dgrad_tc_blocks(const FusedConvSizes& g) { return g.n * (g.c / kDgradChannels); }

// Block `block` (image block / (c / 16), channels from block % (c / 16) * 16) of a grid of
// kDgradThreads threads a block; sm is the block's shared memory. Writes every input of its
// image and channels: those no window reaches get 0.
template <class T>
__device__ void data_grad_tc(const FusedConvSizes& g, const T* __restrict__ dpool, const T* __restrict__ pooled,
                             const std::uint8_t* __restrict__ winners, const T* __restrict__ w, T* dx, i64 block,
                             DgradTiles<T>& sm) {
  using M = Mma<T>;
  namespace wmma = nvcuda::wmma;
  const int lane = static_cast<int>(threadIdx.x) % kLanes, warp = static_cast<int>(threadIdx.x) / kLanes;
  const i64 groups = g.c / kDgradChannels, s = block / groups, c0 = block % groups * kDgradChannels;
  const i64 ph = pooled_h(g), pw = pooled_w(g), rows = 2 * ph, cols = 2 * pw, ldb = kK * kK * g.c;

  float* all = &sm.dx[0][0][0];
  for (int i = static_cast<int>(threadIdx.x); i < kDxRows * kDxCols * kDgradChannels; i += kDgradThreads) all[i] = 0.0f;
  __syncthreads();

  auto& a = sm.a[warp];
  const i64 rounds = (rows + kDgradWarps - 1) / kDgradWarps;  // the same for every warp: each meets every barrier
  for (i64 j = 0; j < rounds; ++j) {
    const i64 y = warp + j * kDgradWarps;  // this warp's row of outputs
    const bool live = y < rows;
    if (live) {
      // Stage dconv at outputs (y, 0 .. 15): window (y / 2, x / 2)'s gradient where its
      // winner is this output and ReLU passed it. The stage was last read before the
      // previous step's barrier.
      const int q_row = static_cast<int>(y % 2) * 2;
      for (int x = 0; x < kDgradRow; ++x)
        for (i64 f = lane; f < g.filters; f += kLanes) {  // a window's filters: coalesced
          float dz = 0.0f;
          if (x < cols) {
            const i64 o = ((s * ph + y / 2) * pw + x / 2) * g.filters + f;
            if (winners[o] == q_row + x % 2) dz = pooled_grad(dpool, pooled, o);
          }
          a[x][f] = from_f32<T>(dz);
        }
      __syncwarp();  // the stage is whole before any lane loads from it
    }
    for (int r = 0; r < kK; ++r) {
      if (live) {
        for (int t = 0; t < kK; ++t) {
          // Inputs (y + r, t .. t + 15): 16 rows of the accumulator, ldm one input's channels.
          float* out = &sm.dx[y + r][t][0];
          wmma::fragment<wmma::accumulator, kDgradRow, kDgradChannels, M::kStep, float> acc;
          wmma::load_matrix_sync(acc, out, kDgradChannels, wmma::mem_row_major);
          const T* wt = w + (r * kK + t) * g.c + c0;
          for (i64 k0 = 0; k0 < g.filters; k0 += M::kStep) {
            wmma::fragment<wmma::matrix_a, kDgradRow, kDgradChannels, M::kStep, typename M::Precision, wmma::row_major> fa;
            wmma::load_matrix_sync(fa, &a[0][k0], DgradTiles<T>::kLd);
            M::round(fa);
            wmma::fragment<wmma::matrix_b, kDgradRow, kDgradChannels, M::kStep, typename M::Precision, wmma::row_major> fb;
            wmma::load_matrix_sync(fb, wt + k0 * ldb, static_cast<unsigned>(ldb));
            M::round(fb);
            wmma::mma_sync(acc, fa, fb, acc);
          }
          wmma::store_matrix_sync(out, acc, kDgradChannels, wmma::mem_row_major);
          __syncwarp();  // stored before the next tap loads the inputs it shares
        }
      }
      __syncthreads();  // input row y + r is done before another warp's step writes it
    }
  }

  // The image's dx for the block's channels: 16 consecutive channels of an input together.
  for (i64 i = threadIdx.x; i < g.h * g.w * kDgradChannels; i += kDgradThreads) {
    const i64 cc = i % kDgradChannels, x = i / kDgradChannels % g.w, y = i / (kDgradChannels * g.w);
    const float v = y < rows + kK - 1 && x < cols + kK - 1 ? sm.dx[y][x][cc] : 0.0f;
    dx[((s * g.h + y) * g.w + x) * g.c + c0 + cc] = from_f32<T>(v);
  }
}

}  // namespace mf::fused_detail
