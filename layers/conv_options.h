// conv_options.h: how the GPU convolutions pick their cuDNN algorithms (train_mnist
// --conv-algo, --workspace-mb). One process-wide setting, read when a layer first meets an
// input shape.
#pragma once
#include <cstddef>

namespace mf {

struct ConvOptions {
  bool find = true;                          // time the candidates (cudnnFind*) vs take the heuristic's first
  std::size_t workspace_limit = 64u << 20;   // bytes an algorithm may use
  bool fma_math_only = false;                // FP32 tests: no TF32 (CUDNN_FMA_MATH, CUBLAS_PEDANTIC/DEFAULT)
};
ConvOptions& conv_options();

}  // namespace mf
