// conv2d.cpp: Conv2D construction, shapes and device moves (the paths are in conv2d_cpu.cpp
// and conv2d_gpu.cu).
#include "layers/conv2d.h"

#include <stdexcept>

#include "tensor/rng.h"

namespace mf {

Conv2D::Conv2D(std::int64_t in_channels, std::int64_t filters, std::int64_t kernel_size, Activation act, Rng& rng)
    : in_channels_(in_channels), filters_(filters), k_(kernel_size), act_(act) {
  if (in_channels < 1 || filters < 1 || kernel_size < 1)
    throw std::invalid_argument("Conv2D: channels, filters and kernel size must be positive");
  weight_.name = "kernel";
  weight_.value = Tensor::empty({filters, kernel_size, kernel_size, in_channels});
  glorot_uniform(weight_.value, kernel_size * kernel_size * in_channels, kernel_size * kernel_size * filters, rng);
  weight_.grad = Tensor::zeros(weight_.value.shape());
  bias_.name = "bias";
  bias_.value = Tensor::zeros({filters});
  bias_.grad = Tensor::zeros({filters});
}

Shape Conv2D::output_shape(const Shape& in) const {
  check_input(in, {-1, -1, -1, in_channels_});
  if (in[1] < k_ || in[2] < k_)
    throw std::invalid_argument(label() + ": input " + in.str() + " is smaller than the " + std::to_string(k_) + "x" +
                                std::to_string(k_) + " kernel");
  return Shape{in[0], in[1] - k_ + 1, in[2] - k_ + 1, filters_};
}

}  // namespace mf

#if !MF_WITH_CUDA
namespace mf {
struct ConvGpuState {};
void ConvGpuStateDeleter::operator()(ConvGpuState* s) const { delete s; }
Conv2D::~Conv2D() = default;
std::string Conv2D::gpu_config() const { return ""; }
void Conv2D::to(Device device) { Layer::to(device); }
void Conv2D::set_compute_dtype(DType dtype) { Layer::set_compute_dtype(dtype); }
void Conv2D::set_kernel_options(const KernelOptions& options) { Layer::set_kernel_options(options); }
}  // namespace mf
#endif
