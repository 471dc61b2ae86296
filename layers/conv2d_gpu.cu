// conv2d_gpu.cu: Conv2D on the GPU: cuDNN convolutions on NHWC tensors (f32, or f16 with f32
// accumulation on Tensor Cores) followed by the fused bias + ReLU kernels of kernels/gpu/.
// cuDNN's side (descriptors, the choice of algorithms, the f32 fallback of f16 layers) is
// kernels/gpu/cudnn_conv.h; this file is the layer's order of work.
//
//   forward:  y = conv(x, W)                 cudnnConvolutionForward
//             y = relu(y + b)                launch_bias_act_forward
//   backward: dz = dy * (y > 0), db += sum dz launch_bias_act_backward
//             dW += conv_filter(x, dz)        cudnnConvolutionBackwardFilter
//             dx = conv_data(W, dz)           cudnnConvolutionBackwardData (not for layer 1)
#include <cuda_runtime.h>

#include <stdexcept>

#include "kernels/kernel_options.h"
#include "kernels/gpu/cudnn_conv.h"
#include "kernels/gpu/launchers.h"
#include "layers/conv2d.h"
#include "runtime/gpu_context.h"

namespace mf {

void ConvGpuStateDeleter::operator()(ConvGpuState* s) const { delete s; }

Conv2D::~Conv2D() = default;

void Conv2D::to(Device device) {
  Layer::to(device);
  gpu_.reset();  // descriptors and choices are per device; made again on first use
}

void Conv2D::set_kernel_options(const KernelOptions& options) {
  Layer::set_kernel_options(options);
  gpu_.reset();  // the algorithm choices depend on find, workspace_limit, deterministic
}

void Conv2D::set_compute_dtype(DType dtype) {
  Layer::set_compute_dtype(dtype);
  gpu_.reset();  // the choices depend on the data type
}

std::string Conv2D::gpu_config() const {
  if (device_ != Device::kGpu) return "";
  if (rung() == KernelRung::kNaive) return "naive kernels: one thread per output, global memory only";
  if (!gpu_) return "cuDNN, algorithms not chosen yet (no input seen)";
  return describe(*gpu_);
}

void Conv2D::forward_gpu(const Tensor& x, Tensor& y) {
  GpuContext& ctx = GpuContext::current();
  const DType dtype = x.dtype();
  const bool half = dtype == DType::kF16;
  if (rung() == KernelRung::kNaive) {
    launch_conv_forward_naive(naive_sizes(x), x.raw(), half ? weight_.half.raw() : weight_.value.raw(),
                              half ? bias_.half.raw() : bias_.value.raw(), act_ == Activation::kRelu, y.raw(), half,
                              ctx.stream());
    return;
  }
  if (!gpu_ || gpu_->dtype != dtype) gpu_.reset(new ConvGpuState(dtype, in_channels_, filters_, k_, label()));
  ConvPlan& p = conv_plan(*gpu_, x, y, kernels_);
  const void* weight = half ? weight_.half.raw() : weight_.value.raw();
  const void* bias = half ? bias_.half.raw() : bias_.value.raw();
  conv_forward(*gpu_, p, x, weight, weight_.value, y, kernels_);
  launch_bias_act_forward(y.raw(), bias, half, y.numel(), filters_, act_ == Activation::kRelu, ctx.stream());
}

void Conv2D::backward_gpu(const Tensor& dy, Tensor& dx) {
  GpuContext& ctx = GpuContext::current();
  const DType dtype = x_.dtype();
  const bool half = dtype == DType::kF16;
  if (rung() == KernelRung::kNaive) {
    launch_conv_backward_naive(naive_sizes(x_), x_.raw(), y_.raw(), dy.raw(),
                               half ? weight_.half.raw() : weight_.value.raw(), act_ == Activation::kRelu,
                               weight_.grad.raw(), bias_.grad.raw(), dx.defined() ? dx.raw() : nullptr, half,
                               ctx.stream());
    return;
  }
  if (!gpu_) throw std::logic_error("Conv2D: GPU backward without a GPU forward");
  ConvGpuState& st = *gpu_;
  const auto it = st.plans.find(std::make_tuple(x_.dim(0), x_.dim(1), x_.dim(2), dtype));
  if (it == st.plans.end()) throw std::logic_error("Conv2D: GPU backward for a shape never run forward");
  // dz = dy masked where the output was not positive (ReLU), and db += sum of dz over
  // every output pixel (accumulated, like every parameter gradient).
  ensure(st.dz, dy.shape(), dtype, Device::kGpu);
  const std::int64_t rows = dy.dim(0) * dy.dim(1) * dy.dim(2);
  launch_bias_act_backward(y_.raw(), dy.raw(), st.dz.raw(), bias_.grad.raw(),
                           ctx.reduction_scratch(reduction_scratch_bytes()), half, rows, filters_,
                           act_ == Activation::kRelu, ctx.stream());
  const void* weight = half ? weight_.half.raw() : weight_.value.raw();
  conv_backward(st, it->second, x_, weight, weight_.value, weight_.grad, dx, kernels_);
}

}  // namespace mf
