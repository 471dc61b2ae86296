// fused.h: the kernels of the fused GPU step (train_mnist --kernels fused), one per stage
// of the training step instead of one per operation. Written so far: the model's head.
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

}  // namespace mf
