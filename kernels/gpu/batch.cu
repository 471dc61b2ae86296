// batch.cu: building a training batch on the GPU from the u8 dataset kept in device memory:
// gather the shuffled samples, scale pixels to [0, 1], widen labels to i32.
//
// The batch's position in the epoch's permutation is a cursor in device memory, read by
// the gather kernel and advanced by a one-thread kernel, so a captured step graph replays
// batch after batch with no host argument changing.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "runtime/cuda_check.h"
#include "runtime/kernel_util.cuh"
#include "kernels/gpu/launchers.h"

namespace mf {

namespace {

using namespace gpu;

// p / 255 rounded once to the nearest float (IEEE division: nvcc's default -prec-div=true,
// made explicit), so every value equals the host's float(p) / 255.0f and Keras's
// x.astype("float32") / 255: 255 -> 1.0f exactly. f16 storage rounds that float to half.
__device__ __forceinline__ float pixel(std::uint8_t p) { return __fdiv_rn(static_cast<float>(p), 255.0f); }
__device__ __forceinline__ void put(float* x, std::int64_t i, float v) { x[i] = v; }
__device__ __forceinline__ void put(__half* x, std::int64_t i, float v) { x[i] = __float2half_rn(v); }

// Thread mapping: the batch is batch x sample pixels; thread t handles groups of N = 4
// pixels t, t + stride, ... (one 4-byte load of u8, four stores), or N = 1 when the sample
// size or a pointer does not allow 4. Group i is pixels i*N .. i*N+N-1 of the flat batch,
// i.e. sample b = i*N / sample; with sample % N == 0 a group never crosses two samples.
// Source sample of b: perm[*offset + b], or b itself when perm is null (normalize_batch).
// Threads 0 .. batch-1 also copy the labels. Nothing is range-checked on the device: the
// caller keeps *offset + batch within the permutation and its entries within the dataset.
template <class T, int N>
__global__ void gather_batch_kernel(const std::uint8_t* __restrict__ images, const std::uint8_t* __restrict__ labels,
                                    const std::int32_t* __restrict__ perm, const std::int64_t* __restrict__ offset,
                                    std::int64_t batch, std::int64_t sample, T* __restrict__ x,
                                    std::int32_t* __restrict__ labels_out) {
  const std::int64_t first = perm ? *offset : 0;  // same value for every thread: one cached load
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t tid = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t groups = batch * sample / N;
  for (std::int64_t i = tid; i < groups; i += stride) {
    const std::int64_t b = i * N / sample, p = i * N - b * sample;
    const std::int64_t src = perm ? static_cast<std::int64_t>(perm[first + b]) : b;
    const std::uint8_t* in = images + src * sample + p;
    if constexpr (N == 4) {
      const uchar4 q = *reinterpret_cast<const uchar4*>(in);
      if constexpr (sizeof(T) == 4) {
        reinterpret_cast<float4*>(x)[i] = make_float4(pixel(q.x), pixel(q.y), pixel(q.z), pixel(q.w));
      } else {
        reinterpret_cast<__half2*>(x)[2 * i] = __floats2half2_rn(pixel(q.x), pixel(q.y));
        reinterpret_cast<__half2*>(x)[2 * i + 1] = __floats2half2_rn(pixel(q.z), pixel(q.w));
      }
    } else {
      put(x, i, pixel(*in));
    }
  }
  if (labels && labels_out)
    for (std::int64_t b = tid; b < batch; b += stride) labels_out[b] = labels[perm ? perm[first + b] : b];
}

template <class T>
void gather(const std::uint8_t* images, const std::uint8_t* labels, const std::int32_t* perm,
            const std::int64_t* offset, std::int64_t batch, std::int64_t sample, void* x, std::int32_t* labels_out,
            cudaStream_t stream) {
  // Four pixels at a time needs whole groups per sample and aligned rows on both sides.
  const bool vec = sample % 4 == 0 && aligned(images, 4) && aligned(x, 4 * sizeof(T));
  const std::int64_t work = std::max(vec ? batch * sample / 4 : batch * sample, batch);
  const int blocks = blocks_for(work);
  if (vec)
    gather_batch_kernel<T, 4><<<blocks, kBlock, 0, stream>>>(images, labels, perm, offset, batch, sample,
                                                             static_cast<T*>(x), labels_out);
  else
    gather_batch_kernel<T, 1><<<blocks, kBlock, 0, stream>>>(images, labels, perm, offset, batch, sample,
                                                             static_cast<T*>(x), labels_out);
  MF_CHECK_LAUNCH();
}

// One thread: *offset += batch, after the step that used the cursor.
__global__ void advance_cursor_kernel(std::int64_t* offset, std::int64_t batch) { *offset += batch; }

}  // namespace

void launch_gather_batch(const std::uint8_t* images, const std::uint8_t* labels, const std::int32_t* perm,
                         const std::int64_t* offset, std::int64_t batch, std::int64_t sample, void* x, bool half,
                         std::int32_t* labels_out, GpuStream stream) {
  if (batch <= 0 || sample < 0) return;
  if (half) gather<__half>(images, labels, perm, offset, batch, sample, x, labels_out, stream);
  else gather<float>(images, labels, perm, offset, batch, sample, x, labels_out, stream);
}

void launch_advance_cursor(std::int64_t* offset, std::int64_t batch, GpuStream stream) {
  if (batch == 0) return;
  advance_cursor_kernel<<<1, 1, 0, stream>>>(offset, batch);
  MF_CHECK_LAUNCH();
}

void launch_normalize_batch(const std::uint8_t* images, const std::uint8_t* labels, std::int64_t batch,
                            std::int64_t sample, void* x, bool half, std::int32_t* labels_out, GpuStream stream) {
  if (batch <= 0 || sample < 0) return;
  // The gather with no permutation: sample b comes from position b.
  if (half) gather<__half>(images, labels, nullptr, nullptr, batch, sample, x, labels_out, stream);
  else gather<float>(images, labels, nullptr, nullptr, batch, sample, x, labels_out, stream);
}

}  // namespace mf
