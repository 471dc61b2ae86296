// sequential.cpp: compile, fit's checks, evaluate and predict; the epoch loop itself is
// train/fit.cpp's, the device's steps train/cpu_steps.cpp's and train/gpu_steps.cu's.
#include "train/sequential.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "data/batching.h"
#include "layers/softmax_xent.h"
#include "runtime/errors.h"
#include "train/cpu_steps.h"

#if !MF_WITH_CUDA
namespace mf {
class GpuTrainer {};
void GpuTrainerDeleter::operator()(GpuTrainer* t) const { delete t; }
History Sequential::fit_gpu(const data::Dataset&, const data::Dataset*, const FitOptions&, const FitCallbacks&) {
  throw NoGpuError("training on the GPU: microflow was built without CUDA (CPU-only build)");
}
EvalResult Sequential::evaluate_gpu(const data::Dataset&, std::int64_t) {
  throw NoGpuError("evaluating on the GPU: microflow was built without CUDA (CPU-only build)");
}
std::string Sequential::gpu_training_info() const { return ""; }  // no GPU trainer in this build
void Sequential::buffers_written(const std::vector<const void*>&, std::size_t) {}
}  // namespace mf
#endif

namespace mf {

namespace {
// Throws std::invalid_argument "<what> images are 7x9 with one channel, (7, 9, 1); the model
// takes (7, 9)" (or "with 3 channels, (7, 9, 3)") unless d's images have the model's input
// shape. Their shape is spelled out: "images are 7x9, the model takes (7, 9)" read as a match.
void check_image_shape(const data::Dataset& d, const Shape& input_shape, const std::string& what) {
  const Shape images{d.rows, d.cols, d.channels};
  if (images == input_shape) return;
  throw std::invalid_argument(what + " images are " + std::to_string(d.rows) + "x" + std::to_string(d.cols) +
                              " with " + data::channels_text(d.channels) + ", " + images.str() +
                              "; the model takes " + input_shape.str());
}
}  // namespace

const char* pipeline_name(Pipeline p) {
  switch (p) {
    case Pipeline::kAuto: return "auto";
    case Pipeline::kResident: return "resident";
    case Pipeline::kPrefetch: return "prefetch";
    case Pipeline::kNaive: return "naive";
  }
  return "?";
}

void check_fused_pipeline(Pipeline p) {
  if (p != Pipeline::kAuto && p != Pipeline::kResident)
    throw std::invalid_argument(std::string("--kernels fused reads each batch from the training set kept on the GPU: "
                                            "use --pipeline resident (or auto), not ") + pipeline_name(p));
}

Sequential::Sequential() = default;
Sequential::~Sequential() = default;
Sequential::Sequential(Sequential&&) noexcept = default;
Sequential& Sequential::operator=(Sequential&&) noexcept = default;

Sequential Sequential::mnist_cnn(Rng& rng, std::int64_t height, std::int64_t width, std::int64_t channels,
                                 std::int64_t classes) {
  Sequential m;
  add_mnist_cnn(m, rng, height, width, channels, classes);
  return m;
}

void Sequential::compile(std::unique_ptr<Optimizer> optimizer) {
  if (!optimizer) throw std::invalid_argument("Sequential::compile: the optimizer is null");
  if (fitting_)
    throw std::logic_error("Sequential::compile during fit (from a callback): the running fit uses the optimizer");
  // A layer renamed after add() (add(...).set_name(...)) may have taken another's name.
  for (std::size_t i = 0; i < layers_.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (layers_[i]->name() == layers_[j]->name())
        throw std::invalid_argument("Sequential::compile: layers " + std::to_string(j) + " and " + std::to_string(i) +
                                    " are both named '" + layers_[i]->name() + "'; layer names must be unique");
  // Attach first: when it throws (a model with no parameters, say), the model must stay
  // uncompiled, with its previous optimizer if it had one, rather than hold an optimizer
  // that has no parameters to update.
  optimizer->attach(parameters());
  optimizer_ = std::move(optimizer);
  frozen_ = true;
  packed_.clear();
  for (const Parameter* p : parameters()) {
    packed_.push_back(p->value.raw());
    packed_.push_back(p->grad.raw());
  }
}

History Sequential::fit(const data::Dataset& train, const data::Dataset* validation, const FitOptions& options,
                        const FitCallbacks& callbacks) {
  if (!optimizer_) throw std::logic_error("Sequential::fit before compile()");
  if (fitting_) throw std::logic_error("Sequential::fit during fit (from a callback): one fit at a time");
  // A parameter given another tensor since compile() (to load weights, say) is no longer the
  // optimizer's: its layer would not train, without a word.
  std::size_t packed = 0;
  for (const auto& l : layers_)
    for (const Parameter* p : l->parameters()) {
      if (p->value.raw() != packed_.at(packed) || p->grad.raw() != packed_.at(packed + 1))
        throw std::logic_error("fit: the " + p->name + " of " + l->label() +
                               " was replaced by another tensor after compile(), and the optimizer updates the one "
                               "it had; copy new values into it (value.copy_from()) or compile() again");
      packed += 2;
    }
  // Both datasets consistent (count, image bytes and labels agree) before anything is sized
  // from their counts or trained: a count with no data behind it would otherwise size an
  // epoch's permutation (2^31 indices for a count of 2^31 - 1) before the first batch found
  // the data missing, and a bad validation set would only be found after a whole epoch.
  data::check_dataset(train, "fit: training set");
  if (validation) data::check_dataset(*validation, "fit: validation set");
  if (options.batch_size < 1) throw std::invalid_argument("batch size must be at least 1");
  if (options.epochs < 0 || options.initial_epoch < 0) throw std::invalid_argument("epochs must be >= 0");
  if (train.count < 1) throw std::invalid_argument("fit: the training set is empty");
  require_input_shape("Sequential::fit");  // else "the model takes ()" blamed the images
  check_image_shape(train, input_shape(), "fit:");
  if (validation && validation->count > 0) check_image_shape(*validation, input_shape(), "fit: validation");
  // Every label a class of the model's output, checked before the first step: found at its
  // batch, a bad label stopped training with the weights already changed (in the validation
  // set, after a whole epoch).
  const std::int64_t classes = loss_classes("fit");
  check_labels(train, classes, "fit: training");
  if (validation) check_labels(*validation, classes, "fit: validation");
  // A batch larger than the data is the whole data each step (as in Keras); buffers are
  // sized for what a step can hold, not for the number asked.
  FitOptions o = options;
  o.batch_size = std::min(options.batch_size, train.count);
  // The optimizer zeroes the gradients after each step, not before: what a backward() of the
  // caller's own left there would join the first step's gradient.
  for (Parameter* p : parameters()) p->grad.fill_zero();
  // fitting_ is true for the fit's duration, and false again however it ends.
  struct Fitting {
    bool& flag;
    explicit Fitting(bool& f) : flag(f) { flag = true; }
    ~Fitting() { flag = false; }
  } fitting(fitting_);
  if (device() == Device::kGpu) return fit_gpu(train, validation, o, callbacks);
  const std::unique_ptr<StepRunner> steps = make_cpu_steps(*this, *optimizer_, train, o.batch_size);
  return run_epochs(*this, *steps, train, validation, o, callbacks);
}

void Sequential::check_labels(const data::Dataset& d, std::int64_t classes, const std::string& what) {
  const auto top = std::max_element(d.labels.begin(), d.labels.end());  // count labels (check_dataset)
  if (top != d.labels.end() && *top >= classes)
    throw std::invalid_argument(what + " label " + std::to_string(*top) + " at index " +
                                std::to_string(top - d.labels.begin()) + " is not one of the model's " +
                                std::to_string(classes) + " classes");
}

bool Sequential::finish_epoch(EpochLog& log, bool complete, History& history, const data::Dataset* validation,
                              const FitCallbacks& callbacks) {
  if (!complete) {  // cut short by a stop request: logged, not validated, not counted as done
    history.epochs.push_back(log);
    return false;
  }
  if (validation && validation->count > 0) {
    const EvalResult v = evaluate(*validation);
    log.val_loss = v.loss;
    log.val_accuracy = v.accuracy;
  }
  history.epochs.push_back(log);
  history.completed_epochs = log.epoch + 1;
  if (callbacks.on_epoch_end) callbacks.on_epoch_end(log);
  return !history.interrupted;
}

EvalResult Sequential::evaluate(const data::Dataset& d, std::int64_t batch_size) {
  data::check_dataset(d, "evaluate");  // a negative count or missing data is an error, not a zero result
  if (batch_size < 1) throw std::invalid_argument("evaluate: batch size must be at least 1");
  require_input_shape("Sequential::evaluate");  // else "the model takes ()" blamed the images
  check_image_shape(d, input_shape(), "evaluate:");
  // As in predict(): a model the GPU cannot run even one image through gets its layer's own
  // error, before its output is looked at.
  if (device() == Device::kGpu && !layers_.empty()) check_gpu_batch(1);
  check_labels(d, loss_classes("evaluate"), "evaluate:");
  if (device() == Device::kGpu) return evaluate_gpu(d, batch_size);
  InferenceMode inference(*this);
  const std::int64_t bs = std::min(batch_size, std::max<std::int64_t>(1, d.count));
  Tensor x = Tensor::empty(batch_shape(bs));
  Tensor y = Tensor::empty(Shape{bs}, DType::kI32);
  Tensor stats = Tensor::zeros(Shape{kNumStats});
  std::vector<std::int32_t> idx(static_cast<std::size_t>(bs));
  for (std::int64_t b0 = 0; b0 < d.count; b0 += bs) {
    const std::int64_t nb = std::min(bs, d.count - b0);
    for (std::int64_t i = 0; i < nb; ++i) idx[i] = static_cast<std::int32_t>(b0 + i);
    Tensor xb = x.slice(0, nb), yb = y.slice(0, nb);
    data::gather_batch(d, idx.data(), nb, xb.data<float>(), yb.data<std::int32_t>());
    softmax_xent(forward(xb), yb, stats, nullptr);
  }
  EvalResult r;
  const float* s = stats.data<float>();
  r.count = static_cast<std::int64_t>(s[kStatCount]);
  if (r.count > 0) {
    r.loss = s[kStatLossSum] / s[kStatCount];
    r.accuracy = s[kStatCorrect] / s[kStatCount];
  }
  return r;
}

namespace {

// "(N, 28, 28, 1)": the shape of a batch of `sample`-shaped inputs, N standing for the batch.
std::string batch_shape_str(const Shape& sample) {
  std::string s = "(N";
  for (std::int64_t d : sample.dims()) s += ", " + std::to_string(d);
  return s + ")";
}

// Throws std::invalid_argument naming the image and the position (as coordinates within
// the image) of the first NaN or infinite value of x, a host f32 batch. One pass over the
// data. Without this a NaN pixel gives rows of NaN probabilities (and an infinite one NaN
// or a certain class), with nothing saying which pixel is to blame.
void check_finite_images(const Tensor& x) {
  const float* p = x.data<float>();
  const std::int64_t n = x.numel();
  std::int64_t i = 0;
  while (i < n && std::isfinite(p[i])) ++i;
  if (i == n) return;
  // Image i / per_image; its element i % per_image as coordinates within the image.
  const Shape image(std::vector<std::int64_t>(x.shape().dims().begin() + 1, x.shape().dims().end()));
  const std::int64_t per_image = image.numel();  // > 0: x has an element
  std::vector<std::int64_t> at(static_cast<std::size_t>(image.rank()));
  std::int64_t rest = i % per_image;
  for (int d = image.rank() - 1; d >= 0; --d) {  // row-major: the last dimension varies fastest
    at[static_cast<std::size_t>(d)] = rest % image[d];
    rest /= image[d];
  }
  const std::string value = std::isnan(p[i]) ? "NaN" : (p[i] > 0 ? "inf" : "-inf");
  throw std::invalid_argument("predict: image " + std::to_string(i / per_image) + " holds " + value + " at " +
                              Shape(at).str() + " of its " + image.str() + ": pixels must be finite numbers");
}

}  // namespace

Tensor Sequential::predict(const Tensor& x, std::int64_t batch_size) {
  if (layers_.empty()) throw std::logic_error("Sequential::predict of an empty model");
  require_input_shape("Sequential::predict");
  // A batch of samples: one dimension more than the model's sample shape, the others equal.
  const std::vector<std::int64_t>& want = input_shape().dims();
  const bool shape_ok = x.defined() && x.rank() == input_shape().rank() + 1 &&
                        std::equal(want.begin(), want.end(), x.shape().dims().begin() + 1);
  if (!shape_ok)
    throw std::invalid_argument("predict: expected images of shape " + batch_shape_str(input_shape()) +
                                " (the model's input shape " + input_shape().str() + " with a batch dimension), got " +
                                x.describe());
  if (x.dtype() != DType::kF32)
    throw std::invalid_argument("predict: expected f32 pixels, got " + x.describe());
  if (batch_size < 1) throw std::invalid_argument("predict: batch size must be at least 1");
  const std::int64_t bs = device() == Device::kGpu ? gpu_inference_batch(batch_size) : batch_size;
  // A model the GPU cannot run even one image through: the layer's own error (the one its
  // forward() would give), before the output is looked at or anything is copied.
  if (device() == Device::kGpu) check_gpu_batch(bs);
  // Probabilities need one row of class scores per image: (N, classes) logits.
  const Shape out = output_shape(x.dim(0));
  if (out.rank() != 2)
    throw std::invalid_argument("predict: the model's output for these images is " + out.str() +
                                ", not (N, classes): predict gives class probabilities and needs the last layer "
                                "to output one row of class scores per image (a Flatten then a Dense layer)");
  const Tensor xh = x.is_cpu() ? x : x.to(Device::kCpu);
  check_finite_images(xh);  // on the host copy, before any upload
  InferenceMode inference(*this);
  std::vector<float> probs;
  const std::int64_t classes = out[1];
  refresh_half_weights();  // once, not for every batch
  for (std::int64_t b0 = 0; b0 < xh.dim(0); b0 += bs) {
    Tensor xb = xh.slice(b0, std::min(xh.dim(0), b0 + bs));
    if (device() == Device::kGpu) {
      xb = xb.to(Device::kGpu);
      if (compute_dtype() == DType::kF16) xb = xb.to(DType::kF16);
    }
    const Tensor p = softmax(forward_layers(xb));
    const std::vector<float> v = p.to_vector();
    probs.insert(probs.end(), v.begin(), v.end());
  }
  return Tensor::from_vector(Shape{xh.dim(0), classes}, probs);
}

}  // namespace mf
