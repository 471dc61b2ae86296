// bias_act.cu: the bias + ReLU epilogue of a convolution or GEMM, forward and backward.
//
// Activations are NHWC, so a tensor of n elements is rows = n / C rows of C contiguous
// channels, and the bias of element i is bias[i % C]. Storage is f32 or f16 (__half);
// arithmetic is always f32.
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

constexpr int kWarp = 32;

// ---- forward ----
// y is seen as n / N vectors of N consecutive elements; N divides C, so a vector never
// straddles two rows and its channels are c0 .. c0 + N - 1 with c0 = (i * N) % C. One thread
// per vector, grid-stride: neighbouring threads touch neighbouring 16-byte chunks, so a
// warp reads and writes 512 contiguous bytes. The bias (C <= a few hundred values) stays
// in L1 after the first touch.
template <class T, int N>
__global__ void bias_act_forward_kernel(T* y, const T* __restrict__ bias, std::int64_t n_vec, std::int64_t channels,
                                        bool relu) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_vec; i += stride) {
    Vec<T, N> r = load_vec<T, N>(y + i * N);
    const std::int64_t c0 = (i * N) % channels;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float z = to_f32(r.v[k]) + to_f32(bias[c0 + k]);
      if (relu) z = z <= 0.0f ? 0.0f : z;  // NaN passes, as on the CPU (kernels/cpu/conv2d_cpu_kernels.h)
      r.v[k] = from_f32<T>(z);
    }
    store_vec<T, N>(y + i * N, r);
  }
}

template <class T, int N>
void bias_act_forward(T* y, const T* bias, std::int64_t n, std::int64_t channels, bool relu, cudaStream_t stream) {
  const std::int64_t n_vec = n / N;
  const int blocks = blocks_for(n_vec);
  bias_act_forward_kernel<T, N><<<blocks, kBlock, 0, stream>>>(y, bias, n_vec, channels, relu);
  MF_CHECK_LAUNCH();
}

// ---- backward ----
// The bias gradient is a column sum over all rows of dz (rows = N*H*W, up to 1024*26*26),
// so it is done in two levels: each block sums a slice of the rows for a tile of columns
// in registers and shared memory and writes its per-channel partial sums to the scratch;
// the last block of each tile to finish adds the slices' partials in slice order and adds
// the totals to db. The order of every addition is fixed, so the result has the same bits
// whichever order the blocks ran in (float atomics would add in the order they land). One
// kernel, no allocation, replayable in a CUDA graph.
//
// Scratch layout (bytes from `scratch`): kCounterBytes of per-tile counters (zero between
// launches: the last block of a tile resets its counter), then partial[slice][channel]
// as f32, `width` channels per slice.
constexpr int kScratchChannels = 1024;  // channels per launch (a column slice of the tensor)
constexpr int kMaxTiles = 64;           // >= kScratchChannels / 32, the most tiles a launch has
constexpr std::size_t kCounterBytes = kMaxTiles * sizeof(unsigned int);

// Row slices of a launch: about two blocks per SM in all, enough loads in flight to stream
// the tensor. The scratch holds partials for at most this many.
std::int64_t max_slices() { return 2 * static_cast<std::int64_t>(sm_count()); }

// Thread mapping. U = width / N vector columns (N channels each). The block is
// (bx, by) = (bx, 256 / bx) with bx a power of two >= min(U, 32): thread (tx, ty) owns
// vector column u = blockIdx.y * bx + tx and rows ty, ty + by, ... of the block's slice
// (blockIdx.x; the slices interleave with stride gridDim.x * by). Consecutive threads of
// a warp read consecutive vectors of one row, then of the next rows: coalesced.
//
// Each thread keeps N running sums in registers. The 32 / bx threads of a warp that own
// the same column (lanes tx, tx + bx, ...) are combined with shuffles, the 8 warps through
// shared memory in warp order.
//
// `ld` is the row length in vectors (channels / N) and `width` the number of channels this
// launch covers (a slice of at most kScratchChannels columns; all of them for the MNIST
// model's layers).
template <class T, int N>
__global__ void bias_act_backward_kernel(const T* y, const T* dy, T* dz, T* db, unsigned char* scratch,
                                         std::int64_t rows, std::int64_t ld, std::int64_t width, bool relu) {
  __shared__ float partial[kBlock / kWarp][kWarp * N];  // [warp][tx * N + k]; later [part][column]
  __shared__ bool last;
  unsigned int* counters = reinterpret_cast<unsigned int*>(scratch);
  float* slices = reinterpret_cast<float*>(scratch + kCounterBytes);  // [slice][channel]
  const int bx = blockDim.x, tx = threadIdx.x, ty = threadIdx.y;
  const int tid = ty * bx + tx, lane = tid % kWarp, warp = tid / kWarp;
  const std::int64_t u = static_cast<std::int64_t>(blockIdx.y) * bx + tx;
  const std::int64_t width_vec = width / N;
  const bool active = u < width_vec;

  float acc[N];
#pragma unroll
  for (int k = 0; k < N; ++k) acc[k] = 0.0f;
  if (active) {
    const std::int64_t row_stride = static_cast<std::int64_t>(gridDim.x) * blockDim.y;
    for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * blockDim.y + ty; r < rows; r += row_stride) {
      const std::int64_t at = (r * ld + u) * N;  // element offset of this vector
      Vec<T, N> g = load_vec<T, N>(dy + at);
      if (relu) {
        const Vec<T, N> out = load_vec<T, N>(y + at);
#pragma unroll
        for (int k = 0; k < N; ++k)  // ReLU passes the gradient where the output was positive
          if (!(to_f32(out.v[k]) > 0.0f)) g.v[k] = from_f32<T>(0.0f);
      }
      store_vec<T, N>(dz + at, g);  // dz may be dy itself: this thread read it just above
#pragma unroll
      for (int k = 0; k < N; ++k) acc[k] += to_f32(g.v[k]);
    }
  }
  // Lanes tx, tx + bx, tx + 2 bx, ... of a warp own the same column: fold them together.
  for (int offset = bx; offset < kWarp; offset *= 2)
#pragma unroll
    for (int k = 0; k < N; ++k) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], offset);
  if (lane < bx)
#pragma unroll
    for (int k = 0; k < N; ++k) partial[warp][lane * N + k] = acc[k];
  __syncthreads();

  // Threads 0 .. cols - 1 each write one channel's partial: the sum over the block's warps.
  const int warps = (bx * blockDim.y) / kWarp, cols = bx * N;
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.y) * cols + tid;  // channel within the slice
  if (tid < cols && c < width) {
    float s = 0.0f;
    for (int w = 0; w < warps; ++w) s += partial[w][tid];
    slices[blockIdx.x * width + c] = s;
  }

  // Last-block-done: each writer's fence orders its partial before the block's count, so
  // the block that counts last sees every slice's partial. The last block is the one whose
  // count completes the tile, whatever its index.
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(&counters[blockIdx.y], 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // The tile's `cols` channels x gridDim.x slices: thread (part, col) adds slices part,
  // part + parts, ... of channel col, then the parts are added in order.
  const int parts = (bx * blockDim.y) / cols, col = tid % cols, part = tid / cols;
  const std::int64_t ch = static_cast<std::int64_t>(blockIdx.y) * cols + col;
  float* sums = &partial[0][0];  // [part][col]: parts * cols = 256 <= its 256 * N floats
  if (part < parts) {
    float s = 0.0f;
    if (ch < width)
      for (unsigned sl = part; sl < gridDim.x; sl += parts) s += slices[sl * width + ch];
    sums[part * cols + col] = s;
  }
  __syncthreads();
  if (part == 0 && ch < width) {
    float total = 0.0f;
    for (int p = 0; p < parts; ++p) total += sums[p * cols + col];
    db[ch] = from_f32<T>(to_f32(db[ch]) + total);  // f16: rounded once, after an f32 sum
  }
  if (tid == 0) counters[blockIdx.y] = 0;
}

// Launches one column slice (at most kScratchChannels channels, starting at channel c0)
// with N-wide vectors.
template <class T, int N>
void bias_act_backward_slice(const T* y, const T* dy, T* dz, T* db, void* scratch, std::int64_t rows,
                             std::int64_t channels, std::int64_t c0, std::int64_t width, bool relu,
                             cudaStream_t stream) {
  const std::int64_t width_vec = width / N;
  int bx = 1;
  while (bx < kWarp && bx < width_vec) bx *= 2;
  const int by = kBlock / bx;
  const std::int64_t tiles = (width_vec + bx - 1) / bx;  // <= kScratchChannels / 32 <= kMaxTiles
  const std::int64_t target = std::max<std::int64_t>(1, max_slices() / tiles);
  const std::int64_t slices = std::clamp<std::int64_t>((rows + by - 1) / by, 1, target);
  const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(tiles));
  const dim3 block(static_cast<unsigned>(bx), static_cast<unsigned>(by));
  bias_act_backward_kernel<T, N><<<grid, block, 0, stream>>>(y + c0, dy + c0, dz + c0, db + c0,
                                                            static_cast<unsigned char*>(scratch), rows, channels / N,
                                                            width, relu);
  MF_CHECK_LAUNCH();
}

// Splits the channels into slices of at most kScratchChannels (one slice for every layer
// of the MNIST model; the scratch bounds a slice, and it keeps grid.y small) and picks
// N-wide vectors when the channel count and all three pointers allow it, else 1. The
// slices run one after another on the stream, so they share the scratch.
template <class T, int N>
void bias_act_backward(const T* y, const T* dy, T* dz, T* db, void* scratch, std::int64_t rows,
                       std::int64_t channels, bool relu, cudaStream_t stream) {
  const bool vec = channels % N == 0 && aligned(y, 16) && aligned(dy, 16) && aligned(dz, 16);
  for (std::int64_t c0 = 0; c0 < channels; c0 += kScratchChannels) {
    const std::int64_t width = std::min<std::int64_t>(kScratchChannels, channels - c0);
    if (vec)  // c0 is a multiple of kScratchChannels, so the slices stay 16-byte aligned
      bias_act_backward_slice<T, N>(y, dy, dz, db, scratch, rows, channels, c0, width, relu, stream);
    else
      bias_act_backward_slice<T, 1>(y, dy, dz, db, scratch, rows, channels, c0, width, relu, stream);
  }
}

}  // namespace

void launch_bias_act_forward(void* y, const void* bias, bool half, std::int64_t n, std::int64_t channels, bool relu,
                             GpuStream stream) {
  if (n <= 0 || channels <= 0) return;
  if (half) {
    auto* yh = static_cast<__half*>(y);
    const auto* bh = static_cast<const __half*>(bias);
    if (channels % 8 == 0 && n % 8 == 0 && aligned(y, 16))
      bias_act_forward<__half, 8>(yh, bh, n, channels, relu, stream);
    else
      bias_act_forward<__half, 1>(yh, bh, n, channels, relu, stream);
  } else {
    auto* yf = static_cast<float*>(y);
    const auto* bf = static_cast<const float*>(bias);
    if (channels % 4 == 0 && n % 4 == 0 && aligned(y, 16))
      bias_act_forward<float, 4>(yf, bf, n, channels, relu, stream);
    else
      bias_act_forward<float, 1>(yf, bf, n, channels, relu, stream);
  }
}

std::size_t bias_act_backward_scratch_bytes() {
  return kCounterBytes + static_cast<std::size_t>(max_slices()) * kScratchChannels * sizeof(float);
}

std::size_t reduction_scratch_bytes() {
  return std::max(bias_act_backward_scratch_bytes(), softmax_xent_scratch_bytes());
}

void launch_bias_act_backward(const void* y, const void* dy, void* dz, void* db, void* scratch, bool half,
                              std::int64_t rows, std::int64_t channels, bool relu, GpuStream stream) {
  if (rows <= 0 || channels <= 0) return;
  if (!relu) y = dy;  // not read; any valid pointer keeps the alignment test simple
  if (half)
    bias_act_backward<__half, 8>(static_cast<const __half*>(y), static_cast<const __half*>(dy),
                                 static_cast<__half*>(dz), static_cast<__half*>(db), scratch, rows, channels, relu,
                                 stream);
  else
    bias_act_backward<float, 4>(static_cast<const float*>(y), static_cast<const float*>(dy),
                                static_cast<float*>(dz), static_cast<float*>(db), scratch, rows, channels, relu,
                                stream);
}

}  // namespace mf
