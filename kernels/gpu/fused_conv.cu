// fused_conv.cu: the fused step's convolutions (fused.h): a 3x3 convolution with its bias,
// ReLU and 2x2 max pooling in one pass, its weight gradient, and its data gradient.
//
// The library rung writes a convolution's whole output (conv1's is 26x26x32 an image:
// 89 MB in FP32 at batch 1024), reads it back to add the bias and apply ReLU, again to pool
// it, and again in the backward. Here a thread computes the four outputs of one pooling
// window and keeps only their maximum and which of the four won (one byte): 4x less to
// write, and nothing before the pooling ever reaches memory. The backward recomputes
// nothing: the winner says which window position each gradient came through, the pooled
// value whether ReLU let it pass (it did where the maximum is positive).
//
// The first convolution reads the data set's u8 pixels itself (DatasetPixels: the batch
// gather and the normalisation folded in), the second the first one's pooled output
// (Activations).
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/gpu/fused.h"
#include "kernels/gpu/fused_conv_common.cuh"
#include "runtime/cuda_check.h"
#include "runtime/kernel_util.cuh"

namespace mf {

namespace {

using namespace fused_detail;

// ---- forward: one warp per pooled position, one lane per filter ----
// Block (image s, a tile of 32 filters, a group of pooled positions): each warp takes one
// pooled position (py, px) at a time and each of its lanes one filter f of the tile, and
// computes the four convolution outputs of that pooling window at once, from the 4x4 input
// patch under it. Two things make it fast where one thread per output with the weights read
// from global memory is slow:
//   - the lanes of a warp read the same input value (one broadcast load), and their 32
//     filters' weights from shared memory, a row per filter, padded by one float so that
//     32 lanes hit 32 banks; in global memory the 32 filters' weights lie 9*c floats apart,
//     32 cache lines for one instruction;
//   - each weight read feeds the four window outputs, and each input read up to nine taps.
// The weights come into shared memory kChanTile input channels at a time (37 KB), so any
// channel count fits; with one chunk (at most 32 channels, as both of the model's layers
// have) they are loaded once for all of the block's positions. Window position q = 0..3 is
// (2py, 2px), (2py, 2px+1), (2py+1, 2px), (2py+1, 2px+1), as maxpool.cu numbers it; each
// output is rounded to the storage type before the comparison, as the library rung's stored
// outputs are, and a strict '>' keeps the first of equal values, the first NaN over any
// number. Sums run bias, then channel by channel, tap by tap: a fixed order, the same bits
// at every launch.
constexpr int kChanTile = 32;                        // input channels of weights held at a time
constexpr int kWarpsPerBlock = kBlock / kLanes;      // pooled positions a block works on at once
constexpr int kTapRow = kK * kK * kChanTile + 1;     // one filter's weights in shared memory, padded
constexpr i64 kForwardBlocksPerSm = 4;               // 4 x 37 KB of shared memory: fits an SM's 228 KB

template <class T, class In>
__global__ void conv_pool_forward_kernel(FusedConvSizes g, In in, const T* __restrict__ w, const T* __restrict__ b,
                                         T* pooled, std::uint8_t* winners) {
  __shared__ float ws[kLanes][kTapRow];  // [filter in tile][tap * kChanTile + channel in chunk]
  const i64 ph = pooled_h(g), pw = pooled_w(g), positions = ph * pw;
  const i64 s = blockIdx.x, f0 = static_cast<i64>(blockIdx.y) * kLanes;
  const int lane = static_cast<int>(threadIdx.x) % kLanes, warp = static_cast<int>(threadIdx.x) / kLanes;
  const i64 f = f0 + lane;
  const auto* x = in.row(s);
  if (blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0) in.write_label(s);
  // The positions this warp takes: pos0, pos0 + step, ... All warps run the same number of
  // rounds (the barriers need every thread), the ones past the end computing nothing.
  const i64 step = static_cast<i64>(gridDim.z) * kWarpsPerBlock;
  const i64 rounds = (positions + step - 1) / step;
  for (i64 round = 0; round < rounds; ++round) {
    const i64 pos = round * step + static_cast<i64>(blockIdx.z) * kWarpsPerBlock + warp;
    const bool active = pos < positions && f < g.filters;
    const i64 py = active ? pos / pw : 0, px = active ? pos % pw : 0;
    const float bias = active ? to_f32(b[f]) : 0.0f;
    float z[4] = {bias, bias, bias, bias};
    for (i64 c0 = 0; c0 < g.c; c0 += kChanTile) {
      const int cn = static_cast<int>(g.c - c0 < kChanTile ? g.c - c0 : kChanTile);
      if (round == 0 || g.c > kChanTile) {  // a lone chunk (c <= 32, as in the model) stays for every round
        __syncthreads();  // every warp is done with the previous chunk's weights
        for (int i = static_cast<int>(threadIdx.x); i < kLanes * kK * kK * cn; i += static_cast<int>(blockDim.x)) {
          const int ff = i / (kK * kK * cn), tap = i / cn % (kK * kK), cc = i % cn;  // consecutive i: consecutive cc
          const bool real = f0 + ff < g.filters;  // the last tile's filters past the end: zeros
          ws[ff][tap * kChanTile + cc] = real ? to_f32(w[((f0 + ff) * kK * kK + tap) * g.c + c0 + cc]) : 0.0f;
        }
        __syncthreads();
      }
      if (!active) continue;
      for (int cc = 0; cc < cn; ++cc) {
        float patch[kK + 1][kK + 1];  // the input under the window, rows 2py.., columns 2px..
        for (int a = 0; a <= kK; ++a)
          for (int e = 0; e <= kK; ++e) patch[a][e] = In::at(x, ((2 * py + a) * g.w + 2 * px + e) * g.c + c0 + cc);
        for (int r = 0; r < kK; ++r)
          for (int t = 0; t < kK; ++t) {
            const float wv = ws[lane][(r * kK + t) * kChanTile + cc];
            for (int q = 0; q < 4; ++q) z[q] += patch[q / 2 + r][q % 2 + t] * wv;
          }
      }
    }
    if (!active) continue;
    pool_window(z, pooled, winners, (s * positions + pos) * g.filters + f);
  }
}

// The forward's grid: (images, filter tiles, position groups), with as many position groups
// as it takes to give every SM kForwardBlocksPerSm blocks, and no more than there are
// positions for a block's warps. On an H100 (132 SMs) at batch 64, conv2 gets 4 groups,
// 512 blocks; at batch 1024 one group is already 2048 blocks.
dim3 forward_grid(const FusedConvSizes& g) {
  const i64 positions = ((g.h - kK + 1) / 2) * ((g.w - kK + 1) / 2);
  const i64 tiles = g.n * filter_tiles(g), wanted_blocks = kForwardBlocksPerSm * sm_count();
  const i64 wanted = (wanted_blocks + tiles - 1) / tiles;
  const i64 groups = std::min<i64>({(positions + kWarpsPerBlock - 1) / kWarpsPerBlock, wanted, 65535});
  return dim3(static_cast<unsigned>(g.n), static_cast<unsigned>(filter_tiles(g)), static_cast<unsigned>(groups));
}

template <class T, class In>
void forward(const FusedConvSizes& g, const In& in, const void* w, const void* b, void* pooled, std::uint8_t* winners,
             cudaStream_t st) {
  const dim3 grid = forward_grid(g);
  conv_pool_forward_kernel<T, In><<<grid, kBlock, 0, st>>>(
      g, in, static_cast<const T*>(w), static_cast<const T*>(b), static_cast<T*>(pooled), winners);
  MF_CHECK_LAUNCH();
}

}  // namespace

std::size_t fused_conv_scratch_bytes(const FusedConvSizes& g) {
  return static_cast<std::size_t>(chunks_of(g) * params_of(g)) * sizeof(float);
}

void launch_fused_conv1_forward(const FusedConvSizes& g, const FusedBatch& batch, const void* w, const void* b,
                                void* pooled, std::uint8_t* winners, std::int32_t* labels_out, bool half,
                                GpuStream stream) {
  check_sizes(g);
  if (g.n == 0) return;
  if (half) forward<__half>(g, pixels(g, batch, labels_out), w, b, pooled, winners, stream);
  else forward<float>(g, pixels(g, batch, labels_out), w, b, pooled, winners, stream);
}

void launch_fused_conv_forward(const FusedConvSizes& g, const void* x, const void* w, const void* b, void* pooled,
                               std::uint8_t* winners, bool half, bool tensor_cores, GpuStream stream) {
  check_sizes(g);
  if (g.n == 0) return;
  if (tensor_cores && fused_conv_takes_tensor_cores(g, w, half)) return conv_forward_tensor_cores(g, x, w, b, pooled, winners, half, stream);
  if (half) forward<__half>(g, activations<__half>(g, x), w, b, pooled, winners, stream);
  else forward<float>(g, activations<float>(g, x), w, b, pooled, winners, stream);
}

}  // namespace mf
