// fused_conv_common.cuh: what the fused convolution's two files share (fused_conv.cu, the
// forward; fused_conv_grad.cu, the gradients): the kernels' inputs, the sizes they derive,
// and the checks every launcher makes. For those two files only.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/gpu/fused.h"
#include "runtime/kernel_util.cuh"

namespace mf::fused_detail {

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

__host__ __device__ __forceinline__ i64 pooled_h(const FusedConvSizes& g) { return (g.h - kK + 1) / 2; }
__host__ __device__ __forceinline__ i64 pooled_w(const FusedConvSizes& g) { return (g.w - kK + 1) / 2; }
// A weight gradient's partial sums (one per chunk of kChunkImages images) and its
// parameters: the kernel's (filters, 3, 3, c), then the biases.
__host__ __device__ __forceinline__ i64 chunks_of(const FusedConvSizes& g) {
  return (g.n + kChunkImages - 1) / kChunkImages;
}
__host__ __device__ __forceinline__ i64 params_of(const FusedConvSizes& g) {
  return g.filters * kK * kK * g.c + g.filters;
}

constexpr int kLanes = 32;  // a warp: the forward's tile of filters

// dz at pooled output o: dpool where the pooled value is positive (ReLU passed it), else 0.
template <class T>
__device__ __forceinline__ float pooled_grad(const T* dpool, const T* pooled, i64 o) {
  return to_f32(pooled[o]) > 0.0f ? to_f32(dpool[o]) : 0.0f;
}

// A pooling window's four convolution outputs z[q] (bias added) through ReLU and 2x2 max
// pooling, as both forward kernels store them: each rounded to the storage type before the
// comparison, the first of equal values winning, the first NaN over any number. Writes the
// pooled value and the winning position q (one byte) to pooled[o] and winners[o].
template <class T>
__device__ __forceinline__ void pool_window(const float z[4], T* pooled, std::uint8_t* winners, i64 o) {
  float best = 0.0f;
  int arg = 0;
  for (int q = 0; q < 4; ++q) {
    const float v = to_f32(from_f32<T>(z[q] < 0.0f ? 0.0f : z[q]));  // ReLU; NaN passes
    if (q == 0 || v > best || (v != v && best == best)) best = v, arg = q;
  }
  pooled[o] = from_f32<T>(best);
  winners[o] = static_cast<std::uint8_t>(arg);
}

inline i64 filter_tiles(const FusedConvSizes& g) { return (g.filters + kLanes - 1) / kLanes; }

inline void check_sizes(const FusedConvSizes& g) {
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

template <class T>
inline Activations<T> activations(const FusedConvSizes& g, const void* x) {
  return Activations<T>{static_cast<const T*>(x), g.h * g.w * g.c};
}

inline DatasetPixels pixels(const FusedConvSizes& g, const FusedBatch& batch, std::int32_t* labels_out) {
  return DatasetPixels{batch.images, batch.labels, batch.perm, batch.offset, labels_out, g.h * g.w * g.c};
}

// The second convolution's forward on Tensor Cores (fused_conv_tc.cu), for the sizes and
// weights fused_conv_takes_tensor_cores() (fused.h) accepts.
void conv_forward_tensor_cores(const FusedConvSizes& g, const void* x, const void* w, const void* b, void* pooled,
                               std::uint8_t* winners, bool half, cudaStream_t stream);

}  // namespace mf::fused_detail
