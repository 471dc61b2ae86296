// sequential.h: a stack of layers trained with softmax cross-entropy, Keras-style:
// summary(), compile(optimizer), fit(), evaluate(), predict().
#pragma once
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "data/mnist.h"
#include "layers/layer.h"
#include "layers/optimizer.h"

namespace mf {

class GpuTrainer;  // the GPU training loop (sequential_gpu.cu)

// How batches reach the GPU (--pipeline). The article's tf.data lesson, three ways.
enum class Pipeline {
  kAuto,      // resident on the GPU, host (no copies) on the CPU
  kResident,  // whole u8 dataset on the device; a device-side permutation picks batches
  kPrefetch,  // pinned host buffers, copies on their own stream, double buffered
  kNaive,     // a pageable copy each step, waited for (the article's slow example)
};
const char* pipeline_name(Pipeline p);

struct FitOptions {
  int epochs = 5;
  std::int64_t batch_size = 64;
  std::uint64_t seed = 0;          // the shuffle of every epoch derives from it
  int initial_epoch = 0;           // resuming: epochs [initial_epoch, epochs) are run
  Pipeline pipeline = Pipeline::kAuto;
  bool use_graph = true;           // GPU: replay the step as a CUDA graph (--no-graph: eager)
  double progress_interval_s = 0.1;  // how often on_progress may be called
};

struct EpochLog {
  int epoch = 0;  // 0-based
  double loss = 0, accuracy = 0;          // training, averaged over the epoch's samples
  double val_loss = 0, val_accuracy = 0;  // NaN when there is no validation set
  double train_seconds = 0;               // the training loop only (no validation)
  std::int64_t steps = 0;
  std::int64_t samples = 0;               // images trained on
  double loss_scale = 0;                  // FP16: the dynamic loss scale at the end of the epoch
  std::int64_t skipped_steps = 0;         // FP16: steps skipped for inf/NaN gradients
};

struct Progress {
  int epoch = 0;
  std::int64_t step = 0, steps = 0;  // step: batches done in this epoch
  double loss = 0, accuracy = 0;     // running means over the batches done
  double elapsed_s = 0;
};

struct FitCallbacks {
  std::function<void(const Progress&)> on_progress;      // at most every progress_interval_s
  std::function<void(const EpochLog&)> on_epoch_end;
  std::function<bool()> should_stop;                      // checked after each step (Ctrl-C)
};

struct History {
  std::vector<EpochLog> epochs;
  bool interrupted = false;  // should_stop() asked to stop; the last epoch may be partial
  int completed_epochs = 0;  // epochs fully trained (including initial_epoch)

  // Stopped inside an epoch: the last of `epochs` is that epoch, cut short and not counted
  // in completed_epochs. False when the stop came at an epoch's last step.
  bool ended_mid_epoch() const { return interrupted && !epochs.empty() && epochs.back().epoch == completed_epochs; }
};

// The mean loss and the accuracy over `count` images; with no images (count 0) they are not
// known: NaN, rather than a loss of 0 and an accuracy of 0 that read as results.
struct EvalResult {
  double loss = std::numeric_limits<double>::quiet_NaN(), accuracy = std::numeric_limits<double>::quiet_NaN();
  std::int64_t count = 0;
};

// A non-finite training loss (NaN or inf in FP32): training stops with this error.
class NonFiniteLossError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Sequential {
 public:
  Sequential();
  ~Sequential();
  Sequential(Sequential&&) noexcept;
  Sequential& operator=(Sequential&&) noexcept;

  // Builds the article's model (section 3.3) for (H, W, C) inputs and `classes` outputs.
  static Sequential mnist_cnn(Rng& rng, std::int64_t height = 28, std::int64_t width = 28,
                              std::int64_t channels = 1, std::int64_t classes = 10);

  // Appends a layer. One without a name gets Keras's: its type in snake case, numbered
  // from the second of a kind on ("conv2d", "max_pooling2d", "conv2d_1"). Numbers count
  // within this model, not across every model built so far as in a Keras session, so a
  // model's names (and the keys of its saved weights) do not depend on what came before it.
  // A name already in the model throws std::invalid_argument (so does compile(), for a
  // layer renamed after add() into another's name).
  Layer& add(std::unique_ptr<Layer> layer);
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }
  std::vector<Parameter*> parameters();
  std::int64_t num_params();

  // The sample shape (without batch) the model takes, e.g. (28, 28, 1).
  void set_input_shape(const Shape& sample);
  const Shape& input_shape() const { return input_shape_; }
  // (n, H, W, C): the input shape of a batch of n. Throws std::logic_error when the model
  // has no input shape yet, and so do the calls that need it (summary(), architecture(),
  // output_shape(), fit(), evaluate(), predict()).
  Shape batch_shape(std::int64_t n) const;
  Shape output_shape(std::int64_t n) const;  // the last layer's output for a batch of n
  // The largest batch every layer runs on the GPU: cuDNN's tensors hold at most 2^31 - 1
  // elements, 99,273 images for the MNIST model (its first convolution's output). On the
  // GPU, evaluate() and predict() split larger batches; fit() refuses them.
  std::int64_t largest_gpu_batch() const;
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
  // This remakes them from the f32 masters (value), queued on the compute stream; forward(),
  // fit(), evaluate() and predict() call it first, so weights loaded with value.copy_from()
  // are the ones used. Nothing to do in FP32.
  void refresh_half_weights();
  void set_training(bool training);

  // Attaches the optimizer (it packs the parameters into flat buffers on the model's
  // device, and makes each Parameter's value and grad views of them). Call after to() and
  // set_compute_dtype(). To load weights afterwards, copy them into the values
  // (value.copy_from()): fit() throws std::logic_error for a value or grad replaced by
  // another tensor, which the optimizer would not update.
  void compile(std::unique_ptr<Optimizer> optimizer);
  Optimizer* optimizer() { return optimizer_.get(); }

  // Logits for a batch x (N, H, W, C) on the model's device; the buffer is the last
  // layer's (valid until the next forward).
  const Tensor& forward(const Tensor& x);
  // Back-propagates d loss / d logits through every layer, accumulating gradients.
  void backward(const Tensor& dlogits);

  // Trains as Keras's fit does: each step's gradient is its batch's alone, so gradients a
  // backward() outside fit left in the parameters are dropped before the first step.
  History fit(const data::Dataset& train, const data::Dataset* validation, const FitOptions& options,
              const FitCallbacks& callbacks = {});
  // Loss and accuracy over d. Throws std::invalid_argument, before any batch runs, when the
  // images do not fit the model, its output is not (N, classes) or a label is not a class.
  EvalResult evaluate(const data::Dataset& d, std::int64_t batch_size = 1000);
  // Class probabilities (N, classes), f32 on the host, for images given as f32 pixels in
  // [0, 1], (N, H, W, C) on the host. Throws std::invalid_argument when x is not a batch of
  // the input shape, not f32, or holds a NaN or infinite value (naming the image and where
  // in it), or when the model's output is not (N, classes).
  Tensor predict(const Tensor& x, std::int64_t batch_size = 1000);

  // One line on how the last GPU fit ran its steps (pipeline, CUDA graph and its node
  // count), for --verbose; empty before a GPU fit.
  std::string gpu_training_info() const;

 private:
  History fit_cpu(const data::Dataset& train, const data::Dataset* validation, const FitOptions& options,
                  const FitCallbacks& callbacks);
  History fit_gpu(const data::Dataset& train, const data::Dataset* validation, const FitOptions& options,
                  const FitCallbacks& callbacks);
  EvalResult evaluate_gpu(const data::Dataset& d, std::int64_t batch_size);
  // forward() without refresh_half_weights(): for loops over batches that refreshed once.
  const Tensor& forward_layers(const Tensor& x);
  // The number of classes the loss sees: the model's output must be (N, classes), else
  // std::invalid_argument naming `caller`. The GPU's loss kernel is given the output's
  // second dimension as the class count and would read any other shape as rows of it.
  std::int64_t loss_classes(const char* caller) const;
  // Throws std::invalid_argument, starting with `what`, naming the first largest label of
  // d that is not below `classes`.
  static void check_labels(const data::Dataset& d, std::int64_t classes, const std::string& what);
  // Throws std::logic_error "<caller>: the model has no input shape; call set_input_shape()
  // first" when it has none.
  void require_input_shape(const char* caller) const;
  // Throws the layer's error (Layer::check_gpu_batch) when a batch of n is too large for
  // the GPU: fit's check, before it allocates anything.
  void check_gpu_batch(std::int64_t n) const;
  // The batch evaluate and predict run on the GPU when `asked` for: split to what every
  // layer takes, and at least 1, so that a model too large for even one sample gets the
  // layer's error rather than a loop over batches of 0.
  std::int64_t gpu_inference_batch(std::int64_t asked) const;
  // The end of an epoch, for both loops. A complete epoch (all its steps ran) is validated,
  // logged, counted as done and reported to on_epoch_end; one cut short by a stop request is
  // only logged. Returns false when training stops: after a stop request, which at an
  // epoch's last step comes after that epoch is finished as usual.
  bool finish_epoch(EpochLog& log, bool complete, History& history, const data::Dataset* validation,
                    const FitCallbacks& callbacks);
  // After the layers ran on the GPU outside a training step (forward, backward or
  // evaluate, from a callback during a fit, say): `addrs` are the buffers they wrote, in
  // the order a step records them from position `first` (forward outputs, then input
  // gradients from the last layer back). A bigger batch may have grown, and so moved,
  // buffers that captured steps write: then those graphs are dropped, as they are when a
  // layer's own step buffer (Layer::step_buffers) has moved.
  void drop_graphs_if_moved(const std::vector<const void*>& addrs, std::size_t first);

  std::vector<std::unique_ptr<Layer>> layers_;
  Shape input_shape_;
  Device device_ = Device::kCpu;
  DType compute_dtype_ = DType::kF32;
  std::unique_ptr<Optimizer> optimizer_;
  // Where each parameter's value and gradient were when compile() packed them into the
  // optimizer's buffers (value, grad, value, grad, ... in parameters() order): fit() refuses
  // a parameter whose tensor was replaced since, which the optimizer would never update.
  std::vector<const void*> packed_;
  // True while fit() runs: a callback may predict or evaluate, but not compile (the running
  // fit holds the optimizer, and on the GPU its buffers) or start another fit.
  bool fitting_ = false;
  // Deleted through the function sequential_gpu.cu sets with the trainer: sequential.cpp,
  // which defines Sequential's destructor and moves, only sees GpuTrainer declared.
  std::unique_ptr<GpuTrainer, void (*)(GpuTrainer*)> gpu_{nullptr, nullptr};
};

// Inference mode (layers keep nothing for a backward pass) for its lifetime; when it ends,
// also by an exception, each layer gets back the mode it had before. So a predict() or
// evaluate() (which use one) inside a caller's own InferenceMode, or after
// set_training(false), leaves the model in inference mode, and training mode stays
// training mode.
class InferenceMode {
 public:
  explicit InferenceMode(Sequential& m) : m_(m) {
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
  Sequential& m_;
  std::vector<bool> was_training_;  // per layer, in order
};

#if !MF_WITH_CUDA
inline std::string Sequential::gpu_training_info() const { return ""; }  // no GPU trainer in this build
inline void Sequential::drop_graphs_if_moved(const std::vector<const void*>&, std::size_t) {}
#endif

}  // namespace mf
