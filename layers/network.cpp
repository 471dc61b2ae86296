// network.cpp: the layer stack: naming, shapes, the Keras-like summary, device and precision,
// forward and backward.
#include "layers/network.h"

#include <algorithm>
#include <cctype>
#include <sstream>
#include <stdexcept>

#include "layers/conv2d.h"
#include "layers/dense.h"
#include "layers/flatten.h"
#include "layers/maxpool2d.h"
#include "runtime/gpu_runtime.h"
#include "tensor/cast.h"
#include "tensor/rng.h"

namespace mf {

Network::Network() = default;
Network::~Network() = default;
Network::Network(Network&&) noexcept = default;
Network& Network::operator=(Network&&) noexcept = default;

void add_mnist_cnn(Network& m, Rng& rng, std::int64_t height, std::int64_t width, std::int64_t channels,
                   std::int64_t classes) {
  if (!m.layers().empty()) throw std::logic_error("add_mnist_cnn: the network already has layers");
  m.set_input_shape(Shape{height, width, channels});
  // add() names them as Keras does: conv2d, max_pooling2d, conv2d_1, ..., dense, dense_1.
  m.add(std::make_unique<Conv2D>(channels, 32, 3, Activation::kRelu, rng));
  m.add(std::make_unique<MaxPool2D>());
  m.add(std::make_unique<Conv2D>(32, 64, 3, Activation::kRelu, rng));
  m.add(std::make_unique<MaxPool2D>());
  m.add(std::make_unique<Flatten>());
  const Shape flat = m.output_shape(1);  // (1, 5*5*64) for 28x28 inputs
  m.add(std::make_unique<Dense>(flat[1], 64, Activation::kRelu, rng));
  m.add(std::make_unique<Dense>(64, classes, Activation::kNone, rng));
}

namespace {
// Keras's default name for a layer type: "Conv2D" -> "conv2d", "MaxPooling2D" ->
// "max_pooling2d" (an underscore before a capital that ends a lowercase run or starts one).
std::string snake_case(const std::string& type) {
  std::string out;
  for (std::size_t i = 0; i < type.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(type[i]);
    const bool starts_word = std::isupper(c) && i > 0 &&
                             (std::islower(static_cast<unsigned char>(type[i - 1])) ||
                              (i + 1 < type.size() && std::islower(static_cast<unsigned char>(type[i + 1]))));
    if (starts_word && out.back() != '_') out += '_';
    out += static_cast<char>(std::tolower(c));
  }
  return out;
}
}  // namespace

Layer& Network::add(std::unique_ptr<Layer> layer) {
  if (!layer) throw std::invalid_argument("Sequential::add: the layer is null");
  if (frozen_) throw std::logic_error("Sequential::add after compile()");
  const auto taken = [&](const std::string& name) {
    return std::any_of(layers_.begin(), layers_.end(), [&](const auto& l) { return l->name() == name; });
  };
  // A name keys the layer's saved weights ("conv2d/kernel"), so two alike would collide;
  // refused here, as Keras does, rather than when a checkpoint is first saved.
  if (!layer->name().empty() && taken(layer->name()))
    throw std::invalid_argument("Sequential::add: the model already has a layer named '" + layer->name() +
                                "'; layer names must be unique");
  if (layer->name().empty()) {
    // Unnamed layers would all save their weights as "/kernel" and "/bias".
    const std::string base = snake_case(layer->type());
    std::string name = base;
    for (int k = 1; taken(name); ++k) name = base + "_" + std::to_string(k);
    layer->set_name(name);
  }
  layer->to(device_);
  if (compute_dtype_ != DType::kF32) layer->set_compute_dtype(compute_dtype_);
  layer->set_kernel_options(kernels_);
  layer->set_needs_input_grad(!layers_.empty());  // nothing upstream of the first layer
  layers_.push_back(std::move(layer));
  return *layers_.back();
}

std::vector<Parameter*> Network::parameters() {
  std::vector<Parameter*> ps;
  for (auto& l : layers_)
    for (Parameter* p : l->parameters()) ps.push_back(p);
  return ps;
}

std::int64_t Network::num_params() {
  std::int64_t n = 0;
  for (auto& l : layers_) n += l->num_params();
  return n;
}

void Network::set_input_shape(const Shape& sample) { input_shape_ = sample; }

void Network::require_input_shape(const char* caller) const {
  if (input_shape_.rank() == 0)
    throw std::logic_error(std::string(caller) + ": the model has no input shape; call set_input_shape() first");
}

Shape Network::batch_shape(std::int64_t n) const {
  // Without it the first layer was asked about a batch of shape (n,) and its error blamed
  // the input ("Dense: expected input of shape (batch, 144), got (1,)").
  require_input_shape("Sequential");
  std::vector<std::int64_t> dims{n};
  for (auto d : input_shape_.dims()) dims.push_back(d);
  return Shape(dims);
}

Shape Network::output_shape(std::int64_t n) const {
  Shape s = batch_shape(n);
  for (const auto& l : layers_) s = l->output_shape(s);
  return s;
}

std::int64_t Network::largest_gpu_batch() const {
  std::int64_t largest = INT64_MAX;
  if (layers_.empty()) return largest;  // nothing limits it, input shape or not
  Shape s = batch_shape(1);
  for (const auto& l : layers_) {
    largest = std::min(largest, l->largest_gpu_batch(s));
    s = l->output_shape(s);
  }
  return largest;
}

void Network::check_gpu_batch(std::int64_t n) const {
  Shape s = batch_shape(n);
  for (const auto& l : layers_) {
    l->check_gpu_batch(s);
    s = l->output_shape(s);
  }
}

std::int64_t Network::gpu_inference_batch(std::int64_t asked) const {
  return std::max<std::int64_t>(1, std::min(asked, largest_gpu_batch()));
}

std::string Network::architecture() const {
  std::ostringstream os;
  os << "input" << input_shape_.str();
  Shape s = batch_shape(1);
  for (const auto& l : layers_) {
    s = l->output_shape(s);
    os << "|" << l->type() << "->" << s.str();
  }
  return os.str();
}

std::string Network::summary() const {
  // Rows first, so the name column can be as wide as the longest "name (Type)".
  Shape s = batch_shape(1);
  struct Row {
    std::string name, shape;
    std::int64_t params;
  };
  std::vector<Row> rows;
  std::int64_t total = 0;
  std::size_t name_w = 28, shape_w = 25;  // Keras's widths, wider when a row needs it
  for (const auto& l : layers_) {
    s = l->output_shape(s);
    std::string shape = "(None";
    for (int d = 1; d < s.rank(); ++d) shape += ", " + std::to_string(s[d]);
    const std::int64_t params = l->num_params();
    total += params;
    rows.push_back({l->name() + " (" + l->type() + ")", shape + ")", params});
    name_w = std::max(name_w, rows.back().name.size() + 2);
    shape_w = std::max(shape_w, rows.back().shape.size() + 2);
  }
  const std::string rule(name_w + shape_w + 12, '_'), thick(name_w + shape_w + 12, '=');
  std::ostringstream os;
  // One row, columns padded to their widths (any length: a fixed line buffer cut long names).
  const auto row = [&](const std::string& name, const std::string& shape, const std::string& params) {
    os << ' ' << name << std::string(name_w - name.size(), ' ') << shape << std::string(shape_w - shape.size(), ' ')
       << params << '\n';
  };
  os << "Model: \"sequential\"\n" << rule << "\n";
  row("Layer (type)", "Output Shape", "Param #");
  os << thick << "\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    row(rows[i].name, rows[i].shape, std::to_string(rows[i].params));
    os << (i + 1 < rows.size() ? "\n" : "");
  }
  os << thick << "\n";
  auto with_commas = [](std::int64_t v) {
    std::string d = std::to_string(v), out;
    for (std::size_t i = 0; i < d.size(); ++i) {
      if (i && (d.size() - i) % 3 == 0) out += ',';
      out += d[i];
    }
    return out;
  };
  os << "Total params: " << with_commas(total) << "\n";
  os << "Trainable params: " << with_commas(total) << "\n";
  os << "Non-trainable params: 0\n" << rule << "\n";
  return os.str();
}

void Network::set_kernel_options(const KernelOptions& options) {
  kernels_ = options;
  for (auto& l : layers_) l->set_kernel_options(options);
  device_or_dtype_changed();  // a captured step holds the old rung's kernels
}

void Network::to(Device device) {
  if (frozen_) throw std::logic_error("Sequential::to after compile(): move the model first");
  if (device == Device::kCpu && compute_dtype_ == DType::kF16)
    throw std::invalid_argument("Sequential::to(cpu): the model computes in FP16 (mixed precision), which runs on "
                                "the GPU only; set_compute_dtype(f32) first");
  // A layer that cannot move (no GPU, out of memory) throws; it and the layers moved before
  // it go back (a layer moves back whichever of its tensors had moved), so that the model
  // stays whole on its device and usable there.
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    try {
      layers_[i]->to(device);
    } catch (...) {
      for (std::size_t j = 0; j <= i; ++j) layers_[j]->to(device_);
      throw;
    }
  }
  device_ = device;
  device_or_dtype_changed();
}

void Network::set_compute_dtype(DType dtype) {
  if (frozen_) throw std::logic_error("Sequential::set_compute_dtype after compile()");
  if (dtype == DType::kF16 && device_ != Device::kGpu)
    throw std::invalid_argument("FP16 (mixed precision) runs on the GPU only: the CPU path computes in FP32");
  for (auto& l : layers_) l->set_compute_dtype(dtype);
  compute_dtype_ = dtype;
  device_or_dtype_changed();
}

void Network::set_training(bool training) {
  for (auto& l : layers_) l->set_training(training);
}

const Tensor& Network::forward(const Tensor& x) {
  refresh_half_weights();
  return forward_layers(x);
}

const Tensor& Network::forward_layers(const Tensor& x) {
  if (layers_.empty()) throw std::logic_error("Network::forward of an empty model");
  const Tensor* h = &x;
  const bool watch = watches_buffers();
  std::vector<const void*> outputs;  // only for a trainer whose graphs may hold them
  for (auto& l : layers_) {
    h = &l->forward(*h);
    if (watch) outputs.push_back(h->raw());
  }
  if (watch) buffers_written(outputs, 0);
  return *h;
}

void Network::backward(const Tensor& dlogits) {
  const Tensor* g = &dlogits;
  const bool watch = watches_buffers();
  std::vector<const void*> grads;
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
    g = &(*it)->backward(*g);
    if (watch) grads.push_back(g->raw());
  }
  if (watch) buffers_written(grads, layers_.size());
}

std::int64_t Network::loss_classes(const char* caller) const {
  if (layers_.empty()) throw std::logic_error(std::string("Sequential::") + caller + " of an empty model");
  const Shape out = output_shape(1);
  if (out.rank() != 2)
    throw std::invalid_argument(std::string(caller) + ": the model's output for one image is " + out.str() +
                                ", not (1, classes): the loss needs one row of class scores per image (end the "
                                "model with a Flatten then a Dense layer)");
  return out[1];
}

void Network::refresh_half_weights() {
  if (compute_dtype_ != DType::kF16) return;
  const GpuStream s = compute_stream();
  for (Parameter* p : parameters())
    if (p->half.defined()) launch_cast_f32_to_f16(p->value.data<float>(), p->half.data<Half>(), p->value.numel(), s);
}

}  // namespace mf
