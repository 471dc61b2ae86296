// fused_conv_grad.cu: the fused step's convolution gradients (fused.h): the weight
// gradients' partial sums and their sum in a fixed order, and conv2's data gradient, each
// visiting only the pooled outputs whose winner passed ReLU (fused_conv.cu has the forward
// that chose the winners, and why the winners are kept as a byte each).
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/gpu/fused.h"
#include "kernels/gpu/fused_conv_common.cuh"
#include "runtime/cuda_check.h"
#include "runtime/kernel_util.cuh"

namespace mf {

namespace {

using namespace fused_detail;

// ---- weight gradient: partial sums per chunk of images, then their sum in chunk order ----
// What both partial-sum kernels walk: the pooled outputs of filter f in chunk `chunk`'s
// images, image by image, position by position (the order every partial sum keeps, so that
// both kernels give the same bits), calling visit(x, py, px, q, dz) for each whose gradient
// dz passed ReLU, with x the image's input row and q the window position that won. Most
// are skipped: at most one of a window's four outputs has a gradient, and ReLU zeroes more.
template <class T, class In, class Visit>
__device__ __forceinline__ void visit_passed(const FusedConvSizes& g, const In& in, const T* __restrict__ dpool,
                                             const T* __restrict__ pooled, const std::uint8_t* __restrict__ winners,
                                             i64 chunk, i64 f, const Visit& visit) {
  const i64 ph = pooled_h(g), pw = pooled_w(g);
  const i64 s0 = chunk * kChunkImages, s1 = s0 + kChunkImages < g.n ? s0 + kChunkImages : g.n;
  for (i64 s = s0; s < s1; ++s) {
    const auto* x = in.row(s);
    for (i64 py = 0; py < ph; ++py)
      for (i64 px = 0; px < pw; ++px) {
        const i64 o = ((s * ph + py) * pw + px) * g.filters + f;
        const float dz = pooled_grad(dpool, pooled, o);
        if (dz != 0.0f) visit(x, py, px, static_cast<int>(winners[o]), dz);
      }
  }
}

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
  const i64 params = params_of(g), n_w = params - g.filters;
  const i64 chunk = blockIdx.x;
  const i64 p = static_cast<i64>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (p < params) {
    const bool bias = p >= n_w;
    const i64 f = bias ? p - n_w : p / (kK * kK * g.c);
    const i64 c = p % g.c, t = p / g.c % kK, r = p / (g.c * kK) % kK;
    float acc = 0.0f;
    visit_passed(g, in, dpool, pooled, winners, chunk, f, [&](const auto* x, i64 py, i64 px, int q, float dz) {
      acc += bias ? dz : dz * In::at(x, ((2 * py + q / 2 + r) * g.w + 2 * px + q % 2 + t) * g.c + c);
    });
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
  const i64 params = params_of(g), n_w = params - g.filters;
  const i64 total = chunks_of(g) * g.filters * g.c;
  const i64 stride = blocks * blockDim.x;
  for (i64 e = block * blockDim.x + threadIdx.x; e < total; e += stride) {
    const i64 c = e % g.c, f = e / g.c % g.filters, chunk = e / (g.c * g.filters);
    float acc[kK * kK] = {}, bias = 0.0f;
    visit_passed(g, in, dpool, pooled, winners, chunk, f, [&](const T* x, i64 py, i64 px, int q, float dz) {
      const i64 at = ((2 * py + q / 2) * g.w + 2 * px + q % 2) * g.c + c;  // the winner's tap (0, 0)
      for (int r = 0; r < kK; ++r)
        for (int t = 0; t < kK; ++t) acc[r * kK + t] += dz * to_f32(x[at + (r * g.w + t) * g.c]);
      bias += dz;
    });
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

template <class T, class In>
void wgrad_partials(const FusedConvSizes& g, const In& in, const void* dpool, const void* pooled,
                    const std::uint8_t* winners, float* partials, cudaStream_t st) {
  const dim3 grid(static_cast<unsigned>(chunks_of(g)), static_cast<unsigned>((params_of(g) + kBlock - 1) / kBlock));
  conv_wgrad_partials_kernel<T, In><<<grid, kBlock, 0, st>>>(
      g, in, static_cast<const T*>(dpool), static_cast<const T*>(pooled), winners, partials);
  MF_CHECK_LAUNCH();
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

}  // namespace

void launch_fused_conv1_wgrad_partials(const FusedConvSizes& g, const FusedBatch& batch, const void* dpool,
                                       const void* pooled, const std::uint8_t* winners, float* scratch, bool half,
                                       GpuStream stream) {
  check_sizes(g);
  if (g.n == 0) return;
  if (half) wgrad_partials<__half>(g, pixels(g, batch, nullptr), dpool, pooled, winners, scratch, stream);
  else wgrad_partials<float>(g, pixels(g, batch, nullptr), dpool, pooled, winners, scratch, stream);
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
