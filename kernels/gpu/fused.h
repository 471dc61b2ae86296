// fused.h: the kernels of the fused GPU step (train_mnist --kernels fused), one per stage
// of the training step instead of one per operation: the model's head, then its two
// convolutions (each with its bias, ReLU and pooling). train/fused_step.cu runs them as one
// step; bench/bench_fused.cpp times each launch.
//
// The head is everything after the last pooling: dense (in -> hidden, ReLU), dense_1
// (hidden -> classes), softmax cross-entropy and accuracy, forward and backward. The
// library rung runs it as 4 cuBLAS GEMMs for the forward and backward of each layer, 4 bias
// kernels and the loss kernel (about 11 graph nodes); here it is 2 kernels:
//   1. one block per sample: both layers' forward, the loss, and the sample's own gradients
//      (dlogits, the gradient behind the ReLU, and the input gradient dx for the pooling's
//      backward), with the sample's activations in shared memory;
//   2. one thread per parameter: the weight and bias gradients, each a sum over the batch in
//      sample order, and the loss and accuracy sums: no atomics, the same bits at every run.
// Storage f32 or f16 (`half`), every sum in f32. Device pointers; nothing synchronises. In a
// CPU-only build these throw NoGpuError.
#pragma once
#include <cstddef>
#include <cstdint>

#include "runtime/gpu_runtime.h"

namespace mf {

struct FusedHeadSizes {
  std::int64_t n, in, hidden, classes;  // the batch, the flattened input, dense's units, dense_1's
};

// The largest head the per-sample kernel holds in shared memory.
constexpr std::int64_t kFusedHeadMaxHidden = 256, kFusedHeadMaxClasses = 32;

// Per-sample values the two kernels pass on: relu(dense's output) (n x hidden), the
// gradient behind its ReLU (n x hidden), dlogits (n x classes), all in the activations'
// dtype, and each sample's [loss, correct] in f32 (n x 2).
struct FusedHeadScratch {
  void* a1;
  void* dz1;
  void* dz2;
  float* row_stats;
};
std::size_t fused_head_scratch_bytes(const FusedHeadSizes& g, bool half);
// Carves FusedHeadScratch out of `bytes` (at least fused_head_scratch_bytes()), aligned.
FusedHeadScratch fused_head_scratch(void* bytes, const FusedHeadSizes& g, bool half);

// x (n x in), w1 (in x hidden), b1, w2 (hidden x classes), b2: the activations' dtype.
// Adds into the gradients dw1, db1, dw2, db2 (the parameters' gradient dtype: f16 when half)
// and into stats [loss sum, correct count, n] (f32); writes dx (n x in) unless it is null.
// dlogits = (softmax - onehot) * grad_scale * (*scale when scale is not null), as
// launch_softmax_xent. Throws std::invalid_argument for a head larger than the limits above.
void launch_fused_head(const FusedHeadSizes& g, const void* x, const void* w1, const void* b1, const void* w2,
                       const void* b2, const std::int32_t* labels, float grad_scale, const float* scale,
                       const FusedHeadScratch& scratch, void* dx, void* dw1, void* db1, void* dw2, void* db2,
                       float* stats, bool half, GpuStream stream);

// ---- the convolutions: 3x3, with bias, ReLU and 2x2 max pooling (floor) ----
// n inputs of h x w x c to `filters` channels; the pooled output is
// (n, (h-2)/2, (w-2)/2, filters), and for each pooled value `winners` holds which of its
// window's four outputs won (0..3, as launch_maxpool2x2_forward numbers them). Weights
// (filters, 3, 3, c) and biases in the activations' dtype; gradients are added (+=) in the
// gradients' dtype. A weight gradient takes two launches: its partial sums, one per chunk of
// 4 images, into `scratch` (f32, fused_conv_scratch_bytes()), then their sum over the chunks
// in order (the same bits at every run), which launch_fused_conv_wgrad_sums does for both
// convolutions of the step at once.
struct FusedConvSizes {
  std::int64_t n, h, w, c, filters;
};
std::size_t fused_conv_scratch_bytes(const FusedConvSizes& g);

// The first convolution reads the batch straight from the data set the resident pipeline
// keeps on the device: u8 images (count x h x w x c), batch row s is image perm[*offset + s]
// (perm null: image s; offset null: 0), its pixels p / 255.
struct FusedBatch {
  const std::uint8_t* images;
  const std::uint8_t* labels;
  const std::int32_t* perm;
  const std::int64_t* offset;
};
// Also writes labels_out[s] = labels[image of row s] unless labels_out is null.
void launch_fused_conv1_forward(const FusedConvSizes& g, const FusedBatch& batch, const void* w, const void* b,
                                void* pooled, std::uint8_t* winners, std::int32_t* labels_out, bool half,
                                GpuStream stream);
// dpool: the gradient at the pooled output. Through the pooling (to the winner), ReLU
// (where the pooled value is positive) and the bias: the weight and bias gradients' partial
// sums, written to scratch (launch_fused_conv_wgrad_sums adds them into dw and db).
void launch_fused_conv1_wgrad_partials(const FusedConvSizes& g, const FusedBatch& batch, const void* dpool,
                                       const void* pooled, const std::uint8_t* winners, float* scratch, bool half,
                                       GpuStream stream);

// The same for a convolution of activations x (n, h, w, c), f32 or f16. With tensor_cores
// and where fused_conv_takes_tensor_cores(), its products run on Tensor Cores (TF32 in f32,
// half in f16, f32 sums; fused_conv_tc.cu), else on CUDA cores in exact f32 arithmetic.
bool fused_conv_takes_tensor_cores(const FusedConvSizes& g, const void* w, bool half);
void launch_fused_conv_forward(const FusedConvSizes& g, const void* x, const void* w, const void* b, void* pooled,
                               std::uint8_t* winners, bool half, bool tensor_cores, GpuStream stream);
void launch_fused_conv_wgrad_partials(const FusedConvSizes& g, const void* x, const void* dpool, const void* pooled,
                                      const std::uint8_t* winners, float* scratch, bool half, GpuStream stream);
// Its data gradient: dx (n, h, w, c) = the gradient at each input, through the pooling,
// ReLU and the kernel, visiting only the outputs that won their window. Overwrites dx.
void launch_fused_conv_dgrad(const FusedConvSizes& g, const void* dpool, const void* pooled,
                             const std::uint8_t* winners, const void* w, void* dx, bool half, GpuStream stream);
// Both in one launch (what the step runs): dx as launch_fused_conv_dgrad, the weight
// gradient's partial sums into scratch as launch_fused_conv_wgrad_partials, the same bits.
void launch_fused_conv_backward(const FusedConvSizes& g, const void* x, const void* dpool, const void* pooled,
                                const std::uint8_t* winners, const void* w, void* dx, float* scratch, bool half,
                                GpuStream stream);

// The weight gradients' second pass, for `count` (0 to kMaxWgradSums) convolutions in one
// launch: layer l's partial sums (its scratch, written by its wgrad_partials launch) added
// over the chunks, in chunk order, into its dw and db (the gradients' dtype: f16 when half).
// Then, unless cursor is null, *cursor += advance: the resident pipeline's batch cursor,
// moved on once the step has read its batch (it saves the step a one-thread launch); and,
// unless step_count is null, ++*step_count (stopping at 2^31 - 1): the optimizer's update
// count (Optimizer::device_step_count), which saves the optimizer its finish launch.
struct FusedWgradSum {
  FusedConvSizes g;
  const float* scratch;
  void* dw;
  void* db;
};
constexpr int kMaxWgradSums = 2;
void launch_fused_conv_wgrad_sums(const FusedWgradSum* layers, int count, std::int64_t* cursor, std::int64_t advance,
                                  std::int32_t* step_count, bool half, GpuStream stream);

}  // namespace mf
