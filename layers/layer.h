// layer.h: the Layer interface. Each layer owns its CPU path (<layer>_cpu.cpp) and its GPU
// path (<layer>_gpu.cu) side by side; the public forward()/backward() check shapes and
// dtypes, then dispatch on the device of the input.
//
// Layout: activations are NHWC (batch, height, width, channels), as in Keras; the GPU's
// FP16 Tensor Core convolutions want exactly this layout, so no conversions are needed
// anywhere. Flatten therefore orders features (h, w, c), like Keras.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kernel_options.h"
#include "tensor/tensor.h"

namespace mf {

class Rng;

// cuDNN's limit: a tensor descriptor describes at most 2^31 - 1 elements.
constexpr std::int64_t kCudnnMaxElements = INT32_MAX;

// A trainable tensor. The optimizer owns the update; layers only read `value` (or `half`)
// and accumulate into `grad`. Its attach() makes value and grad views of its own buffers:
// load new values with value.copy_from(), as a tensor put in their place is not updated.
struct Parameter {
  std::string name;  // "kernel" or "bias", as Keras names them
  Tensor value;      // f32: the master copy
  Tensor grad;       // same shape as value; dtype of the compute (f32, or f16 in --fp16 on the GPU)
  Tensor half;       // f16 copy of value for FP16 compute (Sequential remakes it from value
                     // before it computes); undefined in FP32
};

enum class Activation { kNone, kRelu };

class Layer {
 public:
  Layer() = default;
  virtual ~Layer() = default;
  // Not copyable: a copy would share the original's buffers (Tensors are handles), so that
  // a forward of either overwrote the other's output and the winners its backward reads.
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  virtual std::string type() const = 0;  // "Conv2D", as Keras's summary shows it
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }
  // "Conv2D 'conv2d_1'" (the type alone while unnamed): how errors name the layer.
  std::string label() const;

  // Output shape for an input of shape `in` (first dimension: batch). Throws
  // std::invalid_argument naming the expected and the given shape when `in` does not fit.
  virtual Shape output_shape(const Shape& in) const = 0;
  virtual std::vector<Parameter*> parameters() { return {}; }
  std::int64_t num_params();

  // y = layer(x). The result lives in a buffer the layer owns and reuses: it stays valid
  // until the next forward() of this layer (clone() it to keep it). In training mode the
  // layer keeps a reference to x (not a copy) for backward().
  const Tensor& forward(const Tensor& x);
  // dx = d loss / dx for the dy = d loss / dy of the last forward(); ACCUMULATES parameter
  // gradients into Parameter::grad (the optimizer zeroes them). Returns an undefined
  // tensor when input gradients are switched off (the first layer needs none).
  const Tensor& backward(const Tensor& dy);

  // How this layer computes: the rung of the kernel ladder and the convolution settings
  // (kernels/kernel_options.h). Network::set_kernel_options() sets every layer's. A rung the
  // layer's device lacks makes forward() throw std::invalid_argument naming it.
  virtual void set_kernel_options(const KernelOptions& options) { kernels_ = options; }
  const KernelOptions& kernel_options() const { return kernels_; }
  // The rung forward() and backward() run on the layer's device now.
  KernelRung rung() const { return resolve_rung(kernels_.rung, device_); }

  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }
  void set_needs_input_grad(bool needs) { needs_input_grad_ = needs; }
  bool needs_input_grad() const { return needs_input_grad_; }

  // Moves parameters (values and gradients) to `device`; activations follow the input.
  // Throws std::invalid_argument for the CPU while the layer computes in FP16.
  virtual void to(Device device);
  Device device() const { return device_; }

  // FP16 compute: makes f16 copies of the weights (parameters' `half`) and f16 gradient
  // buffers on the GPU. The optimizer keeps the f32 masters and refreshes the copies.
  // Throws std::invalid_argument for f16 on a layer that is not on the GPU.
  virtual void set_compute_dtype(DType dtype);
  DType compute_dtype() const { return compute_dtype_; }

  // True for layers whose output is a view of their input (Flatten): forward() then
  // allocates no output buffer for them.
  virtual bool output_is_view() const { return false; }

  // Device buffers of the layer's own, other than its output and input gradient, that a
  // training step writes or reads (MaxPool2D's record of each window's winner). A captured
  // step holds their addresses, so the model drops its graphs when one of them has moved.
  virtual void step_buffers(std::vector<const void*>& out) const { (void)out; }

  // One line on how the GPU runs this layer (algorithm, workspace, math mode), for
  // --verbose; empty when there is nothing to say.
  virtual std::string gpu_config() const { return ""; }
  // The same for the CPU: which kernels ran this layer last (for a convolution's backward,
  // also how sparse its output gradient was). Empty when there is nothing to say.
  virtual std::string cpu_config() const { return ""; }

  // The most elements one input or output tensor of this layer may have on the GPU. Our
  // own kernels index with 64 bits and take any size; cuDNN's tensor descriptors hold at
  // most 2^31 - 1 elements (kCudnnMaxElements), so the convolution overrides this.
  virtual std::int64_t gpu_max_tensor_elements() const { return INT64_MAX; }
  // The largest batch this layer runs on the GPU for inputs shaped like `in` (its batch
  // dimension is ignored); 0 when not even one sample fits.
  std::int64_t largest_gpu_batch(const Shape& in) const;
  // Throws std::invalid_argument, naming the layer, the tensor size and the largest batch
  // that fits, when a batch of shape `in` is too large for the GPU. forward() calls it on
  // the GPU before allocating anything.
  void check_gpu_batch(const Shape& in) const;

 protected:
  // y is allocated by forward() with output_shape(x) and x's dtype and device. Overwrite it.
  virtual void forward_cpu(const Tensor& x, Tensor& y) = 0;
  virtual void forward_gpu(const Tensor& x, Tensor& y);
  // dx (undefined when !needs_input_grad()) has the input's shape. Overwrite it.
  virtual void backward_cpu(const Tensor& dy, Tensor& dx) = 0;
  virtual void backward_gpu(const Tensor& dy, Tensor& dx);

  // Checks `in` has rank `rank` and, where `expected[i] >= 0`, those dimensions.
  void check_input(const Shape& in, const std::vector<std::int64_t>& expected) const;

  Tensor x_;          // the input of the last forward (shared with the previous layer)
  Tensor y_, dx_;     // reused output and input-gradient buffers
  bool training_ = true;
  bool needs_input_grad_ = true;
  bool forward_done_ = false;
  Device device_ = Device::kCpu;
  DType compute_dtype_ = DType::kF32;
  KernelOptions kernels_;
  std::string name_;
};

// Keras's glorot_uniform: U(-l, l) with l = sqrt(6 / (fan_in + fan_out)).
void glorot_uniform(Tensor& w, std::int64_t fan_in, std::int64_t fan_out, Rng& rng);

}  // namespace mf
