// launchers.h: host-side entry points of microflow's custom CUDA kernels.
//
// Each launch_<op>_<dir> starts <op>_<dir>_kernel on `stream` and checks the launch; none
// synchronises. Pointers are device pointers. Activations are NHWC, so a per-channel
// value (bias) is indexed by i % C. `half` arguments select f16 (__half) storage instead
// of f32 for the pointers typed void*; arithmetic is always in f32. In a CPU-only build
// these throw NoGpuError.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/naive_index.h"
#include "runtime/gpu_runtime.h"
#include "tensor/cast.h"
#include "tensor/half.h"

namespace mf {

// ---- fused bias + activation (after a convolution or GEMM) ----
// y[i] = act(y[i] + bias[i % channels]), in place; y and bias of the same dtype.
void launch_bias_act_forward(void* y, const void* bias, bool half, std::int64_t n, std::int64_t channels, bool relu,
                             GpuStream stream);
// dz = relu ? dy * (y > 0) : dy, written to dz (may alias dy); db[c] += sum of dz over
// all rows (db is f32 when !half, f16 when half, summed in f32, in a fixed order: the same
// bits at every run). y unused when !relu. `scratch`: see reduction scratch, below.
void launch_bias_act_backward(const void* y, const void* dy, void* dz, void* db, void* scratch, bool half,
                              std::int64_t rows, std::int64_t channels, bool relu, GpuStream stream);

// ---- the naive rung (naive.cu): one thread per output element, global memory only ----
// The loops of kernels/cpu/naive.h as grids, f32 or f16 storage (`half`), f32 sums. The
// forward adds the bias and applies ReLU itself; the backward masks dy by ReLU where y was
// not positive, accumulates dw and db (f16 when half), and overwrites dx unless it is null.
void launch_conv_forward_naive(const naive::Conv& g, const void* x, const void* w, const void* b, bool relu, void* y,
                               bool half, GpuStream stream);
void launch_conv_backward_naive(const naive::Conv& g, const void* x, const void* y, const void* dy, const void* w,
                                bool relu, void* dw, void* db, void* dx, bool half, GpuStream stream);
void launch_dense_forward_naive(const naive::Dense& g, const void* x, const void* w, const void* b, bool relu,
                                void* y, bool half, GpuStream stream);
void launch_dense_backward_naive(const naive::Dense& g, const void* x, const void* y, const void* dy, const void* w,
                                 bool relu, void* dw, void* db, void* dx, bool half, GpuStream stream);

// ---- 2x2 / stride 2 max pooling, NHWC, floor ----
// y: (N, H/2, W/2, C); argmax: u8 0..3 = position of the winner (first on ties).
void launch_maxpool2x2_forward(const void* x, void* y, std::uint8_t* argmax, bool half, std::int64_t n,
                               std::int64_t h, std::int64_t w, std::int64_t c, GpuStream stream);
// Writes all of dx (N, H, W, C): dy at each window's winner, zero elsewhere.
void launch_maxpool2x2_backward(const void* dy, const std::uint8_t* argmax, void* dx, bool half, std::int64_t n,
                                std::int64_t h, std::int64_t w, std::int64_t c, GpuStream stream);

// ---- softmax + cross-entropy + accuracy, fused ----
// logits: (N, K), f32 or f16. Adds [loss sum, correct count, N] into stats[0..2] (f32),
// each summed in a fixed order. `scratch`: see reduction scratch, below.
// If dlogits is not null writes (softmax - onehot) * grad_scale * (scale ? *scale : 1),
// in the logits' dtype. grad_scale is 1/N for the mean loss; scale is the dynamic loss
// scale living on the device. dlogits must not alias logits.
void launch_softmax_xent(const void* logits, bool half, const std::int32_t* labels, std::int64_t n, std::int64_t k,
                         void* dlogits, float grad_scale, const float* scale, float* stats, void* scratch,
                         GpuStream stream);

// ---- reduction scratch ----
// The two reductions above sum across blocks without float atomics: each block writes its
// partial sums to `scratch`, and the last block to finish adds them in block order. The
// scratch must hold reduction_scratch_bytes() (about 1 MB on an H200); its first 256 bytes
// are the kernels' counters, which must be zero before the first launch (each launch leaves
// them zero again); launches sharing one scratch must be ordered (one stream):
// GpuContext::reduction_scratch() is the compute stream's.
std::size_t reduction_scratch_bytes();  // the larger of the two below
std::size_t bias_act_backward_scratch_bytes();
std::size_t softmax_xent_scratch_bytes();

// ---- batch gather from the dataset kept on the device ----
// x[b, p] = images[perm[offset + b] * sample + p] / 255, f32 or f16;
// labels_out[b] = labels[perm[offset + b]]. `offset` is read from device memory (a
// cursor that the step graph advances), so a captured graph needs no host argument.
void launch_gather_batch(const std::uint8_t* images, const std::uint8_t* labels, const std::int32_t* perm,
                         const std::int64_t* offset, std::int64_t batch, std::int64_t sample, void* x, bool half,
                         std::int32_t* labels_out, GpuStream stream);
// *offset += batch (one thread): the last node of a captured step.
void launch_advance_cursor(std::int64_t* offset, std::int64_t batch, GpuStream stream);
// Normalises an already copied u8 batch: x[i] = u8[i] / 255, and widens labels to i32.
void launch_normalize_batch(const std::uint8_t* images, const std::uint8_t* labels, std::int64_t batch,
                            std::int64_t sample, void* x, bool half, std::int32_t* labels_out, GpuStream stream);

// ---- optimizers: one launch for all parameters (they live in one flat buffer) ----
// The step count t lives on the device so that an update can be replayed in a CUDA graph:
// the update kernels read t = *step + 1, and a one-thread finishing kernel launched after
// them advances *step (a kernel cannot safely change a value its other blocks still read).
//
// Adam, Keras form ("epsilon hat"):
//   lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;  w -= lr_t m / (sqrt(v) + eps)
// Reads the f32 gradient and sets it to zero (layers accumulate into it). t = *step + 1,
// then launch_finish_step moves *step on; or, with count_moved, t = *step: an earlier kernel
// of the step has moved it on already (the fused step's weight-gradient sums), which saves
// the finish launch. (At 2^31 - 1, where the count stops, that t is one less: the bias
// correction has been 1 for a long time by then.)
void launch_adam_step(float* w, float* grad, float* m, float* v, std::int64_t n, float lr, float beta1, float beta2,
                      float eps, const std::int32_t* step, GpuStream stream, bool count_moved = false);
// SGD with momentum (Keras form): velocity = momentum * velocity - lr * g; w += velocity.
// Zeroes grad after use.
void launch_sgd_step(float* w, float* grad, float* velocity, std::int64_t n, float lr, float momentum,
                     GpuStream stream);
// ++*step (one thread).
void launch_finish_step(std::int32_t* step, GpuStream stream);

// Mixed precision. The dynamic loss scale lives on the device with GradScaler semantics.
struct LossScaleState {  // 16 bytes on the device
  float scale;               // the loss is multiplied by this before backward
  std::int32_t clean_steps;  // steps since the last inf/NaN or growth
  std::int32_t skipped;      // steps skipped (counted up; the host reads and resets it per epoch)
  std::int32_t found_inf;    // set by launch_unscale_check, cleared by launch_finish_step_mixed
};
// 1) found_inf = 1 if any f16 gradient is inf or NaN.
void launch_unscale_check(const Half* half_grad, std::int64_t n, LossScaleState* scaler, GpuStream stream);
// 2) Unless found_inf: g = half_grad / scale, the Adam update above on the f32 master w
//    (t = *step + 1), and half_w = (half) w. Always zeroes half_grad.
void launch_adam_step_mixed(float* w, Half* half_w, Half* half_grad, float* m, float* v, std::int64_t n, float lr,
                            float beta1, float beta2, float eps, const std::int32_t* step,
                            const LossScaleState* scaler, GpuStream stream);
// 3) One thread: on found_inf, scale = max(scale / 2, min_scale), clean_steps = 0,
//    skipped++; else ++*step and, after growth_interval clean steps, scale =
//    min(scale * 2, max_scale), clean_steps = 0. Then found_inf = 0.
void launch_finish_step_mixed(std::int32_t* step, LossScaleState* scaler, std::int32_t growth_interval,
                              float min_scale, float max_scale, GpuStream stream);

// ---- checks ----
// *count += the number of i < n where the 32-bit words a[i] and b[i] differ (doctor --burn).
void launch_count_mismatch(const std::uint32_t* a, const std::uint32_t* b, std::int64_t n, unsigned long long* count,
                           GpuStream stream);

}  // namespace mf
