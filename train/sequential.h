// sequential.h: the model as Keras's Sequential: a layer stack (layers/network.h) with
// compile(optimizer), fit(), evaluate() and predict().
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/mnist.h"
#include "layers/network.h"
#include "optim/optimizer.h"
#include "train/fit.h"

namespace mf {

class GpuTrainer;  // what a GPU fit keeps between steps and fits (train/gpu_steps.cu)
struct GpuTrainerDeleter {
  void operator()(GpuTrainer* t) const;
};

class Sequential : public Network {
 public:
  Sequential();
  ~Sequential() override;
  Sequential(Sequential&&) noexcept;
  Sequential& operator=(Sequential&&) noexcept;

  // The article's model (section 3.3) for (H, W, C) inputs and `classes` outputs.
  static Sequential mnist_cnn(Rng& rng, std::int64_t height = 28, std::int64_t width = 28,
                              std::int64_t channels = 1, std::int64_t classes = 10);

  // Attaches the optimizer (it packs the parameters into flat buffers on the model's
  // device, and makes each Parameter's value and grad views of them). Call after to() and
  // set_compute_dtype(); layers cannot be added, moved or change precision afterwards. To
  // load weights afterwards, copy them into the values (value.copy_from()): fit() throws
  // std::logic_error for a value or grad replaced by another tensor, which the optimizer
  // would not update. A layer renamed after add() into another's name throws
  // std::invalid_argument here.
  void compile(std::unique_ptr<Optimizer> optimizer);
  Optimizer* optimizer() { return optimizer_.get(); }

  // Trains as Keras's fit does: each step's gradient is its batch's alone, so gradients a
  // backward() outside fit left in the parameters are dropped before the first step. On
  // the GPU, a batch larger than largest_gpu_batch() is refused.
  History fit(const data::Dataset& train, const data::Dataset* validation, const FitOptions& options,
              const FitCallbacks& callbacks = {});
  // Loss and accuracy over d. Throws std::invalid_argument, before any batch runs, when the
  // images do not fit the model, its output is not (N, classes) or a label is not a class.
  // On the GPU, batches larger than largest_gpu_batch() are split.
  EvalResult evaluate(const data::Dataset& d, std::int64_t batch_size = 1000);
  // Class probabilities (N, classes), f32 on the host, for images given as f32 pixels in
  // [0, 1], (N, H, W, C) on the host. Throws std::invalid_argument when x is not a batch of
  // the input shape, not f32, or holds a NaN or infinite value (naming the image and where
  // in it), or when the model's output is not (N, classes).
  Tensor predict(const Tensor& x, std::int64_t batch_size = 1000);

  // One line on how the last GPU fit ran its steps (pipeline, CUDA graph and its node
  // count), for --verbose; empty before a GPU fit.
  std::string gpu_training_info() const;

  // For the epoch loop (train/fit.cpp): the end of an epoch. A complete epoch (all its steps
  // ran) is validated, logged, counted as done and reported to on_epoch_end; one cut short
  // by a stop request is only logged. Returns false when training stops: after a stop
  // request, which at an epoch's last step comes after that epoch is finished as usual.
  bool finish_epoch(EpochLog& log, bool complete, History& history, const data::Dataset* validation,
                    const FitCallbacks& callbacks);

 protected:
  bool watches_buffers() const override { return gpu_ != nullptr; }
  void buffers_written(const std::vector<const void*>& addrs, std::size_t first) override;
  void device_or_dtype_changed() override { gpu_.reset(); }

 private:
  // Throws std::invalid_argument, starting with `what`, naming the first largest label of
  // d that is not below `classes`.
  static void check_labels(const data::Dataset& d, std::int64_t classes, const std::string& what);
  // The GPU's own fit and evaluation (train/gpu_steps.cu).
  History fit_gpu(const data::Dataset& train, const data::Dataset* validation, const FitOptions& options,
                  const FitCallbacks& callbacks);
  EvalResult evaluate_gpu(const data::Dataset& d, std::int64_t batch_size);

  std::unique_ptr<Optimizer> optimizer_;
  // Where each parameter's value and gradient were when compile() packed them into the
  // optimizer's buffers (value, grad, value, grad, ... in parameters() order): fit() refuses
  // a parameter whose tensor was replaced since, which the optimizer would never update.
  std::vector<const void*> packed_;
  // True while fit() runs: a callback may predict or evaluate, but not compile (the running
  // fit holds the optimizer, and on the GPU its buffers) or start another fit.
  bool fitting_ = false;
  std::unique_ptr<GpuTrainer, GpuTrainerDeleter> gpu_;
};

}  // namespace mf
