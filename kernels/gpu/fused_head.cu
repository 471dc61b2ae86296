// fused_head.cu: the model's head in two kernels (fused.h): dense + ReLU, dense_1, softmax
// cross-entropy, forward and backward.
//
// For sample s, with z1 = x W1 + b1, a1 = relu(z1), z2 = a1 W2 + b2 (the logits):
//   dz2 = (softmax(z2) - onehot) * grad_scale * loss_scale          (dlogits)
//   dz1 = (W2 dz2) where z1 > 0, else 0                              (behind the ReLU)
//   dx  = W1 dz1                                                      (to the pooling)
//   dW1 += x^T dz1, db1 += dz1, dW2 += a1^T dz2, db2 += dz2           (summed over s)
// The first four lines need only sample s, so kernel 1 gives each sample a block and keeps
// z1, dz1 and the logits in shared memory: the library rung's GEMMs write each of them to
// global memory and read it back in the next kernel. The sums over s need every sample, so
// they wait for kernel 2.
#include <cuda_fp16.h>

#include <climits>
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

constexpr int kHeadThreads = 128;

__device__ __forceinline__ float relu(float z) { return z < 0.0f ? 0.0f : z; }  // NaN passes, as elsewhere

// ---- kernel 1: one block per sample ----
template <class T>
__global__ void head_sample_kernel(FusedHeadSizes g, const T* __restrict__ x, const T* __restrict__ w1,
                                   const T* __restrict__ b1, const T* __restrict__ w2, const T* __restrict__ b2,
                                   const std::int32_t* __restrict__ labels, float grad_scale,
                                   const float* __restrict__ scale, T* a1, T* dz1_out, T* dz2_out,
                                   float* row_stats, T* dx) {
  __shared__ float z1[kFusedHeadMaxHidden], dz1[kFusedHeadMaxHidden];
  __shared__ float logits[kFusedHeadMaxClasses], dlogits[kFusedHeadMaxClasses];
  const float gs = grad_scale * (scale ? *scale : 1.0f);  // read on the device: a replayed graph sees it
  const int t = threadIdx.x;
  for (i64 s = blockIdx.x; s < g.n; s += gridDim.x) {
    // dense: thread u sums its unit over the input; the warp reads x[s, i] once (broadcast)
    // and 32 neighbouring weights of row i (one transaction).
    const T* xs = x + s * g.in;
    for (i64 u = t; u < g.hidden; u += blockDim.x) {
      float acc = to_f32(b1[u]);
      for (i64 i = 0; i < g.in; ++i) acc += to_f32(xs[i]) * to_f32(w1[i * g.hidden + u]);
      z1[u] = acc;
      a1[s * g.hidden + u] = from_f32<T>(relu(acc));
    }
    __syncthreads();
    // dense_1: one thread per class.
    for (i64 k = t; k < g.classes; k += blockDim.x) {
      float acc = to_f32(b2[k]);
      for (i64 u = 0; u < g.hidden; ++u) acc += relu(z1[u]) * to_f32(w2[u * g.classes + k]);
      logits[k] = acc;
    }
    __syncthreads();
    // The loss of the sample, by one thread: log-sum-exp from the largest logit, and the
    // first class holding it for the accuracy (a row of NaN counts as class 0, as in
    // softmax_xent.cu).
    if (t == 0) {
      float m = -INFINITY;
      int arg = INT_MAX;
      for (int k = 0; k < g.classes; ++k)
        if (logits[k] > m) m = logits[k], arg = k;
      if (arg == INT_MAX) arg = 0;
      float sum = 0.0f;
      for (int k = 0; k < g.classes; ++k) sum += expf(logits[k] - m);
      const std::int32_t label = labels[s];
      const bool valid = label >= 0 && label < g.classes;
      row_stats[2 * s] = valid ? logf(sum) - (logits[label] - m) : NAN;
      row_stats[2 * s + 1] = arg == label ? 1.0f : 0.0f;
      for (int k = 0; k < g.classes; ++k) dlogits[k] = (expf(logits[k] - m) / sum - (k == label ? 1.0f : 0.0f)) * gs;
    }
    __syncthreads();
    for (i64 k = t; k < g.classes; k += blockDim.x) dz2_out[s * g.classes + k] = from_f32<T>(dlogits[k]);
    // Back through dense_1 and the ReLU.
    for (i64 u = t; u < g.hidden; u += blockDim.x) {
      float d = 0.0f;
      for (i64 k = 0; k < g.classes; ++k) d += to_f32(w2[u * g.classes + k]) * dlogits[k];
      dz1[u] = z1[u] > 0.0f ? d : 0.0f;
      dz1_out[s * g.hidden + u] = from_f32<T>(dz1[u]);
    }
    __syncthreads();
    // Back through dense: thread i reads row i of W1 (hidden contiguous values, in L2: W1 is
    // 400 KB in FP32).
    if (dx)
      for (i64 i = t; i < g.in; i += blockDim.x) {
        float d = 0.0f;
        for (i64 u = 0; u < g.hidden; ++u) d += to_f32(w1[i * g.hidden + u]) * dz1[u];
        dx[s * g.in + i] = from_f32<T>(d);
      }
    __syncthreads();  // the next sample overwrites the shared arrays
  }
}

// ---- kernel 2: one thread per parameter, sums over the batch in sample order ----
// Elements, in order: dW1 (in x hidden), db1, dW2 (hidden x classes), db2, and one more
// for the statistics. Neighbouring threads take neighbouring units u of one input i: a warp
// reads x[s, i] once and 32 consecutive dz1[s, u].
template <class T>
__global__ void head_params_kernel(FusedHeadSizes g, const T* __restrict__ x, const T* __restrict__ a1,
                                   const T* __restrict__ dz1, const T* __restrict__ dz2,
                                   const float* __restrict__ row_stats, T* dw1, T* db1, T* dw2, T* db2,
                                   float* stats) {
  const i64 n_w1 = g.in * g.hidden, n_w2 = g.hidden * g.classes;
  const i64 total = n_w1 + g.hidden + n_w2 + g.classes + 1;
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 e = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    float acc = 0.0f;
    if (e < n_w1) {
      const i64 i = e / g.hidden, u = e % g.hidden;
      for (i64 s = 0; s < g.n; ++s) acc += to_f32(x[s * g.in + i]) * to_f32(dz1[s * g.hidden + u]);
      dw1[e] = from_f32<T>(to_f32(dw1[e]) + acc);
    } else if (e < n_w1 + g.hidden) {
      const i64 u = e - n_w1;
      for (i64 s = 0; s < g.n; ++s) acc += to_f32(dz1[s * g.hidden + u]);
      db1[u] = from_f32<T>(to_f32(db1[u]) + acc);
    } else if (e < n_w1 + g.hidden + n_w2) {
      const i64 j = e - n_w1 - g.hidden, u = j / g.classes, k = j % g.classes;
      for (i64 s = 0; s < g.n; ++s) acc += to_f32(a1[s * g.hidden + u]) * to_f32(dz2[s * g.classes + k]);
      dw2[j] = from_f32<T>(to_f32(dw2[j]) + acc);
    } else if (e < total - 1) {
      const i64 k = e - n_w1 - g.hidden - n_w2;
      for (i64 s = 0; s < g.n; ++s) acc += to_f32(dz2[s * g.classes + k]);
      db2[k] = from_f32<T>(to_f32(db2[k]) + acc);
    } else {
      float loss = 0.0f, correct = 0.0f;
      for (i64 s = 0; s < g.n; ++s) loss += row_stats[2 * s], correct += row_stats[2 * s + 1];
      stats[0] += loss;
      stats[1] += correct;
      stats[2] += static_cast<float>(g.n);
    }
  }
}

std::size_t round_up(std::size_t v) { return (v + 255) / 256 * 256; }

template <class T>
void run_head(const FusedHeadSizes& g, const void* x, const void* w1, const void* b1, const void* w2, const void* b2,
              const std::int32_t* labels, float grad_scale, const float* scale, const FusedHeadScratch& sc, void* dx,
              void* dw1, void* db1, void* dw2, void* db2, float* stats, cudaStream_t st) {
  const auto c = [](const void* p) { return static_cast<const T*>(p); };
  const auto m = [](void* p) { return static_cast<T*>(p); };
  const int blocks = static_cast<int>(g.n < kMaxBlocks ? g.n : kMaxBlocks);
  head_sample_kernel<T><<<blocks, kHeadThreads, 0, st>>>(g, c(x), c(w1), c(b1), c(w2), c(b2), labels, grad_scale,
                                                         scale, m(sc.a1), m(sc.dz1), m(sc.dz2), sc.row_stats, m(dx));
  MF_CHECK_LAUNCH();
  const i64 params = g.in * g.hidden + g.hidden + g.hidden * g.classes + g.classes + 1;
  head_params_kernel<T><<<blocks_for(params), kBlock, 0, st>>>(g, c(x), c(sc.a1), c(sc.dz1), c(sc.dz2),
                                                              sc.row_stats, m(dw1), m(db1), m(dw2), m(db2), stats);
  MF_CHECK_LAUNCH();
}

}  // namespace

std::size_t fused_head_scratch_bytes(const FusedHeadSizes& g, bool half) {
  const std::size_t t = half ? 2 : 4, n = static_cast<std::size_t>(g.n);
  return 2 * round_up(n * g.hidden * t) + round_up(n * g.classes * t) + round_up(n * 2 * sizeof(float));
}

FusedHeadScratch fused_head_scratch(void* bytes, const FusedHeadSizes& g, bool half) {
  const std::size_t t = half ? 2 : 4, n = static_cast<std::size_t>(g.n);
  auto* p = static_cast<unsigned char*>(bytes);
  FusedHeadScratch s;
  s.a1 = p;
  s.dz1 = p += round_up(n * g.hidden * t);
  s.dz2 = p += round_up(n * g.hidden * t);
  s.row_stats = reinterpret_cast<float*>(p + round_up(n * g.classes * t));
  return s;
}

void launch_fused_head(const FusedHeadSizes& g, const void* x, const void* w1, const void* b1, const void* w2,
                       const void* b2, const std::int32_t* labels, float grad_scale, const float* scale,
                       const FusedHeadScratch& scratch, void* dx, void* dw1, void* db1, void* dw2, void* db2,
                       float* stats, bool half, GpuStream stream) {
  if (g.hidden < 1 || g.hidden > kFusedHeadMaxHidden || g.classes < 1 || g.classes > kFusedHeadMaxClasses ||
      g.in < 1)
    throw std::invalid_argument("fused head: " + std::to_string(g.in) + " -> " + std::to_string(g.hidden) + " -> " +
                                std::to_string(g.classes) + " is outside what it holds (at most " +
                                std::to_string(kFusedHeadMaxHidden) + " hidden units and " +
                                std::to_string(kFusedHeadMaxClasses) + " classes)");
  if (g.n == 0) return;
  if (half) run_head<__half>(g, x, w1, b1, w2, b2, labels, grad_scale, scale, scratch, dx, dw1, db1, dw2, db2, stats, stream);
  else run_head<float>(g, x, w1, b1, w2, b2, labels, grad_scale, scale, scratch, dx, dw1, db1, dw2, db2, stats, stream);
}

}  // namespace mf
