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
#include <stdexcept>
#include <string>

#include "kernels/gpu/fused.h"
#include "runtime/cuda_check.h"
#include "runtime/kernel_util.cuh"

namespace mf {

namespace {

using namespace gpu;
using i64 = std::int64_t;

constexpr int kK = 3;            // the model's kernel size
constexpr i64 kChunkImages = 4;  // images per partial sum of a weight gradient

// p / 255 as batch.cu rounds it (IEEE division): the same value as the host's float(p) / 255.
__device__ __forceinline__ float pixel(std::uint8_t p) { return __fdiv_rn(static_cast<float>(p), 255.0f); }

// The input of the first convolution: batch row s is the data set's image perm[*offset + s]
// (perm null: image s; offset null: 0). Its kernel also writes the batch's labels.
struct DatasetPixels {
  const std::uint8_t* images;
  const std::uint8_t* labels;
  const std::int32_t* perm;
  const std::int64_t* offset;
  std::int32_t* labels_out;
  i64 image_size;
  __device__ i64 image(i64 s) const { return perm ? perm[(offset ? *offset : 0) + s] : s; }
  __device__ const std::uint8_t* row(i64 s) const { return images + image(s) * image_size; }
  __device__ static float at(const std::uint8_t* row, i64 i) { return pixel(row[i]); }
  __device__ void write_label(i64 s) const {
    if (labels_out) labels_out[s] = labels[image(s)];
  }
};

// The input of the second convolution: the batch's activations, NHWC, f32 or f16.
template <class T>
struct Activations {
  const T* x;
  i64 image_size;
  __device__ const T* row(i64 s) const { return x + s * image_size; }
  __device__ static float at(const T* row, i64 i) { return to_f32(row[i]); }
  __device__ void write_label(i64) const {}
};

__device__ __forceinline__ i64 pooled_h(const FusedConvSizes& g) { return (g.h - kK + 1) / 2; }
__device__ __forceinline__ i64 pooled_w(const FusedConvSizes& g) { return (g.w - kK + 1) / 2; }
// A weight gradient's partial sums (one per chunk of kChunkImages images) and its
// parameters: the kernel's (filters, 3, 3, c), then the biases.
__host__ __device__ __forceinline__ i64 chunks_of(const FusedConvSizes& g) {
  return (g.n + kChunkImages - 1) / kChunkImages;
}
__host__ __device__ __forceinline__ i64 params_of(const FusedConvSizes& g) {
  return g.filters * kK * kK * g.c + g.filters;
}

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
constexpr int kLanes = 32;                           // a warp: the filters of a tile
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
    float best = 0.0f;
    int arg = 0;
    for (int q = 0; q < 4; ++q) {
      const float v = to_f32(from_f32<T>(z[q] < 0.0f ? 0.0f : z[q]));  // ReLU; NaN passes
      if (q == 0 || v > best || (v != v && best == best)) best = v, arg = q;
    }
    const i64 o = (s * positions + pos) * g.filters + f;
    pooled[o] = from_f32<T>(best);
    winners[o] = static_cast<std::uint8_t>(arg);
  }
}

// dz at pooled output o: dpool where the pooled value is positive (ReLU passed it), else 0.
template <class T>
__device__ __forceinline__ float pooled_grad(const T* dpool, const T* pooled, i64 o) {
  return to_f32(pooled[o]) > 0.0f ? to_f32(dpool[o]) : 0.0f;
}

// ---- weight gradient: partial sums per chunk of images, then their sum in chunk order ----
// Parameters p = 0 .. filters*9*c - 1 are the kernel (f, r, t, c) in its (K, k, k, C)
// layout, then the filters' biases. The gradient at pooled output (n, py, px, f) came from
// window position winners[...], so it multiplies the inputs under that position's window.
// Grid: blockIdx.x the chunk of kChunkImages images, blockIdx.y a tile of kBlock parameters;
// one thread per (chunk, parameter). The first convolution's (conv1: 320 parameters, 16 x 2
// blocks at batch 64); the second has the kernel below.
template <class T, class In>
__global__ void conv_wgrad_partials_kernel(FusedConvSizes g, In in, const T* __restrict__ dpool,
                                           const T* __restrict__ pooled, const std::uint8_t* __restrict__ winners,
                                           float* partials) {
  const i64 ph = pooled_h(g), pw = pooled_w(g);
  const i64 params = params_of(g), n_w = params - g.filters;
  const i64 chunk = blockIdx.x, s0 = chunk * kChunkImages, s1 = s0 + kChunkImages < g.n ? s0 + kChunkImages : g.n;
  const i64 p = static_cast<i64>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (p < params) {
    const bool bias = p >= n_w;
    const i64 f = bias ? p - n_w : p / (kK * kK * g.c);
    const i64 c = p % g.c, t = p / g.c % kK, r = p / (g.c * kK) % kK;
    float acc = 0.0f;
    for (i64 s = s0; s < s1; ++s) {
      const auto* x = in.row(s);
      for (i64 py = 0; py < ph; ++py)
        for (i64 px = 0; px < pw; ++px) {
          const i64 o = ((s * ph + py) * pw + px) * g.filters + f;
          const float dz = pooled_grad(dpool, pooled, o);
          if (dz == 0.0f) continue;  // most of them: not the winner's ReLU-passed gradient
          if (bias) {
            acc += dz;
          } else {
            const int q = winners[o];
            acc += dz * In::at(x, ((2 * py + q / 2 + r) * g.w + 2 * px + q % 2 + t) * g.c + c);
          }
        }
    }
    partials[chunk * params + p] = acc;
  }
}

// The second convolution's partial sums, a thread per (chunk, filter f, input channel c):
// the nine taps of (f, c) at once and, in the channel-0 thread, f's bias. The kernel above
// gives each tap its own thread, so nine threads (nine warps) read every pooled output's
// gradient and winner; here one reads them and multiplies the 3x3 inputs under the winner,
// nine FMAs for one look. A warp's lanes are consecutive channels of one filter: the
// gradient and the winner are one broadcast load, each tap's inputs a coalesced one. Each
// sum runs image by image, position by position, as above: the same bits as a thread per
// parameter gives. For the first convolution (the data set's pixels: one channel in the
// model) a thread per (filter, channel) would be 32 threads a chunk: it keeps the kernel above.
// Run by blocks `block` of `blocks` (conv_backward_kernel gives it part of its grid).
template <class T>
__device__ void wgrad_taps(const FusedConvSizes& g, const Activations<T>& in, const T* __restrict__ dpool,
                           const T* __restrict__ pooled, const std::uint8_t* __restrict__ winners, float* partials,
                           i64 block, i64 blocks) {
  const i64 ph = pooled_h(g), pw = pooled_w(g);
  const i64 params = params_of(g), n_w = params - g.filters;
  const i64 total = chunks_of(g) * g.filters * g.c;
  const i64 stride = blocks * blockDim.x;
  for (i64 e = block * blockDim.x + threadIdx.x; e < total; e += stride) {
    const i64 c = e % g.c, f = e / g.c % g.filters, chunk = e / (g.c * g.filters);
    const i64 s0 = chunk * kChunkImages, s1 = s0 + kChunkImages < g.n ? s0 + kChunkImages : g.n;
    float acc[kK * kK] = {}, bias = 0.0f;
    for (i64 s = s0; s < s1; ++s) {
      const T* x = in.row(s);
      for (i64 py = 0; py < ph; ++py)
        for (i64 px = 0; px < pw; ++px) {
          const i64 o = ((s * ph + py) * pw + px) * g.filters + f;
          const float dz = pooled_grad(dpool, pooled, o);
          if (dz == 0.0f) continue;
          const int q = winners[o];
          const i64 at = ((2 * py + q / 2) * g.w + 2 * px + q % 2) * g.c + c;  // the winner's tap (0, 0)
          for (int r = 0; r < kK; ++r)
            for (int t = 0; t < kK; ++t) acc[r * kK + t] += dz * to_f32(x[at + (r * g.w + t) * g.c]);
          bias += dz;
        }
    }
    float* out = partials + chunk * params;
    for (int tap = 0; tap < kK * kK; ++tap) out[(f * kK * kK + tap) * g.c + c] = acc[tap];
    if (c == 0) out[n_w + f] = bias;
  }
}
template <class T>
__global__ void conv_wgrad_tap_partials_kernel(FusedConvSizes g, Activations<T> in, const T* __restrict__ dpool,
                                               const T* __restrict__ pooled, const std::uint8_t* __restrict__ winners,
                                               float* partials) {
  wgrad_taps<T>(g, in, dpool, pooled, winners, partials, blockIdx.x, gridDim.x);
}

// The second pass, for up to kMaxWgradSums convolutions in one launch (a launch costs a
// kernel's latency floor and a graph node, more than summing conv1's 320 parameters does):
// each thread sums its parameters' partials over the chunks in chunk order, layer after
// layer. The batch cursor's advance rides along: thread 0 of block 0, after the step's last
// reader of the cursor (conv1's weight gradient) has finished, as stream order guarantees;
// so does the optimizer's update count, which no kernel of the step reads before Adam (it
// stops at 2^31 - 1, as launch_finish_step's).
struct WgradSums {
  FusedWgradSum layer[kMaxWgradSums];
  int count;
};
template <class T>
__global__ void conv_wgrad_sums_kernel(WgradSums sums, std::int64_t* cursor, std::int64_t advance,
                                       std::int32_t* step_count) {
  const i64 first = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (int l = 0; l < sums.count; ++l) {
    const FusedConvSizes g = sums.layer[l].g;
    const i64 params = params_of(g), n_w = params - g.filters, chunks = chunks_of(g);
    const float* partials = sums.layer[l].scratch;
    T* dw = static_cast<T*>(sums.layer[l].dw);
    T* db = static_cast<T*>(sums.layer[l].db);
    for (i64 p = first; p < params; p += stride) {
      float acc = 0.0f;
      for (i64 ch = 0; ch < chunks; ++ch) acc += partials[ch * params + p];
      T* out = p < n_w ? dw + p : db + (p - n_w);
      *out = from_f32<T>(to_f32(*out) + acc);
    }
  }
  if (first == 0) {
    if (cursor) *cursor += advance;
    if (step_count && *step_count < INT32_MAX) ++*step_count;
  }
}

// ---- data gradient: one thread per channel of a 2x2 block of inputs ----
// Pooling window (wy, wx) holds the convolution outputs of rows 2wy, 2wy+1 and columns 2wx,
// 2wx+1, and through the 3x3 taps they reach the inputs of rows 2wy .. 2wy+3 and columns
// 2wx .. 2wx+3. So the 2x2 block of inputs at rows 2by, 2by+1 and columns 2bx, 2bx+1 hears
// from exactly four windows, (by-1 .. by) x (bx-1 .. bx), and from one output of each of
// their filters: the winner, where ReLU passed it. A thread visits those 4 x filters pooled
// outputs once each, skips the zeros, and adds each gradient through the taps that join its
// winner to the block's four inputs (input row 2by+u comes from output row 2wy+a through tap
// r = u - 2dy - a; one to four taps of the nine). One thread per input with the nine taps
// as its loop visits each pooled output 9 times over to find the one in four that won;
// here an output is visited by the 4 blocks it reaches and never misses. A warp's lanes are
// consecutive channels of one block, so a window's gradient and winner are one broadcast
// load for them all, the weights a coalesced one. Sums run window by window, filter by
// filter: a fixed order, the same bits at every launch. Inputs no window reaches (a row or
// column the pooling dropped) get 0. Run by blocks `block` of `blocks`, as wgrad_taps.
template <class T>
__device__ void data_grad(const FusedConvSizes& g, const T* __restrict__ dpool, const T* __restrict__ pooled,
                          const std::uint8_t* __restrict__ winners, const T* __restrict__ w, T* dx, i64 block,
                          i64 blocks) {
  const i64 ph = pooled_h(g), pw = pooled_w(g), bh = (g.h + 1) / 2, bw = (g.w + 1) / 2;
  const i64 total = g.n * bh * bw * g.c;
  const i64 stride = blocks * blockDim.x;
  for (i64 e = block * blockDim.x + threadIdx.x; e < total; e += stride) {
    const i64 c = e % g.c, bx = e / g.c % bw, by = e / (g.c * bw) % bh, s = e / (g.c * bw * bh);
    float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    for (int dy = -1; dy <= 0; ++dy)
      for (int dxw = -1; dxw <= 0; ++dxw) {
        const i64 wy = by + dy, wx = bx + dxw;
        if (wy < 0 || wx < 0 || wy >= ph || wx >= pw) continue;
        const i64 o0 = ((s * ph + wy) * pw + wx) * g.filters;
        for (i64 f = 0; f < g.filters; ++f) {
          const float dz = pooled_grad(dpool, pooled, o0 + f);
          if (dz == 0.0f) continue;  // lost its window, or ReLU stopped it: most of them
          const int won = winners[o0 + f], a = won / 2, b = won % 2;  // the winner's row, column in the window
          const T* wf = w + f * kK * kK * g.c + c;
          for (int u = 0; u < 2; ++u) {
            const int r = u - 2 * dy - a;
            if (r < 0 || r >= kK) continue;
            for (int v = 0; v < 2; ++v) {
              const int t = v - 2 * dxw - b;
              if (t >= 0 && t < kK) acc[u][v] += dz * to_f32(wf[(r * kK + t) * g.c]);
            }
          }
        }
      }
    for (int u = 0; u < 2; ++u)
      for (int v = 0; v < 2; ++v) {
        const i64 p = 2 * by + u, q = 2 * bx + v;
        if (p < g.h && q < g.w) dx[((s * g.h + p) * g.w + q) * g.c + c] = from_f32<T>(acc[u][v]);
      }
  }
}
template <class T>
__global__ void conv_dgrad_kernel(FusedConvSizes g, const T* __restrict__ dpool, const T* __restrict__ pooled,
                                  const std::uint8_t* __restrict__ winners, const T* __restrict__ w, T* dx) {
  data_grad<T>(g, dpool, pooled, winners, w, dx, blockIdx.x, gridDim.x);
}

// Both of the second convolution's backward passes in one launch: they read the same
// gradient and winners and write different buffers (dx, the partial sums), so neither waits
// for the other, and the step saves a launch's latency floor and a graph node. The first
// dgrad_blocks blocks compute dx, the others the partial sums; the branch is the same for
// every thread of a block.
template <class T>
__global__ void conv_backward_kernel(FusedConvSizes g, Activations<T> in, const T* __restrict__ dpool,
                                     const T* __restrict__ pooled, const std::uint8_t* __restrict__ winners,
                                     const T* __restrict__ w, T* dx, float* partials, i64 dgrad_blocks) {
  const i64 block = blockIdx.x;
  if (block < dgrad_blocks) data_grad<T>(g, dpool, pooled, winners, w, dx, block, dgrad_blocks);
  else wgrad_taps<T>(g, in, dpool, pooled, winners, partials, block - dgrad_blocks, gridDim.x - dgrad_blocks);
}

i64 filter_tiles(const FusedConvSizes& g) { return (g.filters + kLanes - 1) / kLanes; }

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

void check_sizes(const FusedConvSizes& g) {
  if (g.h < kK + 1 || g.w < kK + 1 || g.c < 1 || g.filters < 1 || g.n < 0)
    throw std::invalid_argument("fused convolution: inputs of " + std::to_string(g.h) + "x" + std::to_string(g.w) +
                                "x" + std::to_string(g.c) + " leave no 2x2 pooling window after a 3x3 convolution");
  if (filter_tiles(g) > 65535)  // the forward's grid.y
    throw std::invalid_argument("fused convolution: " + std::to_string(g.filters) +
                                " filters, more than its forward kernel's grid holds (2,097,120)");
  if (g.n > 2147483647)  // the forward's grid.x
    throw std::invalid_argument("fused convolution: a batch of " + std::to_string(g.n) + " images is too large");
  if ((params_of(g) + kBlock - 1) / kBlock > 65535)  // the weight gradient's grid.y
    throw std::invalid_argument("fused convolution: " + std::to_string(params_of(g)) +
                                " parameters, more than its weight-gradient kernel's grid holds (16,776,960)");
}

template <class T, class In>
void forward(const FusedConvSizes& g, const In& in, const void* w, const void* b, void* pooled, std::uint8_t* winners,
             cudaStream_t st) {
  const dim3 grid = forward_grid(g);
  conv_pool_forward_kernel<T, In><<<grid, kBlock, 0, st>>>(
      g, in, static_cast<const T*>(w), static_cast<const T*>(b), static_cast<T*>(pooled), winners);
  MF_CHECK_LAUNCH();
}

template <class T, class In>
void wgrad_partials(const FusedConvSizes& g, const In& in, const void* dpool, const void* pooled,
                    const std::uint8_t* winners, float* partials, cudaStream_t st) {
  const dim3 grid(static_cast<unsigned>(chunks_of(g)), static_cast<unsigned>((params_of(g) + kBlock - 1) / kBlock));
  conv_wgrad_partials_kernel<T, In><<<grid, kBlock, 0, st>>>(
      g, in, static_cast<const T*>(dpool), static_cast<const T*>(pooled), winners, partials);
  MF_CHECK_LAUNCH();
}

template <class T>
Activations<T> activations(const FusedConvSizes& g, const void* x) {
  return Activations<T>{static_cast<const T*>(x), g.h * g.w * g.c};
}

// Threads of the data gradient (a channel of a 2x2 block of inputs) and of conv2's partial
// sums (a chunk, filter and channel).
i64 dgrad_threads(const FusedConvSizes& g) { return g.n * ((g.h + 1) / 2) * ((g.w + 1) / 2) * g.c; }
i64 tap_threads(const FusedConvSizes& g) { return chunks_of(g) * g.filters * g.c; }

template <class T>
void wgrad_tap_partials(const FusedConvSizes& g, const void* x, const void* dpool, const void* pooled,
                        const std::uint8_t* winners, float* partials, cudaStream_t st) {
  conv_wgrad_tap_partials_kernel<T><<<blocks_for(tap_threads(g)), kBlock, 0, st>>>(
      g, activations<T>(g, x), static_cast<const T*>(dpool), static_cast<const T*>(pooled), winners, partials);
  MF_CHECK_LAUNCH();
}

template <class T>
void dgrad(const FusedConvSizes& g, const void* dpool, const void* pooled, const std::uint8_t* winners,
           const void* w, void* dx, cudaStream_t st) {
  conv_dgrad_kernel<T><<<blocks_for(dgrad_threads(g)), kBlock, 0, st>>>(
      g, static_cast<const T*>(dpool), static_cast<const T*>(pooled), winners, static_cast<const T*>(w),
      static_cast<T*>(dx));
  MF_CHECK_LAUNCH();
}

template <class T>
void backward(const FusedConvSizes& g, const void* x, const void* dpool, const void* pooled,
              const std::uint8_t* winners, const void* w, void* dx, float* partials, cudaStream_t st) {
  const int dgrad_blocks = blocks_for(dgrad_threads(g)), tap_blocks = blocks_for(tap_threads(g));
  conv_backward_kernel<T><<<dgrad_blocks + tap_blocks, kBlock, 0, st>>>(
      g, activations<T>(g, x), static_cast<const T*>(dpool), static_cast<const T*>(pooled), winners,
      static_cast<const T*>(w), static_cast<T*>(dx), partials, dgrad_blocks);
  MF_CHECK_LAUNCH();
}

DatasetPixels pixels(const FusedConvSizes& g, const FusedBatch& batch, std::int32_t* labels_out) {
  return DatasetPixels{batch.images, batch.labels, batch.perm, batch.offset, labels_out, g.h * g.w * g.c};
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

void launch_fused_conv1_wgrad_partials(const FusedConvSizes& g, const FusedBatch& batch, const void* dpool,
                                       const void* pooled, const std::uint8_t* winners, float* scratch, bool half,
                                       GpuStream stream) {
  check_sizes(g);
  if (g.n == 0) return;
  if (half) wgrad_partials<__half>(g, pixels(g, batch, nullptr), dpool, pooled, winners, scratch, stream);
  else wgrad_partials<float>(g, pixels(g, batch, nullptr), dpool, pooled, winners, scratch, stream);
}

void launch_fused_conv_forward(const FusedConvSizes& g, const void* x, const void* w, const void* b, void* pooled,
                               std::uint8_t* winners, bool half, GpuStream stream) {
  check_sizes(g);
  if (g.n == 0) return;
  if (half) forward<__half>(g, activations<__half>(g, x), w, b, pooled, winners, stream);
  else forward<float>(g, activations<float>(g, x), w, b, pooled, winners, stream);
}

void launch_fused_conv_wgrad_partials(const FusedConvSizes& g, const void* x, const void* dpool, const void* pooled,
                                      const std::uint8_t* winners, float* scratch, bool half, GpuStream stream) {
  check_sizes(g);
  if (g.n == 0) return;
  if (half) wgrad_tap_partials<__half>(g, x, dpool, pooled, winners, scratch, stream);
  else wgrad_tap_partials<float>(g, x, dpool, pooled, winners, scratch, stream);
}

void launch_fused_conv_wgrad_sums(const FusedWgradSum* layers, int count, std::int64_t* cursor, std::int64_t advance,
                                  std::int32_t* step_count, bool half, GpuStream stream) {
  if (count < 0 || count > kMaxWgradSums)
    throw std::invalid_argument("fused weight-gradient sums: " + std::to_string(count) +
                                " layers in one launch (at most " + std::to_string(kMaxWgradSums) + ")");
  WgradSums sums{};
  sums.count = count;
  i64 widest = 1;
  for (int l = 0; l < count; ++l) {
    check_sizes(layers[l].g);
    sums.layer[l] = layers[l];
    widest = std::max(widest, params_of(layers[l].g));
  }
  if (count == 0 && !cursor && !step_count) return;
  if (half) conv_wgrad_sums_kernel<__half><<<blocks_for(widest), kBlock, 0, stream>>>(sums, cursor, advance, step_count);
  else conv_wgrad_sums_kernel<float><<<blocks_for(widest), kBlock, 0, stream>>>(sums, cursor, advance, step_count);
  MF_CHECK_LAUNCH();
}

void launch_fused_conv_dgrad(const FusedConvSizes& g, const void* dpool, const void* pooled,
                             const std::uint8_t* winners, const void* w, void* dx, bool half, GpuStream stream) {
  check_sizes(g);
  if (g.n == 0) return;
  if (half) dgrad<__half>(g, dpool, pooled, winners, w, dx, stream);
  else dgrad<float>(g, dpool, pooled, winners, w, dx, stream);
}

void launch_fused_conv_backward(const FusedConvSizes& g, const void* x, const void* dpool, const void* pooled,
                                const std::uint8_t* winners, const void* w, void* dx, float* scratch, bool half,
                                GpuStream stream) {
  check_sizes(g);
  if (g.n == 0) return;
  if (half) backward<__half>(g, x, dpool, pooled, winners, w, dx, scratch, stream);
  else backward<float>(g, x, dpool, pooled, winners, w, dx, scratch, stream);
}

}  // namespace mf
