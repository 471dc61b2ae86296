// dense_gpu.cu: Dense on the GPU: cuBLAS GEMMs (f32, or f16 operands with f32 accumulation on
// Tensor Cores) followed by the fused bias + ReLU kernels of kernels/.
//
// Our matrices are row-major; cuBLAS is column-major. A row-major (r x c) matrix read as
// column-major is its transpose (c x r) with leading dimension c, so each product
// C = A B is asked of cuBLAS as C^T = B^T A^T: the operands swap places, and the leading
// dimensions are the row lengths.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "runtime/cuda_check.h"
#include "runtime/gpu_context.h"
#include "kernels/gpu/launchers.h"
#include "kernels/kernel_options.h"
#include "layers/dense.h"

namespace mf {

struct DenseGpuState {
  Tensor dz;           // dy masked by ReLU: the layer's own buffer (dy belongs to the next layer)
  std::string config;  // what the last GEMM ran as, for gpu_config()
};

namespace {

void destroy_state(DenseGpuState* s) { delete s; }

// C (column-major m x n, leading dimension ldc) = op(A) op(B) + beta C, alpha = 1.
// f16: f16 A, B and C with f32 accumulation (CUBLAS_COMPUTE_32F), which cuBLAS runs on
// Tensor Cores. f32: CUBLAS_COMPUTE_32F keeps plain FP32 unless the handle's math mode
// allows TF32 (ours does not); the _PEDANTIC form rules out every reduced-precision path
// for the tests (fma_math_only).
void gemm(cublasHandle_t handle, cublasOperation_t op_a, cublasOperation_t op_b, std::int64_t m, std::int64_t n,
          std::int64_t k, const void* a, std::int64_t lda, const void* b, std::int64_t ldb, float beta, void* c,
          std::int64_t ldc, bool half, bool pedantic) {
  const float alpha = 1.0f;  // alpha, beta: f32 for CUBLAS_COMPUTE_32F, whatever the storage
  const cudaDataType_t type = half ? CUDA_R_16F : CUDA_R_32F;
  const cublasComputeType_t compute =
      !half && pedantic ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  MF_GPU_CHECK(cublasGemmEx(handle, op_a, op_b, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha,
                            a, type, static_cast<int>(lda), b, type, static_cast<int>(ldb), &beta, c, type,
                            static_cast<int>(ldc), compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

Dense::~Dense() = default;

std::string Dense::gpu_config() const {
  if (device_ != Device::kGpu) return "";
  if (rung() == KernelRung::kNaive) return "naive kernels: one thread per output, global memory only";
  if (!gpu_ || gpu_->config.empty()) return "cuBLAS (no input seen yet)";
  return gpu_->config;
}

void Dense::forward_gpu(const Tensor& x, Tensor& y) {
  if (!gpu_) gpu_ = decltype(gpu_)(new DenseGpuState, &destroy_state);
  GpuContext& ctx = GpuContext::current();
  const bool half = x.dtype() == DType::kF16;
  const std::int64_t n = x.dim(0);
  const void* w = half ? weight_.half.raw() : weight_.value.raw();
  const void* b = half ? bias_.half.raw() : bias_.value.raw();
  if (rung() == KernelRung::kNaive) {
    launch_dense_forward_naive(naive::Dense{n, in_, units_}, x.raw(), w, b, act_ == Activation::kRelu, y.raw(), half,
                               ctx.stream());
    return;
  }
  gpu_->config = half ? "cuBLAS GemmEx f16 in/out, f32 accumulate (Tensor Cores)"
                      : kernels_.fma_math_only ? "cuBLAS GemmEx f32, CUBLAS_COMPUTE_32F_PEDANTIC (no TF32)"
                                                     : "cuBLAS GemmEx f32, CUBLAS_COMPUTE_32F (no TF32)";
  // Y (n x units) = X (n x in) W (in x units), i.e. Y^T (units x n) = W^T (units x in) X^T (in x n):
  // W and X as stored are already W^T and X^T to cuBLAS, so no operand is transposed.
  gemm(ctx.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, units_, n, in_, w, units_, x.raw(), in_, 0.0f, y.raw(), units_, half,
       kernels_.fma_math_only);
  launch_bias_act_forward(y.raw(), b, half, n * units_, units_, act_ == Activation::kRelu, ctx.stream());
}

void Dense::backward_gpu(const Tensor& dy, Tensor& dx) {
  if (!gpu_) throw std::logic_error("Dense: GPU backward without a GPU forward");
  GpuContext& ctx = GpuContext::current();
  const bool half = dy.dtype() == DType::kF16;
  const std::int64_t n = dy.dim(0);
  if (rung() == KernelRung::kNaive) {
    const void* w = half ? weight_.half.raw() : weight_.value.raw();
    launch_dense_backward_naive(naive::Dense{n, in_, units_}, x_.raw(), y_.raw(), dy.raw(), w,
                                act_ == Activation::kRelu, weight_.grad.raw(), bias_.grad.raw(),
                                dx.defined() ? dx.raw() : nullptr, half, ctx.stream());
    return;
  }
  // dz = dy masked where the output was not positive (ReLU); db += column sums of dz.
  ensure(gpu_->dz, dy.shape(), dy.dtype(), Device::kGpu);
  launch_bias_act_backward(y_.raw(), dy.raw(), gpu_->dz.raw(), bias_.grad.raw(), ctx.reduction_scratch(reduction_scratch_bytes()), half, n,
                           units_,
                           act_ == Activation::kRelu, ctx.stream());
  // dW (in x units) += X^T (in x n) dZ (n x units), i.e. dW^T (units x in) += dZ^T (units x n) X (n x in):
  // dZ as stored is dZ^T to cuBLAS (no op), X as stored is X^T, so it is transposed back (op T).
  // beta = 1 accumulates into the gradient.
  gemm(ctx.cublas(), CUBLAS_OP_N, CUBLAS_OP_T, units_, in_, n, gpu_->dz.raw(), units_, x_.raw(), in_, 1.0f,
       weight_.grad.raw(), units_, half, kernels_.fma_math_only);
  if (!dx.defined()) return;
  // dX (n x in) = dZ (n x units) W^T (units x in), i.e. dX^T (in x n) = W (in x units) dZ^T (units x n):
  // W as stored is W^T to cuBLAS, so it is transposed back (op T); dZ as stored is dZ^T (no op).
  const void* w = half ? weight_.half.raw() : weight_.value.raw();
  gemm(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, in_, n, units_, w, units_, gpu_->dz.raw(), units_, 0.0f, dx.raw(), in_,
       half, kernels_.fma_math_only);
}

}  // namespace mf
