// fused_step.h: the training step of the kernel ladder's fused rung (train_mnist --kernels
// fused; docs/fused_step.md). The library rung's step runs each layer's forward and backward
// through cuDNN, cuBLAS and our small kernels, about 28 launches; this one runs the article's
// model in 7 launches of kernels/gpu/fused.h plus the optimizer's:
//   conv1 + bias + ReLU + pool, straight from the resident data set's u8 pixels
//   conv2 + bias + ReLU + pool
//   the head, per sample (dense, dense_1, the loss, their gradients), then its parameters
//   conv2's data gradient and its weight gradient's partial sums (one launch), conv1's
//   both weight gradients' sums, which also move the batch cursor on, and FP32 Adam's
//   update count (Optimizer::device_step_count), so that Adam is one launch
// Nothing before a pooling reaches memory, and the gradients visit only the pooling winners.
// For train/*.cu only (it needs the CUDA headers).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "layers/layer.h"
#include "optim/optimizer.h"
#include "tensor/tensor.h"

namespace mf {

class GpuTrainer;

class FusedStep {
 public:
  using Layers = std::vector<std::unique_ptr<Layer>>;
  // Throws std::invalid_argument, one line, unless `layers` are the article's model (Conv2D
  // 3x3 ReLU, MaxPooling2D, Conv2D 3x3 ReLU, MaxPooling2D, Flatten, Dense ReLU, Dense) with
  // a head the fused kernels hold.
  static void check_model(const Layers& layers);

  // Sizes the step's buffers for batches of up to `batch` images of h x w x c.
  void size(const Layers& layers, std::int64_t batch, std::int64_t h, std::int64_t w, std::int64_t c, bool half);
  // Enqueues one step of nb samples on s, reading the batch at t's cursor in its resident
  // data set and moving the cursor on by nb; adds the loss statistics into t.stats. Records
  // its buffers in addrs.
  void enqueue(GpuTrainer& t, Layers& layers, Optimizer& opt, std::int64_t nb, cudaStream_t s,
               std::vector<const void*>& addrs);

 private:
  std::int64_t h_ = 0, w_ = 0, c_ = 0;
  Tensor pooled1_, winners1_, pooled2_, winners2_, dpool2_, dpool1_;
  Tensor conv1_scratch_, conv2_scratch_, head_scratch_;
};

}  // namespace mf
