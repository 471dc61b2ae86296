// softmax_xent.h: softmax + cross-entropy + accuracy, fused, for integer class labels.
#pragma once
#include "tensor/tensor.h"

namespace mf {

// Per-batch sums the loss adds up on the device of the logits, so that a whole epoch runs
// without reading anything back: stats = [sum of per-sample losses, number correct,
// number of samples], f32 (exact counts up to 2^24 samples).
constexpr int kStatLossSum = 0, kStatCorrect = 1, kStatCount = 2, kNumStats = 3;

// logits: (N, K) f32 (or f16 on the GPU); labels: (N) i32 in [0, K), same device.
// Adds the batch's loss sum, correct count and N into `stats` (a (3) f32 tensor).
// When dlogits is not null, writes d(mean loss)/d logits * grad_scale =
// (softmax - onehot) * grad_scale / N into it: in place when it has the logits' shape,
// dtype and device already (a slice of a larger tensor too), else into the buffer
// ensure() makes of it. It may not overlap the logits, labels or stats
// (std::invalid_argument). `scale` (GPU only, may be null) is a
// device pointer whose value multiplies grad_scale (the dynamic loss scale).
// A prediction is correct when the label's logit is the largest (first index on ties,
// NaN logits never win).
void softmax_xent(const Tensor& logits, const Tensor& labels, Tensor& stats, Tensor* dlogits,
                  float grad_scale = 1.0f, const float* scale = nullptr);

// Row-wise softmax of (N, K) logits (f32, or f16 from the GPU's FP16 path, on either
// device) into a new f32 host tensor. Throws std::invalid_argument for any other rank or dtype.
Tensor softmax(const Tensor& logits);

}  // namespace mf
