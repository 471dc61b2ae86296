// softmax_xent.cu: softmax + cross-entropy + accuracy in one kernel, with the gradient of
// the loss with respect to the logits.
//
// For a row z of K logits and its label y:
//   m = max z,  s = sum_j exp(z_j - m),  loss = log s - (z_y - m)     (log-sum-exp: no overflow)
//   dz_j = (exp(z_j - m) / s - [j == y]) * grad_scale * loss_scale
// Arithmetic in f32 whatever the storage; the host reference (layers/softmax_xent.cpp) sums
// in double, which the tests allow for.
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "runtime/cuda_check.h"
#include "runtime/kernel_util.cuh"
#include "kernels/gpu/launchers.h"

namespace mf {

namespace {

using namespace gpu;

constexpr int kWarp = 32;
constexpr int kRowBlock = 128;  // 4 warps, 4 rows at a time
constexpr std::int64_t kMaxRowBlocks = 1024;

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// One warp per row (MNIST has K = 10, so lanes 10..31 idle: the whole batch is a few
// thousand values and the kernel is bound by its launch, not its arithmetic). Lane l
// handles logits l, l + 32, ... of the row; the max, its first index and the sum of
// exponentials are combined across the warp with shuffles, which need no shared memory
// and no __syncthreads. Rows are spread over warps with a grid-stride loop. Each warp
// keeps its running loss and hit count in lane 0; the block adds its warps' in order and
// writes them to the scratch, and the last block to finish adds the blocks' in block order
// to stats: the same bits whatever order the blocks ran in.
//
// Scratch: one counter (zero between launches) in the counters' 256 bytes that every
// reduction's scratch begins with (launchers.h), then [loss, correct] per block as f32.
constexpr std::size_t kPartialsOffset = 256;
template <class T>
__global__ void softmax_xent_kernel(const T* __restrict__ logits, const std::int32_t* __restrict__ labels,
                                    std::int64_t n, std::int64_t k, T* __restrict__ dlogits, float grad_scale,
                                    const float* __restrict__ scale, float* stats, unsigned char* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  // The dynamic loss scale is read on the device, so a replayed graph sees its current value.
  const float g = grad_scale * (scale ? *scale : 1.0f);
  float loss = 0.0f, correct = 0.0f;
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * warps + warp; row < n;
       row += static_cast<std::int64_t>(gridDim.x) * warps) {
    const T* z = logits + row * k;
    // Max and the first index holding it. Within a lane the indices rise, so a strict '>'
    // keeps the first; across lanes equal maxima go to the smaller index. INT_MAX stands
    // for "none yet" (a row of NaN or -inf only): it then counts as class 0, like the host.
    float m = -INFINITY;
    int arg = INT_MAX;
    for (int j = lane; j < k; j += kWarp) {
      const float v = to_f32(z[j]);
      if (v > m) m = v, arg = j;
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const float om = __shfl_xor_sync(0xffffffffu, m, offset);
      const int oarg = __shfl_xor_sync(0xffffffffu, arg, offset);
      if (om > m || (om == m && oarg < arg)) m = om, arg = oarg;
    }
    if (arg == INT_MAX) arg = 0;

    float s = 0.0f;
    for (int j = lane; j < k; j += kWarp) s += expf(to_f32(z[j]) - m);
    s = warp_sum(s);

    const std::int32_t label = labels[row];
    const bool valid = label >= 0 && label < k;
    if (lane == 0) {
      // A label outside [0, K) cannot throw here; it makes the loss NaN, which the host
      // sees in the statistics (the CPU path throws instead).
      loss += valid ? logf(s) - (to_f32(z[label]) - m) : NAN;
      correct += arg == label ? 1.0f : 0.0f;
    }
    if (dlogits) {
      T* dz = dlogits + row * k;
      const float inv_s = 1.0f / s;
      for (int j = lane; j < k; j += kWarp) {
        const float p = expf(to_f32(z[j]) - m) * inv_s;
        dz[j] = from_f32<T>((p - (j == label ? 1.0f : 0.0f)) * g);
      }
    }
  }

  __shared__ float block_loss[kRowBlock / kWarp], block_correct[kRowBlock / kWarp];
  __shared__ bool last;
  unsigned int* counter = reinterpret_cast<unsigned int*>(scratch);
  float* partials = reinterpret_cast<float*>(scratch + kPartialsOffset);  // [block][2]
  if (lane == 0) block_loss[warp] = loss, block_correct[warp] = correct;
  __syncthreads();
  if (threadIdx.x == 0) {
    float l = 0.0f, c = 0.0f;
    for (int w = 0; w < warps; ++w) l += block_loss[w], c += block_correct[w];
    partials[2 * blockIdx.x] = l;
    partials[2 * blockIdx.x + 1] = c;
    __threadfence();  // the partials before the count
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // Thread t adds blocks t, t + 128, ...; thread 0 then adds the threads' sums in order.
  float l = 0.0f, c = 0.0f;
  for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x) l += partials[2 * b], c += partials[2 * b + 1];
  __shared__ float thread_loss[kRowBlock], thread_correct[kRowBlock];
  thread_loss[threadIdx.x] = l, thread_correct[threadIdx.x] = c;
  __syncthreads();
  if (threadIdx.x == 0) {
    float tl = 0.0f, tc = 0.0f;
    for (unsigned t = 0; t < blockDim.x; ++t) tl += thread_loss[t], tc += thread_correct[t];
    stats[0] += tl;
    stats[1] += tc;
    stats[2] += static_cast<float>(n);
    *counter = 0;
  }
}

}  // namespace

std::size_t softmax_xent_scratch_bytes() { return kPartialsOffset + 2 * kMaxRowBlocks * sizeof(float); }

void launch_softmax_xent(const void* logits, bool half, const std::int32_t* labels, std::int64_t n, std::int64_t k,
                         void* dlogits, float grad_scale, const float* scale, float* stats, void* scratch,
                         GpuStream stream) {
  if (n <= 0 || k <= 0) return;
  const int rows_per_block = kRowBlock / kWarp;
  const int blocks =
      static_cast<int>(std::clamp<std::int64_t>((n + rows_per_block - 1) / rows_per_block, 1, kMaxRowBlocks));
  auto* sc = static_cast<unsigned char*>(scratch);
  if (half)
    softmax_xent_kernel<__half><<<blocks, kRowBlock, 0, stream>>>(static_cast<const __half*>(logits), labels, n, k,
                                                               static_cast<__half*>(dlogits), grad_scale, scale, stats,
                                                               sc);
  else
    softmax_xent_kernel<float><<<blocks, kRowBlock, 0, stream>>>(static_cast<const float*>(logits), labels, n, k,
                                                              static_cast<float*>(dlogits), grad_scale, scale, stats,
                                                              sc);
  MF_CHECK_LAUNCH();
}

}  // namespace mf
