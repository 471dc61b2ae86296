// optimizer.cu: fused optimizer updates (Adam, SGD with momentum), FP32 and mixed precision
// with a dynamic loss scale, each one launch over the model's flat parameter buffer.
//
// Everything a step needs that changes from step to step (the step count t, the loss scale,
// whether this step found an inf) lives in device memory and is read by the kernels, and
// the small "finish" kernels update it; so the whole update can be captured once into a CUDA
// graph and replayed, with no host read and no host argument changing.
//
// The update kernels are pure streaming: each parameter is touched by one thread, in
// groups of four (16-byte float4 accesses) when every pointer is 16-byte aligned (the
// parameter pack's buffers are), in a grid-stride loop, and the last n % 4 one by one.
// At 122k parameters FP32 Adam moves 32 bytes per parameter (read w, g, m, v; write all
// four): ~4 MB, a couple of microseconds.
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

struct AdamHyper {
  float lr, beta1, beta2, eps;
};

// lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t), in double and in the same order as the CPU
// Adam (optim/adam.cpp), then rounded to float: both give the same float (pow may differ
// from the host's in the last bits of the double, far below a float's resolution).
__device__ float adam_lr_t(const AdamHyper& h, double t) {
  return static_cast<float>(static_cast<double>(h.lr) * sqrt(1.0 - pow(static_cast<double>(h.beta2), t)) /
                            (1.0 - pow(static_cast<double>(h.beta1), t)));
}

// One parameter, in f32 and in the CPU loop's order of operations. (nvcc may fuse a
// multiply and an add into one FMA where the host compiler does not, or the other way
// round: the results can differ in the last bit, which the tests allow for.)
__device__ __forceinline__ void adam_update(float& w, float& m, float& v, float g, float lr_t, const AdamHyper& h) {
  m = h.beta1 * m + (1.0f - h.beta1) * g;
  v = h.beta2 * v + (1.0f - h.beta2) * g * g;
  w -= lr_t * m / (sqrtf(v) + h.eps);
}

// lr_t for t = *step + ahead, computed by every thread (two double pows: a few hundred
// cycles, once per thread, against a step of many microseconds), so that no thread waits
// for another. ahead is 1, or 0 where an earlier kernel of the step has moved the count on
// already (launch_adam_step's count_moved). t is a double: at a count of 2^31 - 1,
// *step + 1 in int32 would overflow.
__device__ __forceinline__ float step_lr_t(const AdamHyper& h, const std::int32_t* step, double ahead = 1.0) {
  return adam_lr_t(h, static_cast<double>(*step) + ahead);
}

// FP32 Adam. Thread mapping: groups of four parameters t, t + stride, ... (n_vec groups,
// 0 when a pointer is not 16-byte aligned), then the tail one per thread. Zeroes the
// gradient it consumed (the layers accumulate into it).
__global__ void adam_step_kernel(float* __restrict__ w, float* __restrict__ grad, float* __restrict__ m,
                                 float* __restrict__ v, std::int64_t n, std::int64_t n_vec, AdamHyper h,
                                 const std::int32_t* __restrict__ step, double ahead) {
  const float lr_t = step_lr_t(h, step, ahead);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t tid = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::int64_t i = tid; i < n_vec; i += stride) {
    float4 wv = reinterpret_cast<float4*>(w)[i], mv = reinterpret_cast<float4*>(m)[i];
    float4 vv = reinterpret_cast<float4*>(v)[i];
    const float4 gv = reinterpret_cast<const float4*>(grad)[i];
    adam_update(wv.x, mv.x, vv.x, gv.x, lr_t, h);
    adam_update(wv.y, mv.y, vv.y, gv.y, lr_t, h);
    adam_update(wv.z, mv.z, vv.z, gv.z, lr_t, h);
    adam_update(wv.w, mv.w, vv.w, gv.w, lr_t, h);
    reinterpret_cast<float4*>(w)[i] = wv;
    reinterpret_cast<float4*>(m)[i] = mv;
    reinterpret_cast<float4*>(v)[i] = vv;
    reinterpret_cast<float4*>(grad)[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  for (std::int64_t i = 4 * n_vec + tid; i < n; i += stride) {
    adam_update(w[i], m[i], v[i], grad[i], lr_t, h);
    grad[i] = 0.0f;
  }
}

// SGD with momentum, Keras form. Same mapping as adam_step_kernel.
__device__ __forceinline__ void sgd_update(float& w, float& vel, float g, float lr, float momentum) {
  vel = momentum * vel - lr * g;
  w += vel;
}
__global__ void sgd_step_kernel(float* __restrict__ w, float* __restrict__ grad, float* __restrict__ velocity,
                                std::int64_t n, std::int64_t n_vec, float lr, float momentum) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t tid = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::int64_t i = tid; i < n_vec; i += stride) {
    float4 wv = reinterpret_cast<float4*>(w)[i], vel = reinterpret_cast<float4*>(velocity)[i];
    const float4 gv = reinterpret_cast<const float4*>(grad)[i];
    sgd_update(wv.x, vel.x, gv.x, lr, momentum);
    sgd_update(wv.y, vel.y, gv.y, lr, momentum);
    sgd_update(wv.z, vel.z, gv.z, lr, momentum);
    sgd_update(wv.w, vel.w, gv.w, lr, momentum);
    reinterpret_cast<float4*>(w)[i] = wv;
    reinterpret_cast<float4*>(velocity)[i] = vel;
    reinterpret_cast<float4*>(grad)[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  for (std::int64_t i = 4 * n_vec + tid; i < n; i += stride) {
    sgd_update(w[i], velocity[i], grad[i], lr, momentum);
    grad[i] = 0.0f;
  }
}

// The step count moves on, and stops at 2^31 - 1 (where its int32 ends) rather than wrap to
// a negative count, which would make Adam's bias correction NaN. By then the correction has
// been 1 for a long time (beta^t underflows to 0 after some 10^5 steps).
__device__ __forceinline__ void count_step(std::int32_t* step) {
  if (*step < INT32_MAX) ++*step;
}

// One thread: the update kernels of this step are done with *step (stream order), so it
// can move on.
__global__ void finish_step_kernel(std::int32_t* step) { count_step(step); }

// ---- mixed precision ----

// A half is inf or NaN when its five exponent bits are all ones; `two` holds two halves.
__device__ __forceinline__ bool inf_or_nan2(unsigned int two) {
  return (two & 0x7c00u) == 0x7c00u || (two & 0x7c000000u) == 0x7c000000u;
}

// Each thread scans groups of eight halves (one 16-byte load) t, t + stride, ..., then the
// tail one by one, and remembers whether it saw an inf or NaN. __syncthreads_or combines a
// block's flags; one thread of a block that saw one stores found_inf = 1. A plain store is
// enough: every writer writes the same 1, and nothing reads it until the next kernel.
// Nothing is cleared here (finish_step_mixed does that), so the check of every block counts.
__global__ void unscale_check_kernel(const __half* __restrict__ g, std::int64_t n, std::int64_t n_vec,
                                     LossScaleState* scaler) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t tid = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  bool bad = false;
  for (std::int64_t i = tid; i < n_vec; i += stride) {
    const uint4 q = reinterpret_cast<const uint4*>(g)[i];
    bad |= inf_or_nan2(q.x) | inf_or_nan2(q.y) | inf_or_nan2(q.z) | inf_or_nan2(q.w);
  }
  for (std::int64_t i = 8 * n_vec + tid; i < n; i += stride) bad |= inf_or_nan2(__half_as_ushort(g[i]));
  if (__syncthreads_or(bad) && threadIdx.x == 0) scaler->found_inf = 1;
}

// Mixed-precision Adam on the FP32 masters. Every thread reads found_inf and the scale
// (written by earlier kernels of the stream, so they are settled): on an inf the whole
// grid only zeroes the f16 gradients (weights and moments stay); otherwise
// g = half_grad / scale (exact for the power-of-two scales the scaler produces), the Adam
// update, and half_w = (half) w for the next forward pass. Same mapping as
// adam_step_kernel: four parameters per group (two 8-byte f16 accesses, three float4).
__global__ void adam_step_mixed_kernel(float* __restrict__ w, __half* __restrict__ half_w,
                                       __half* __restrict__ half_grad, float* __restrict__ m, float* __restrict__ v,
                                       std::int64_t n, std::int64_t n_vec, AdamHyper h,
                                       const std::int32_t* __restrict__ step,
                                       const LossScaleState* __restrict__ scaler) {
  const bool skip = scaler->found_inf != 0;  // the same for every thread of the grid
  const float scale = scaler->scale;
  const float lr_t = step_lr_t(h, step);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t tid = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::int64_t i = tid; i < n_vec; i += stride) {
    if (!skip) {
      const uint2 gq = reinterpret_cast<const uint2*>(half_grad)[i];
      __half g[4];
      memcpy(g, &gq, sizeof gq);
      float4 wv = reinterpret_cast<float4*>(w)[i], mv = reinterpret_cast<float4*>(m)[i];
      float4 vv = reinterpret_cast<float4*>(v)[i];
      adam_update(wv.x, mv.x, vv.x, __half2float(g[0]) / scale, lr_t, h);
      adam_update(wv.y, mv.y, vv.y, __half2float(g[1]) / scale, lr_t, h);
      adam_update(wv.z, mv.z, vv.z, __half2float(g[2]) / scale, lr_t, h);
      adam_update(wv.w, mv.w, vv.w, __half2float(g[3]) / scale, lr_t, h);
      reinterpret_cast<float4*>(w)[i] = wv;
      reinterpret_cast<float4*>(m)[i] = mv;
      reinterpret_cast<float4*>(v)[i] = vv;
      const __half hw[4] = {__float2half_rn(wv.x), __float2half_rn(wv.y), __float2half_rn(wv.z),
                            __float2half_rn(wv.w)};
      uint2 hq;
      memcpy(&hq, hw, sizeof hq);
      reinterpret_cast<uint2*>(half_w)[i] = hq;
    }
    reinterpret_cast<uint2*>(half_grad)[i] = make_uint2(0u, 0u);  // +0.0 in all four halves
  }
  for (std::int64_t i = 4 * n_vec + tid; i < n; i += stride) {
    if (!skip) {
      adam_update(w[i], m[i], v[i], __half2float(half_grad[i]) / scale, lr_t, h);
      half_w[i] = __float2half_rn(w[i]);
    }
    half_grad[i] = __ushort_as_half(0);
  }
}

// One thread, after the update: the loss scaler's rule (LossScalerModel in
// optim/loss_scaler.h, PyTorch GradScaler semantics), then found_inf = 0 for the next step.
__global__ void finish_step_mixed_kernel(std::int32_t* step, LossScaleState* s, std::int32_t growth_interval,
                                         float min_scale, float max_scale) {
  if (s->found_inf) {  // skipped step: t does not advance
    s->scale = s->scale / 2 < min_scale ? min_scale : s->scale / 2;
    s->clean_steps = 0;
    ++s->skipped;
  } else {
    count_step(step);
    if (++s->clean_steps >= growth_interval) {
      s->scale = s->scale * 2 > max_scale ? max_scale : s->scale * 2;
      s->clean_steps = 0;
    }
  }
  s->found_inf = 0;
}

}  // namespace

void launch_adam_step(float* w, float* grad, float* m, float* v, std::int64_t n, float lr, float beta1, float beta2,
                      float eps, const std::int32_t* step, GpuStream stream, bool count_moved) {
  if (n <= 0) return;
  const bool vec = aligned(w, 16) && aligned(grad, 16) && aligned(m, 16) && aligned(v, 16);
  const std::int64_t n_vec = vec ? n / 4 : 0;
  adam_step_kernel<<<blocks_for(std::max(n_vec, n - 4 * n_vec)), kBlock, 0, stream>>>(
      w, grad, m, v, n, n_vec, AdamHyper{lr, beta1, beta2, eps}, step, count_moved ? 0.0 : 1.0);
  MF_CHECK_LAUNCH();
}

void launch_sgd_step(float* w, float* grad, float* velocity, std::int64_t n, float lr, float momentum,
                     GpuStream stream) {
  if (n <= 0) return;
  const bool vec = aligned(w, 16) && aligned(grad, 16) && aligned(velocity, 16);
  const std::int64_t n_vec = vec ? n / 4 : 0;
  sgd_step_kernel<<<blocks_for(std::max(n_vec, n - 4 * n_vec)), kBlock, 0, stream>>>(w, grad, velocity, n, n_vec,
                                                                                      lr, momentum);
  MF_CHECK_LAUNCH();
}

void launch_finish_step(std::int32_t* step, GpuStream stream) {
  finish_step_kernel<<<1, 1, 0, stream>>>(step);
  MF_CHECK_LAUNCH();
}

void launch_unscale_check(const Half* half_grad, std::int64_t n, LossScaleState* scaler, GpuStream stream) {
  if (n <= 0) return;
  const std::int64_t n_vec = aligned(half_grad, 16) ? n / 8 : 0;
  // A quarter of the usual cap: each thread checks many groups, and fewer blocks means
  // fewer flags to combine; 122k halves are 15k groups, 60 blocks.
  const int blocks = static_cast<int>(
      std::clamp<std::int64_t>((std::max(n_vec, n - 8 * n_vec) + kBlock - 1) / kBlock, 1, kMaxBlocks / 4));
  unscale_check_kernel<<<blocks, kBlock, 0, stream>>>(reinterpret_cast<const __half*>(half_grad), n, n_vec, scaler);
  MF_CHECK_LAUNCH();
}

void launch_adam_step_mixed(float* w, Half* half_w, Half* half_grad, float* m, float* v, std::int64_t n, float lr,
                            float beta1, float beta2, float eps, const std::int32_t* step,
                            const LossScaleState* scaler, GpuStream stream) {
  if (n <= 0) return;
  const bool vec = aligned(w, 16) && aligned(m, 16) && aligned(v, 16) && aligned(half_w, 8) && aligned(half_grad, 8);
  const std::int64_t n_vec = vec ? n / 4 : 0;
  adam_step_mixed_kernel<<<blocks_for(std::max(n_vec, n - 4 * n_vec)), kBlock, 0, stream>>>(
      w, reinterpret_cast<__half*>(half_w), reinterpret_cast<__half*>(half_grad), m, v, n, n_vec,
      AdamHyper{lr, beta1, beta2, eps}, step, scaler);
  MF_CHECK_LAUNCH();
}

void launch_finish_step_mixed(std::int32_t* step, LossScaleState* scaler, std::int32_t growth_interval,
                              float min_scale, float max_scale, GpuStream stream) {
  finish_step_mixed_kernel<<<1, 1, 0, stream>>>(step, scaler, growth_interval, min_scale, max_scale);
  MF_CHECK_LAUNCH();
}

}  // namespace mf
