// naive.cu: the naive rung on the GPU (train_mnist --device gpu --kernels naive). Each kernel
// is a loop nest of kernels/cpu/naive.cpp turned into a grid: the outer loops over the
// outputs become the thread index, the inner loops (the sum) stay a loop in each thread.
// Global memory only, no shared memory, no tiling, no vector loads: every thread reads its
// inputs straight from DRAM (or L2), which is what the library rung (cuDNN, cuBLAS) and the
// fused rung then learn to avoid.
//
//   CPU (naive.cpp)                          GPU (here)
//   for n, i, j, f:          (the outputs)   e = blockIdx.x * blockDim.x + threadIdx.x
//     acc = b[f]                             (n, i, j, f) = the digits of e
//     for r, s, c: acc += x[..] * w[..]      for r, s, c: acc += x[..] * w[..]
//     y[n, i, j, f] = act(acc)               y[e] = act(acc)
//
// Index expressions are kernels/naive_index.h's, shared with the CPU. Storage is f32 or
// f16 (__half); every sum is f32. Each output is summed by one thread in one fixed order,
// so the results have the same bits at every run (no atomics). Weight and bias gradients
// ACCUMULATE (+=), dx is overwritten, as everywhere else.
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/gpu/launchers.h"
#include "kernels/naive_index.h"
#include "runtime/cuda_check.h"
#include "runtime/kernel_util.cuh"

namespace mf {

namespace {

using namespace gpu;
using i64 = std::int64_t;

// This thread's first element and the grid's stride: the grid is capped (blocks_for), so a
// thread takes elements e, e + stride, ... and any size is covered.
__device__ __forceinline__ i64 first_element() { return static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ i64 grid_stride() { return static_cast<i64>(gridDim.x) * blockDim.x; }

// The gradient behind the ReLU at output element e (as grad_at in naive.cpp).
template <class T>
__device__ __forceinline__ float grad_at(const T* y, const T* dy, i64 e, bool relu) {
  return !relu || to_f32(y[e]) > 0.0f ? to_f32(dy[e]) : 0.0f;
}

__device__ __forceinline__ float act(float z, bool relu) { return relu && z < 0.0f ? 0.0f : z; }  // NaN passes

// ---- convolution ----
// One thread per output element y[n, i, j, f].
template <class T>
__global__ void conv_forward_naive_kernel(naive::Conv g, const T* x, const T* w, const T* b, bool relu, T* y) {
  const i64 total = g.n * g.oh * g.ow * g.filters;
  for (i64 e = first_element(); e < total; e += grid_stride()) {
    const i64 f = e % g.filters, j = e / g.filters % g.ow, i = e / (g.filters * g.ow) % g.oh,
              n = e / (g.filters * g.ow * g.oh);
    float acc = to_f32(b[f]);
    for (i64 r = 0; r < g.k; ++r)
      for (i64 s = 0; s < g.k; ++s)
        for (i64 c = 0; c < g.c; ++c) acc += to_f32(x[g.x_at(n, i + r, j + s, c)]) * to_f32(w[g.w_at(f, r, s, c)]);
    y[e] = from_f32<T>(act(acc, relu));
  }
}

// One thread per weight dw[f, r, s, c]: the sum over every image and output pixel.
template <class T>
__global__ void conv_wgrad_naive_kernel(naive::Conv g, const T* x, const T* y, const T* dy, bool relu, T* dw) {
  const i64 total = g.filters * g.k * g.k * g.c;
  for (i64 e = first_element(); e < total; e += grid_stride()) {
    const i64 c = e % g.c, s = e / g.c % g.k, r = e / (g.c * g.k) % g.k, f = e / (g.c * g.k * g.k);
    float acc = 0.0f;
    for (i64 n = 0; n < g.n; ++n)
      for (i64 i = 0; i < g.oh; ++i)
        for (i64 j = 0; j < g.ow; ++j) acc += grad_at(y, dy, g.y_at(n, i, j, f), relu) * to_f32(x[g.x_at(n, i + r, j + s, c)]);
    dw[e] = from_f32<T>(to_f32(dw[e]) + acc);
  }
}

// One thread per filter's bias db[f].
template <class T>
__global__ void conv_bgrad_naive_kernel(naive::Conv g, const T* y, const T* dy, bool relu, T* db) {
  for (i64 f = first_element(); f < g.filters; f += grid_stride()) {
    float acc = 0.0f;
    for (i64 n = 0; n < g.n; ++n)
      for (i64 i = 0; i < g.oh; ++i)
        for (i64 j = 0; j < g.ow; ++j) acc += grad_at(y, dy, g.y_at(n, i, j, f), relu);
    db[f] = from_f32<T>(to_f32(db[f]) + acc);
  }
}

// One thread per input element dx[n, p, q, c]: it gathers from the outputs it fed.
template <class T>
__global__ void conv_dgrad_naive_kernel(naive::Conv g, const T* y, const T* dy, const T* w, bool relu, T* dx) {
  const i64 total = g.n * g.h * g.w * g.c;
  for (i64 e = first_element(); e < total; e += grid_stride()) {
    const i64 c = e % g.c, q = e / g.c % g.w, p = e / (g.c * g.w) % g.h, n = e / (g.c * g.w * g.h);
    float acc = 0.0f;
    for (i64 r = 0; r < g.k; ++r)
      for (i64 s = 0; s < g.k; ++s) {
        const i64 i = p - r, j = q - s;
        if (i < 0 || i >= g.oh || j < 0 || j >= g.ow) continue;
        for (i64 f = 0; f < g.filters; ++f)
          acc += grad_at(y, dy, g.y_at(n, i, j, f), relu) * to_f32(w[g.w_at(f, r, s, c)]);
      }
    dx[e] = from_f32<T>(acc);
  }
}

// ---- dense ----
// One thread per output y[s, u].
template <class T>
__global__ void dense_forward_naive_kernel(naive::Dense g, const T* x, const T* w, const T* b, bool relu, T* y) {
  for (i64 e = first_element(); e < g.n * g.units; e += grid_stride()) {
    const i64 u = e % g.units, s = e / g.units;
    float acc = to_f32(b[u]);
    for (i64 i = 0; i < g.in; ++i) acc += to_f32(x[g.x_at(s, i)]) * to_f32(w[g.w_at(i, u)]);
    y[e] = from_f32<T>(act(acc, relu));
  }
}

// One thread per weight dw[i, u] (and, for the threads of row 0, the bias db[u]).
template <class T>
__global__ void dense_wgrad_naive_kernel(naive::Dense g, const T* x, const T* y, const T* dy, bool relu, T* dw,
                                         T* db) {
  for (i64 e = first_element(); e < g.in * g.units; e += grid_stride()) {
    const i64 u = e % g.units, i = e / g.units;
    float acc = 0.0f, bias_acc = 0.0f;
    for (i64 s = 0; s < g.n; ++s) {
      const float dz = grad_at(y, dy, g.y_at(s, u), relu);
      acc += to_f32(x[g.x_at(s, i)]) * dz;
      bias_acc += dz;
    }
    dw[e] = from_f32<T>(to_f32(dw[e]) + acc);
    if (i == 0) db[u] = from_f32<T>(to_f32(db[u]) + bias_acc);
  }
}

// One thread per input gradient dx[s, i].
template <class T>
__global__ void dense_dgrad_naive_kernel(naive::Dense g, const T* y, const T* dy, const T* w, bool relu, T* dx) {
  for (i64 e = first_element(); e < g.n * g.in; e += grid_stride()) {
    const i64 i = e % g.in, s = e / g.in;
    float acc = 0.0f;
    for (i64 u = 0; u < g.units; ++u) acc += grad_at(y, dy, g.y_at(s, u), relu) * to_f32(w[g.w_at(i, u)]);
    dx[e] = from_f32<T>(acc);
  }
}

template <class T> const T* in(const void* p) { return static_cast<const T*>(p); }
template <class T> T* out(void* p) { return static_cast<T*>(p); }

template <class T>
void conv_forward(const naive::Conv& g, const void* x, const void* w, const void* b, bool relu, void* y,
                  cudaStream_t st) {
  conv_forward_naive_kernel<T><<<blocks_for(g.n * g.oh * g.ow * g.filters), kBlock, 0, st>>>(
      g, in<T>(x), in<T>(w), in<T>(b), relu, out<T>(y));
  MF_CHECK_LAUNCH();
}

template <class T>
void conv_backward(const naive::Conv& g, const void* x, const void* y, const void* dy, const void* w, bool relu,
                   void* dw, void* db, void* dx, cudaStream_t st) {
  conv_wgrad_naive_kernel<T><<<blocks_for(g.filters * g.k * g.k * g.c), kBlock, 0, st>>>(
      g, in<T>(x), in<T>(y), in<T>(dy), relu, out<T>(dw));
  MF_CHECK_LAUNCH();
  conv_bgrad_naive_kernel<T><<<blocks_for(g.filters), kBlock, 0, st>>>(g, in<T>(y), in<T>(dy), relu, out<T>(db));
  MF_CHECK_LAUNCH();
  if (!dx) return;
  conv_dgrad_naive_kernel<T><<<blocks_for(g.n * g.h * g.w * g.c), kBlock, 0, st>>>(
      g, in<T>(y), in<T>(dy), in<T>(w), relu, out<T>(dx));
  MF_CHECK_LAUNCH();
}

template <class T>
void dense_forward(const naive::Dense& g, const void* x, const void* w, const void* b, bool relu, void* y,
                   cudaStream_t st) {
  dense_forward_naive_kernel<T><<<blocks_for(g.n * g.units), kBlock, 0, st>>>(g, in<T>(x), in<T>(w), in<T>(b), relu,
                                                                              out<T>(y));
  MF_CHECK_LAUNCH();
}

template <class T>
void dense_backward(const naive::Dense& g, const void* x, const void* y, const void* dy, const void* w, bool relu,
                    void* dw, void* db, void* dx, cudaStream_t st) {
  dense_wgrad_naive_kernel<T><<<blocks_for(g.in * g.units), kBlock, 0, st>>>(g, in<T>(x), in<T>(y), in<T>(dy), relu,
                                                                             out<T>(dw), out<T>(db));
  MF_CHECK_LAUNCH();
  if (!dx) return;
  dense_dgrad_naive_kernel<T><<<blocks_for(g.n * g.in), kBlock, 0, st>>>(g, in<T>(y), in<T>(dy), in<T>(w), relu,
                                                                         out<T>(dx));
  MF_CHECK_LAUNCH();
}

}  // namespace

void launch_conv_forward_naive(const naive::Conv& g, const void* x, const void* w, const void* b, bool relu, void* y,
                               bool half, GpuStream stream) {
  if (g.n == 0) return;
  if (half) conv_forward<__half>(g, x, w, b, relu, y, stream);
  else conv_forward<float>(g, x, w, b, relu, y, stream);
}

void launch_conv_backward_naive(const naive::Conv& g, const void* x, const void* y, const void* dy, const void* w,
                                bool relu, void* dw, void* db, void* dx, bool half, GpuStream stream) {
  if (g.n == 0) return;
  if (half) conv_backward<__half>(g, x, y, dy, w, relu, dw, db, dx, stream);
  else conv_backward<float>(g, x, y, dy, w, relu, dw, db, dx, stream);
}

void launch_dense_forward_naive(const naive::Dense& g, const void* x, const void* w, const void* b, bool relu,
                                void* y, bool half, GpuStream stream) {
  if (g.n == 0) return;
  if (half) dense_forward<__half>(g, x, w, b, relu, y, stream);
  else dense_forward<float>(g, x, w, b, relu, y, stream);
}

void launch_dense_backward_naive(const naive::Dense& g, const void* x, const void* y, const void* dy, const void* w,
                                 bool relu, void* dw, void* db, void* dx, bool half, GpuStream stream) {
  if (g.n == 0) return;
  if (half) dense_backward<__half>(g, x, y, dy, w, relu, dw, db, dx, stream);
  else dense_backward<float>(g, x, y, dy, w, relu, dw, db, dx, stream);
}

}  // namespace mf
