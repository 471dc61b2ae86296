// dense.h: fully connected layer y = act(x W + b), optional fused ReLU.
#pragma once
#include <memory>

#include "layers/layer.h"

namespace mf {

struct DenseGpuState;  // cuBLAS settings (dense_gpu.cu)

class Dense final : public Layer {
 public:
  // kernel: (in, units) as Keras stores it, Glorot-uniform; bias: (units), zero.
  Dense(std::int64_t in_features, std::int64_t units, Activation act, Rng& rng);
  ~Dense() override;
  std::string type() const override { return "Dense"; }
  // x: (N, in) -> y: (N, units)
  Shape output_shape(const Shape& in) const override;
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  std::string gpu_config() const override;
  std::string cpu_config() const override;

  std::int64_t in_features() const { return in_; }
  std::int64_t units() const { return units_; }
  Activation activation() const { return act_; }
  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }

 protected:
  void forward_cpu(const Tensor& x, Tensor& y) override;   // Eigen GEMM
  void backward_cpu(const Tensor& dy, Tensor& dx) override;
#if MF_WITH_CUDA
  void forward_gpu(const Tensor& x, Tensor& y) override;   // cuBLAS (GemmEx in FP16)
  void backward_gpu(const Tensor& dy, Tensor& dx) override;
#endif

 private:
  std::int64_t in_, units_;
  Activation act_;
  Parameter weight_, bias_;
  void backward_tiled(Tensor& dx);  // CPU, units and inputs multiples of the vector width
  Tensor dz_;  // CPU: dy masked by ReLU
  const char* cpu_forward_ = nullptr;   // what the CPU ran last, for cpu_config()
  const char* cpu_backward_ = nullptr;
  // Deleted through the function dense_gpu.cu sets with the state: this header (and
  // dense.cpp, whose constructor may throw) only sees DenseGpuState declared.
  std::unique_ptr<DenseGpuState, void (*)(DenseGpuState*)> gpu_{nullptr, nullptr};
};

}  // namespace mf
