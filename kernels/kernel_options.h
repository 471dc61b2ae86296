// kernel_options.h: how a layer computes, set per model (Network::set_kernel_options) or per
// layer: which rung of the kernel ladder runs it (train_mnist --kernels), how the cuDNN
// convolutions pick their algorithms (--conv-algo, --workspace-mb, --deterministic) and
// when the tuned CPU backward takes its sparse kernels (--dense-grad).
//
// The ladder, slowest first (docs/gpu_vs_cpu.md climbs it):
//   naive    the algorithm as plain loops over the outputs (CPU), or one CUDA thread per
//            output with global memory only (GPU): the same index expressions on both
//   library  lowered to matrix products and handed to a library: im2col + Eigen on the CPU,
//            cuDNN + cuBLAS on the GPU
//   tuned    the CPU's own best: register tiles, AVX-512, sparse gradients
//   fused    the GPU's own best: the whole training step in 9 kernels (train/fused_step.h);
//            outside training (evaluate, predict) the layers run the library rung's forward
// Pooling, flattening and the loss run the same code at every rung: they move memory and
// do next to no arithmetic, so there is nothing for a rung to change in them.
#pragma once
#include <cstddef>
#include <string>

#include "tensor/dtype.h"

namespace mf {

enum class KernelRung {
  kDefault,  // the device's default: tuned on the CPU, library on the GPU
  kNaive,
  kLibrary,
  kTuned,
  kFused,
};

// "naive", "library", "tuned", "fused" ("default" for kDefault).
const char* rung_name(KernelRung rung);
// The inverse of rung_name() for the four rungs; false for anything else.
bool parse_rung(const std::string& text, KernelRung& rung);
// The rung that runs on `device`: kDefault resolved, the others as they are.
KernelRung resolve_rung(KernelRung rung, Device device);
// Empty when `device` has `rung`, else one line saying why not and what it has.
std::string rung_unavailable(KernelRung rung, Device device);
// Throws std::invalid_argument with rung_unavailable()'s line, prefixed by `who`, when the
// device lacks the rung; returns the resolved rung otherwise.
KernelRung require_rung(KernelRung rung, Device device, const std::string& who);

struct KernelOptions {
  KernelRung rung = KernelRung::kDefault;
  bool find = true;                          // time the candidates (cudnnFind*) vs take the heuristic's first
  std::size_t workspace_limit = 64u << 20;   // bytes an algorithm may use
  bool fma_math_only = false;                // FP32 tests: no TF32 (CUDNN_FMA_MATH, CUBLAS_PEDANTIC/DEFAULT)
  // Only algorithms cuDNN reports CUDNN_DETERMINISTIC (train_mnist --deterministic): the
  // same bits at every run on one card. Without it the fastest may be one that sums with
  // atomics (backward-filter ALGO_0 and ALGO_3, backward-data ALGO_0), whose low bits
  // change from run to run.
  bool deterministic = false;
  // CPU backward (tuned rung): below this fraction of nonzero output-gradient entries, the
  // convolution's weight and data gradients skip the zeros (conv2d_cpu_kernels.h, "Sparse
  // gradients"). 0: never; above 1: always.
  double cpu_sparse_below = 0.4;
};

}  // namespace mf
