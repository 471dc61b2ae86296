// conv2d.h: 2-D convolution, NHWC activations, stride 1, "valid" padding, optional fused ReLU.
#pragma once
#include <memory>

#include "kernels/cpu/conv2d.h"
#include "kernels/naive_index.h"
#include "layers/layer.h"

namespace mf {

struct ConvGpuState;  // cuDNN descriptors and chosen algorithms (kernels/gpu/cudnn_conv.h)
struct ConvGpuStateDeleter {
  void operator()(ConvGpuState* s) const;
};

class Conv2D final : public Layer {
 public:
  // kernel: (filters, kernel, kernel, in_channels), "OHWI" (cuDNN's NHWC filter layout),
  // Glorot-uniform with Keras's fans (fan_in = k*k*in, fan_out = k*k*filters); bias zero.
  Conv2D(std::int64_t in_channels, std::int64_t filters, std::int64_t kernel_size, Activation act, Rng& rng);
  ~Conv2D() override;

  std::string type() const override { return "Conv2D"; }
  // x: (N, H, W, C) -> y: (N, H-k+1, W-k+1, filters)
  Shape output_shape(const Shape& in) const override;
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  std::string gpu_config() const override;
  std::string cpu_config() const override;
  std::int64_t gpu_max_tensor_elements() const override { return kCudnnMaxElements; }  // cuDNN runs it
  void to(Device device) override;
  void set_compute_dtype(DType dtype) override;
  void set_kernel_options(const KernelOptions& options) override;

  std::int64_t in_channels() const { return in_channels_; }
  std::int64_t filters() const { return filters_; }
  std::int64_t kernel_size() const { return k_; }
  Activation activation() const { return act_; }
  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }

 protected:
  void forward_cpu(const Tensor& x, Tensor& y) override;    // direct, implicit GEMM or im2col + Eigen
  void backward_cpu(const Tensor& dy, Tensor& dx) override;
#if MF_WITH_CUDA
  void forward_gpu(const Tensor& x, Tensor& y) override;    // cuDNN + fused bias/ReLU kernel
  void backward_gpu(const Tensor& dy, Tensor& dx) override;
#endif

 private:
  // The sizes the naive rung's loops and kernels index with (kernels/naive_index.h).
  naive::Conv naive_sizes(const Tensor& x) const {
    return naive::conv_sizes(x.dim(0), x.dim(1), x.dim(2), x.dim(3), k_, filters_);
  }
  std::int64_t in_channels_, filters_, k_;
  Activation act_;
  Parameter weight_, bias_;
  cpu::ConvCpuState cpu_;  // the CPU kernels' buffers and what they ran last
  std::unique_ptr<ConvGpuState, ConvGpuStateDeleter> gpu_;
};

}  // namespace mf
