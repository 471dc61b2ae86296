// network.h: the model as a stack of layers: add(), summary(), forward(), backward(), on
// either device and in either precision. Training it (compile, fit, evaluate, predict, as
// Keras's Sequential does) is train/sequential.h's job, built on this class.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "layers/layer.h"

namespace mf {

class Rng;

class Network {
 public:
  Network();
  virtual ~Network();
  Network(Network&&) noexcept;
  Network& operator=(Network&&) noexcept;

  // Appends a layer. One without a name gets Keras's: its type in snake case, numbered
  // from the second of a kind on ("conv2d", "max_pooling2d", "conv2d_1"). Numbers count
  // within this model, not across every model built so far as in a Keras session, so a
  // model's names (and the keys of its saved weights) do not depend on what came before it.
  // A name already in the model throws std::invalid_argument.
  Layer& add(std::unique_ptr<Layer> layer);
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }
  std::vector<Parameter*> parameters();
  std::int64_t num_params();

  // The sample shape (without batch) the model takes, e.g. (28, 28, 1).
  void set_input_shape(const Shape& sample);
  const Shape& input_shape() const { return input_shape_; }
  // (n, H, W, C): the input shape of a batch of n. Throws std::logic_error when the model
  // has no input shape yet, and so do the calls that need it (summary(), architecture(),
  // output_shape(), and the training calls).
  Shape batch_shape(std::int64_t n) const;
  Shape output_shape(std::int64_t n) const;  // the last layer's output for a batch of n
  // Throws std::logic_error "<caller>: the model has no input shape; call set_input_shape()
  // first" when it has none.
  void require_input_shape(const char* caller) const;
  // The largest batch every layer runs on the GPU: cuDNN's tensors hold at most 2^31 - 1
  // elements, 99,273 images for the MNIST model (its first convolution's output).
  std::int64_t largest_gpu_batch() const;
  // Throws the layer's error (Layer::check_gpu_batch) when a batch of n is too large for
  // the GPU, before anything is allocated.
  void check_gpu_batch(std::int64_t n) const;
  // The batch inference runs on the GPU when `asked` for: split to what every layer takes,
  // and at least 1, so that a model too large for even one sample gets the layer's error
  // rather than a loop over batches of 0.
  std::int64_t gpu_inference_batch(std::int64_t asked) const;
  // The number of classes a loss sees: the model's output must be (N, classes), else
  // std::invalid_argument naming `caller`. The GPU's loss kernel is given the output's
  // second dimension as the class count and would read any other shape as rows of it.
  std::int64_t loss_classes(const char* caller) const;
  // A short string naming the layers and their sizes; checkpoints compare it.
  std::string architecture() const;

  // Keras's model.summary(): layer, output shape, parameter count, totals.
  std::string summary() const;

  // Device and precision. FP16 exists on the GPU only (mixed precision: f16 activations
  // and weight copies, f32 masters in the optimizer): set_compute_dtype(f16) needs the model
  // on the GPU, and to(cpu) an f32 model. When a layer cannot move (no GPU, out of memory),
  // to() throws its error and the model stays whole on the device it was on.
  void to(Device device);
  Device device() const { return device_; }
  void set_compute_dtype(DType dtype);
  DType compute_dtype() const { return compute_dtype_; }
  // Mixed precision: the layers compute with f16 copies of the weights (Parameter::half).
  // This remakes them from the f32 masters (value), queued on the compute stream; forward()
  // calls it first, so weights loaded with value.copy_from() are the ones used. Nothing to
  // do in FP32.
  void refresh_half_weights();
  // How every layer computes (kernels/kernel_options.h): the rung of the kernel ladder and
  // the convolutions' settings. Layers added later get these too. May change between fits:
  // what a trainer captured for the old ones is dropped.
  void set_kernel_options(const KernelOptions& options);
  const KernelOptions& kernel_options() const { return kernels_; }
  // The rung the layers run on the model's device now (kDefault resolved).
  KernelRung rung() const { return resolve_rung(kernels_.rung, device_); }
  void set_training(bool training);

  // Logits for a batch x (N, H, W, C) on the model's device; the buffer is the last
  // layer's (valid until the next forward).
  const Tensor& forward(const Tensor& x);
  // forward() without refresh_half_weights(): for loops over batches that refreshed once.
  const Tensor& forward_layers(const Tensor& x);
  // Back-propagates d loss / d logits through every layer, accumulating gradients.
  void backward(const Tensor& dlogits);

 protected:
  // Set by a trainer that packed the parameters (train/sequential.h's compile()): layers can
  // no longer be added, moved or change precision.
  bool frozen_ = false;
  // After forward() or backward() ran outside a training step: `addrs` are the buffers
  // they wrote, from the step's position `first` (forward outputs, then input gradients from
  // the last layer back). A trainer whose CUDA graphs hold addresses checks them here.
  virtual void buffers_written(const std::vector<const void*>& addrs, std::size_t first) {}
  // Whether buffers_written() wants the addresses (collecting them costs a vector a call).
  virtual bool watches_buffers() const { return false; }
  // After to() or set_compute_dtype(): what a trainer kept for the old device or precision
  // is stale.
  virtual void device_or_dtype_changed() {}

  std::vector<std::unique_ptr<Layer>> layers_;

 private:
  Shape input_shape_;
  Device device_ = Device::kCpu;
  DType compute_dtype_ = DType::kF32;
  KernelOptions kernels_;
};

// Adds the article's model (section 3.3) for (H, W, C) inputs and `classes` outputs to an
// empty network, and sets its input shape.
void add_mnist_cnn(Network& m, Rng& rng, std::int64_t height = 28, std::int64_t width = 28, std::int64_t channels = 1,
                   std::int64_t classes = 10);

// Inference mode (layers keep nothing for a backward pass) for its lifetime; when it ends,
// also by an exception, each layer gets back the mode it had before. So an inference loop
// inside a caller's own InferenceMode, or after set_training(false), leaves the model in
// inference mode, and training mode stays training mode.
class InferenceMode {
 public:
  explicit InferenceMode(Network& m) : m_(m) {
    for (const auto& l : m_.layers()) was_training_.push_back(l->training());
    m_.set_training(false);
  }
  ~InferenceMode() {
    const auto& layers = m_.layers();
    for (std::size_t i = 0; i < layers.size() && i < was_training_.size(); ++i)
      layers[i]->set_training(was_training_[i]);
  }
  InferenceMode(const InferenceMode&) = delete;
  InferenceMode& operator=(const InferenceMode&) = delete;

 private:
  Network& m_;
  std::vector<bool> was_training_;  // per layer, in order
};

}  // namespace mf
