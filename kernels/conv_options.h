// conv_options.h: how the convolutions pick their cuDNN algorithms (train_mnist
// --conv-algo, --workspace-mb), read when a layer first meets an input shape, and when the
// CPU backward takes its sparse kernels (read every step). One process-wide setting.
#pragma once
#include <cstddef>

namespace mf {

struct ConvOptions {
  bool find = true;                          // time the candidates (cudnnFind*) vs take the heuristic's first
  std::size_t workspace_limit = 64u << 20;   // bytes an algorithm may use
  bool fma_math_only = false;                // FP32 tests: no TF32 (CUDNN_FMA_MATH, CUBLAS_PEDANTIC/DEFAULT)
  // Only algorithms cuDNN reports CUDNN_DETERMINISTIC (train_mnist --deterministic): the
  // same bits at every run on one card. Without it the fastest may be one that sums with
  // atomics (backward-filter ALGO_0 and ALGO_3, backward-data ALGO_0), whose low bits
  // change from run to run.
  bool deterministic = false;
  // CPU backward: below this fraction of nonzero output-gradient entries, the convolution's
  // weight and data gradients skip the zeros (conv2d_cpu_kernels.h, "Sparse gradients").
  // 0: never; above 1: always.
  double cpu_sparse_below = 0.4;
};
ConvOptions& conv_options();

}  // namespace mf
