// layer.cpp: the checks and device dispatch shared by every layer.
#include "layers/layer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "tensor/rng.h"

namespace mf {

std::string Layer::label() const { return type() + (name_.empty() ? "" : " '" + name_ + "'"); }

std::int64_t Layer::num_params() {
  std::int64_t n = 0;
  for (Parameter* p : parameters()) n += p->value.numel();
  return n;
}

void Layer::check_input(const Shape& in, const std::vector<std::int64_t>& expected) const {
  bool ok = in.rank() == static_cast<int>(expected.size());
  for (int i = 0; ok && i < in.rank(); ++i) ok = expected[i] < 0 || expected[i] == in[i];
  if (!ok) {
    std::string want = "(";
    for (std::size_t i = 0; i < expected.size(); ++i)
      want += (i ? ", " : "") + (expected[i] < 0 ? std::string(i == 0 ? "batch" : "any") : std::to_string(expected[i]));
    want += ")";
    throw std::invalid_argument(label() +
                                ": expected input of shape " + want + ", got " + in.str());
  }
}

std::int64_t Layer::largest_gpu_batch(const Shape& in) const {
  std::vector<std::int64_t> dims = in.dims();
  dims.at(0) = 1;
  const Shape one(dims);
  const std::int64_t per_sample = std::max(one.numel(), output_shape(one).numel());
  return per_sample == 0 ? INT64_MAX : gpu_max_tensor_elements() / per_sample;
}

void Layer::check_gpu_batch(const Shape& in) const {
  const Shape out = output_shape(in);
  if (std::max(in.numel(), out.numel()) <= gpu_max_tensor_elements()) return;  // the batch fits
  const std::int64_t largest = largest_gpu_batch(in), n = in[0];
  const bool input_larger = in.numel() > out.numel();
  throw std::invalid_argument(
      label() + ": a batch of " + std::to_string(n) + " gives " +
      (input_larger ? "an input " + in.str() : "an output " + out.str()) + " of " +
      std::to_string(std::max(in.numel(), out.numel())) + " elements, more than the " +
      std::to_string(gpu_max_tensor_elements()) + " the GPU takes in one tensor here (cuDNN's limit); " +
      (largest > 0 ? "use batches of at most " + std::to_string(largest)
                   : std::string("even one sample is too large")));
}

const Tensor& Layer::forward(const Tensor& x) {
  if (!x.defined()) throw std::invalid_argument(label() + ": forward of an undefined tensor");
  if (x.device() != device_)
    throw std::invalid_argument(label() + ": input is on the " + device_name(x.device()) +
                                " but the layer's parameters are on the " + device_name(device_) +
                                " (call to(Device) on the model first)");
  const DType want = device_ == Device::kGpu ? compute_dtype_ : DType::kF32;
  if (x.dtype() != want)
    throw std::invalid_argument(label() + ": input is " + dtype_name(x.dtype()) + ", this layer computes in " +
                                dtype_name(want));
  // The output buffer y_ is resized and overwritten below, so an input living in it (the
  // tensor the last forward returned, or a slice of it) would be read while it is being
  // written, or after it is gone: a wrong result with no error. A view layer (Flatten)
  // writes no buffer of its own, so its output may come back in.
  if (!output_is_view() && y_.shares_storage(x))
    throw std::invalid_argument(label() + ": the input is this layer's own output buffer, which this forward would "
                                         "overwrite; pass a copy (clone())");
  const Shape out = output_shape(x.shape());
  require_rung(kernels_.rung, device_, label());
  if (device_ == Device::kGpu) check_gpu_batch(x.shape());
  if (!output_is_view()) ensure(y_, out, x.dtype(), x.device());
  // An empty output (a batch of 0) has nothing to compute; cuDNN refuses tensors with a
  // dimension of 0, so the GPU convolution would fail where the CPU path returns nothing.
  if (out.numel() > 0 || output_is_view()) {
    if (device_ == Device::kCpu) forward_cpu(x, y_);
    else forward_gpu(x, y_);
  }
  x_ = training_ ? x : Tensor();
  forward_done_ = training_;
  return y_;
}

const Tensor& Layer::backward(const Tensor& dy) {
  if (!forward_done_)
    throw std::logic_error(label() + ": backward() without a forward() in training mode");
  const Shape out = output_shape(x_.shape());
  if (!dy.defined() || dy.shape() != out || dy.dtype() != y_.dtype() || dy.device() != device_)
    throw std::invalid_argument(label() + ": gradient " + dy.describe() +
                                " does not match the output " + y_.describe());
  if (!needs_input_grad_) dx_ = Tensor();
  else if (!output_is_view()) ensure(dx_, x_.shape(), x_.dtype(), x_.device());
  else dx_ = x_;  // marks "wanted"; the view layer replaces it
  // dx_ is written below while dy is read, so a dy living in it (the tensor the last backward
  // returned, or a view of it) would be overwritten while it is being read: a wrong gradient
  // with no error, as for forward's own output above. (No dx_ wanted: it is undefined and
  // shares nothing.)
  if (!output_is_view() && dx_.shares_storage(dy))
    throw std::invalid_argument(label() + ": the gradient is this layer's own input-gradient buffer, which this "
                                         "backward would overwrite; pass a copy (clone())");
  // No gradient to pass back (a batch of 0): dx is empty and the parameters' gradients
  // get nothing, as forward() computed nothing.
  if (dy.numel() == 0 && x_.numel() == 0 && !output_is_view()) return dx_;
  if (device_ == Device::kCpu) backward_cpu(dy, dx_);
  else backward_gpu(dy, dx_);
  return dx_;
}

void Layer::forward_gpu(const Tensor&, Tensor&) {
  throw std::logic_error(type() + " has no GPU path");
}
void Layer::backward_gpu(const Tensor&, Tensor&) {
  throw std::logic_error(type() + " has no GPU path");
}

void Layer::to(Device device) {
  // On the CPU the f16 gradients and weight copies would stay, and the CPU path (f32 only)
  // failed at its first backward with "tensor holds f16, accessed as f32".
  if (device == Device::kCpu && compute_dtype_ == DType::kF16)
    throw std::invalid_argument(label() +
                                ": computes in FP16, which runs on the GPU only; set_compute_dtype(f32) before "
                                "moving it to the CPU");
  for (Parameter* p : parameters()) {
    if (p->value.device() != device) p->value = p->value.to(device);
    if (p->grad.defined() && p->grad.device() != device) p->grad = p->grad.to(device);
    if (p->half.defined() && p->half.device() != device) p->half = p->half.to(device);
  }
  device_ = device;
  x_ = y_ = dx_ = Tensor();
  forward_done_ = false;
}

void Layer::set_compute_dtype(DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kF16)
    throw std::invalid_argument("compute dtype must be f32 or f16");
  if (dtype == DType::kF16 && device_ != Device::kGpu)
    throw std::invalid_argument(label() +
                                ": FP16 (mixed precision) runs on the GPU only; move the layer there first");
  // Already so: nothing to remake. Fresh gradient buffers would not be the ones a compiled
  // model's optimizer reads, and the layer would stop training without a word.
  if (dtype == compute_dtype_) return;
  compute_dtype_ = dtype;
  for (Parameter* p : parameters()) {
    if (dtype == DType::kF16) {
      p->half = p->value.to(DType::kF16);
      p->grad = Tensor::zeros(p->value.shape(), DType::kF16, p->value.device());
    } else {
      p->half = Tensor();
      p->grad = Tensor::zeros(p->value.shape(), DType::kF32, p->value.device());
    }
  }
  x_ = y_ = dx_ = Tensor();
  forward_done_ = false;
}

void glorot_uniform(Tensor& w, std::int64_t fan_in, std::int64_t fan_out, Rng& rng) {
  const float limit = std::sqrt(6.0f / static_cast<float>(fan_in + fan_out));
  float* p = w.data<float>();
  for (std::int64_t i = 0; i < w.numel(); ++i) p[i] = rng.uniform(-limit, limit);
}

}  // namespace mf
