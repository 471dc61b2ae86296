// conv2d.h: 2-D convolution, NHWC activations, stride 1, "valid" padding, optional fused ReLU.
#pragma once
#include <memory>

#include "layers/layer.h"

namespace mf {

struct ConvGpuState;  // cuDNN descriptors and chosen algorithms (conv2d_gpu.cu)

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
  void forward_direct(const Tensor& x, Tensor& y);  // few inputs per output: no GEMM
  void backward_direct_3x3x1(const Tensor& dy);     // 3x3 kernel, 1 channel, 32 filters, no dx
  void forward_implicit(const Tensor& x, Tensor& y);  // register-tiled implicit GEMM
  void backward_implicit(const Tensor& dy, Tensor& dx);
  std::int64_t in_channels_, filters_, k_;
  Activation act_;
  Parameter weight_, bias_;
  std::vector<float> scratch_;   // CPU: per-thread im2col and gradient buffers
  // CPU backward: the output gradient's nonzero entries, pixel by pixel (conv2d_cpu.cpp)
  // and, per thread, the same entries regrouped by filter
  std::vector<float> nz_val_;
  std::vector<std::int32_t> nz_idx_;
  std::vector<std::int64_t> nz_rows_;
  // What the CPU ran last, for cpu_config(), and how sparse dZ was when the implicit
  // backward listed its nonzeros: threads' shares done sparse (of all), the fraction of dZ
  // entries nonzero and the threshold below which a share goes sparse.
  const char* cpu_forward_ = nullptr;
  const char* cpu_backward_ = nullptr;
  struct Sparsity {
    int sparse_shares = 0, shares = 0;
    double nonzero = 0, threshold = 0;
  } sparsity_;
  // Deleted through the function conv2d_gpu.cu sets with the state: this header (and
  // conv2d.cpp, whose constructor may throw) only sees ConvGpuState declared.
  std::unique_ptr<ConvGpuState, void (*)(ConvGpuState*)> gpu_{nullptr, nullptr};
};

}  // namespace mf
