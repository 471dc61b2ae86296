// sequential.cpp: the model container, Keras-like summary, and the CPU training loop.
#include "layers/sequential.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "data/batching.h"
#include "kernels/errors.h"
#include "layers/conv2d.h"
#include "layers/dense.h"
#include "layers/flatten.h"
#include "layers/maxpool2d.h"
#include "layers/softmax_xent.h"
#include "tensor/rng.h"

#if !MF_WITH_CUDA
namespace mf {
class GpuTrainer {};
History Sequential::fit_gpu(const data::Dataset&, const data::Dataset*, const FitOptions&, const FitCallbacks&) {
  throw NoGpuError("training on the GPU: microflow was built without CUDA (CPU-only build)");
}
EvalResult Sequential::evaluate_gpu(const data::Dataset&, std::int64_t) {
  throw NoGpuError("evaluating on the GPU: microflow was built without CUDA (CPU-only build)");
}
void Sequential::refresh_half_weights() {}  // no FP16 without a GPU
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

Sequential::Sequential() = default;
Sequential::~Sequential() = default;
Sequential::Sequential(Sequential&&) noexcept = default;
Sequential& Sequential::operator=(Sequential&&) noexcept = default;

Sequential Sequential::mnist_cnn(Rng& rng, std::int64_t height, std::int64_t width, std::int64_t channels,
                                 std::int64_t classes) {
  Sequential m;
  m.set_input_shape(Shape{height, width, channels});
  // add() names them as Keras does: conv2d, max_pooling2d, conv2d_1, ..., dense, dense_1.
  m.add(std::make_unique<Conv2D>(channels, 32, 3, Activation::kRelu, rng));
  m.add(std::make_unique<MaxPool2D>());
  m.add(std::make_unique<Conv2D>(32, 64, 3, Activation::kRelu, rng));
  m.add(std::make_unique<MaxPool2D>());
  m.add(std::make_unique<Flatten>());
  Shape flat = m.batch_shape(1);
  for (const auto& l : m.layers_) flat = l->output_shape(flat);  // (1, 5*5*64) for 28x28 inputs
  m.add(std::make_unique<Dense>(flat[1], 64, Activation::kRelu, rng));
  m.add(std::make_unique<Dense>(64, classes, Activation::kNone, rng));
  return m;
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

Layer& Sequential::add(std::unique_ptr<Layer> layer) {
  if (!layer) throw std::invalid_argument("Sequential::add: the layer is null");
  if (optimizer_) throw std::logic_error("Sequential::add after compile()");
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
  layer->set_needs_input_grad(!layers_.empty());  // nothing upstream of the first layer
  layers_.push_back(std::move(layer));
  return *layers_.back();
}

std::vector<Parameter*> Sequential::parameters() {
  std::vector<Parameter*> ps;
  for (auto& l : layers_)
    for (Parameter* p : l->parameters()) ps.push_back(p);
  return ps;
}

std::int64_t Sequential::num_params() {
  std::int64_t n = 0;
  for (auto& l : layers_) n += l->num_params();
  return n;
}

void Sequential::set_input_shape(const Shape& sample) { input_shape_ = sample; }

void Sequential::require_input_shape(const char* caller) const {
  if (input_shape_.rank() == 0)
    throw std::logic_error(std::string(caller) + ": the model has no input shape; call set_input_shape() first");
}

Shape Sequential::batch_shape(std::int64_t n) const {
  // Without it the first layer was asked about a batch of shape (n,) and its error blamed
  // the input ("Dense: expected input of shape (batch, 144), got (1,)").
  require_input_shape("Sequential");
  std::vector<std::int64_t> dims{n};
  for (auto d : input_shape_.dims()) dims.push_back(d);
  return Shape(dims);
}

Shape Sequential::output_shape(std::int64_t n) const {
  Shape s = batch_shape(n);
  for (const auto& l : layers_) s = l->output_shape(s);
  return s;
}

std::int64_t Sequential::largest_gpu_batch() const {
  std::int64_t largest = INT64_MAX;
  if (layers_.empty()) return largest;  // nothing limits it, input shape or not
  Shape s = batch_shape(1);
  for (const auto& l : layers_) {
    largest = std::min(largest, l->largest_gpu_batch(s));
    s = l->output_shape(s);
  }
  return largest;
}

void Sequential::check_gpu_batch(std::int64_t n) const {
  Shape s = batch_shape(n);
  for (const auto& l : layers_) {
    l->check_gpu_batch(s);
    s = l->output_shape(s);
  }
}

std::int64_t Sequential::gpu_inference_batch(std::int64_t asked) const {
  return std::max<std::int64_t>(1, std::min(asked, largest_gpu_batch()));
}

std::string Sequential::architecture() const {
  std::ostringstream os;
  os << "input" << input_shape_.str();
  Shape s = batch_shape(1);
  for (const auto& l : layers_) {
    s = l->output_shape(s);
    os << "|" << l->type() << "->" << s.str();
  }
  return os.str();
}

std::string Sequential::summary() const {
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

void Sequential::to(Device device) {
  if (optimizer_) throw std::logic_error("Sequential::to after compile(): move the model first");
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
  gpu_.reset();
}

void Sequential::set_compute_dtype(DType dtype) {
  if (optimizer_) throw std::logic_error("Sequential::set_compute_dtype after compile()");
  if (dtype == DType::kF16 && device_ != Device::kGpu)
    throw std::invalid_argument("FP16 (mixed precision) runs on the GPU only: the CPU path computes in FP32");
  for (auto& l : layers_) l->set_compute_dtype(dtype);
  compute_dtype_ = dtype;
  gpu_.reset();
}

void Sequential::set_training(bool training) {
  for (auto& l : layers_) l->set_training(training);
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
  packed_.clear();
  for (const Parameter* p : parameters()) {
    packed_.push_back(p->value.raw());
    packed_.push_back(p->grad.raw());
  }
}

const Tensor& Sequential::forward(const Tensor& x) {
  refresh_half_weights();
  return forward_layers(x);
}

const Tensor& Sequential::forward_layers(const Tensor& x) {
  if (layers_.empty()) throw std::logic_error("Sequential::forward of an empty model");
  const Tensor* h = &x;
  std::vector<const void*> outputs;  // only when a GPU trainer exists, whose graphs may hold them
  for (auto& l : layers_) {
    h = &l->forward(*h);
    if (gpu_) outputs.push_back(h->raw());
  }
  if (gpu_) drop_graphs_if_moved(outputs, 0);
  return *h;
}

void Sequential::backward(const Tensor& dlogits) {
  const Tensor* g = &dlogits;
  std::vector<const void*> grads;
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
    g = &(*it)->backward(*g);
    if (gpu_) grads.push_back(g->raw());
  }
  if (gpu_) drop_graphs_if_moved(grads, layers_.size());
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
  check_image_shape(train, input_shape_, "fit:");
  if (validation && validation->count > 0) check_image_shape(*validation, input_shape_, "fit: validation");
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
  return device_ == Device::kGpu ? fit_gpu(train, validation, o, callbacks) : fit_cpu(train, validation, o, callbacks);
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

History Sequential::fit_cpu(const data::Dataset& train, const data::Dataset* validation, const FitOptions& options,
                            const FitCallbacks& callbacks) {
  History history;
  history.completed_epochs = options.initial_epoch;
  const std::int64_t bs = options.batch_size;
  const std::int64_t steps = data::num_batches(train.count, bs);
  Tensor x = Tensor::empty(batch_shape(bs));
  Tensor y = Tensor::empty(Shape{bs}, DType::kI32);
  Tensor stats = Tensor::zeros(Shape{kNumStats});
  Tensor dlogits;
  for (int epoch = options.initial_epoch; epoch < options.epochs; ++epoch) {
    set_training(true);
    const std::vector<std::int32_t> perm = data::epoch_permutation(train.count, options.seed, epoch);
    stats.fill_zero();
    const auto t0 = Clock::now();
    double last_progress = -1.0;
    std::int64_t step = 0;
    for (; step < steps; ++step) {
      const std::int64_t b0 = step * bs, nb = std::min(bs, train.count - b0);
      Tensor xb = x.slice(0, nb), yb = y.slice(0, nb);
      data::gather_batch(train, perm.data() + b0, nb, xb.data<float>(), yb.data<std::int32_t>());
      const Tensor& logits = forward(xb);
      const float before = stats.data<float>()[kStatLossSum];
      softmax_xent(logits, yb, stats, &dlogits);
      if (!std::isfinite(stats.data<float>()[kStatLossSum] - before))
        throw NonFiniteLossError("the training loss became " +
                                 std::string(std::isnan(stats.data<float>()[kStatLossSum]) ? "NaN" : "infinite") +
                                 " at epoch " + std::to_string(epoch + 1) + ", step " + std::to_string(step + 1) +
                                 ": lower the learning rate (--lr)");
      backward(dlogits);
      optimizer_->step();
      const double el = seconds_since(t0);
      if (callbacks.on_progress && (el - last_progress >= options.progress_interval_s || step + 1 == steps)) {
        last_progress = el;
        const float* s = stats.data<float>();
        callbacks.on_progress({epoch, step + 1, steps, s[kStatLossSum] / s[kStatCount], s[kStatCorrect] / s[kStatCount], el});
      }
      if (callbacks.should_stop && callbacks.should_stop()) {
        history.interrupted = true;
        ++step;
        break;
      }
    }
    EpochLog log;
    log.epoch = epoch;
    log.train_seconds = seconds_since(t0);
    log.steps = step;
    const float* s = stats.data<float>();
    log.samples = static_cast<std::int64_t>(s[kStatCount]);
    log.loss = s[kStatLossSum] / s[kStatCount];
    log.accuracy = s[kStatCorrect] / s[kStatCount];
    log.val_loss = log.val_accuracy = std::numeric_limits<double>::quiet_NaN();
    log.loss_scale = 1.0;
    if (!finish_epoch(log, step == steps, history, validation, callbacks)) break;
  }
  set_training(true);
  return history;
}

std::int64_t Sequential::loss_classes(const char* caller) const {
  if (layers_.empty()) throw std::logic_error(std::string("Sequential::") + caller + " of an empty model");
  const Shape out = output_shape(1);
  if (out.rank() != 2)
    throw std::invalid_argument(std::string(caller) + ": the model's output for one image is " + out.str() +
                                ", not (1, classes): the loss needs one row of class scores per image (end the "
                                "model with a Flatten then a Dense layer)");
  return out[1];
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
  check_image_shape(d, input_shape_, "evaluate:");
  // As in predict(): a model the GPU cannot run even one image through gets its layer's own
  // error, before its output is looked at.
  if (device_ == Device::kGpu && !layers_.empty()) check_gpu_batch(1);
  check_labels(d, loss_classes("evaluate"), "evaluate:");
  if (device_ == Device::kGpu) return evaluate_gpu(d, batch_size);
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
  const std::vector<std::int64_t>& want = input_shape_.dims();
  const bool shape_ok = x.defined() && x.rank() == input_shape_.rank() + 1 &&
                        std::equal(want.begin(), want.end(), x.shape().dims().begin() + 1);
  if (!shape_ok)
    throw std::invalid_argument("predict: expected images of shape " + batch_shape_str(input_shape_) +
                                " (the model's input shape " + input_shape_.str() + " with a batch dimension), got " +
                                x.describe());
  if (x.dtype() != DType::kF32)
    throw std::invalid_argument("predict: expected f32 pixels, got " + x.describe());
  if (batch_size < 1) throw std::invalid_argument("predict: batch size must be at least 1");
  const std::int64_t bs = device_ == Device::kGpu ? gpu_inference_batch(batch_size) : batch_size;
  // A model the GPU cannot run even one image through: the layer's own error (the one its
  // forward() would give), before the output is looked at or anything is copied.
  if (device_ == Device::kGpu) check_gpu_batch(bs);
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
    if (device_ == Device::kGpu) {
      xb = xb.to(Device::kGpu);
      if (compute_dtype_ == DType::kF16) xb = xb.to(DType::kF16);
    }
    const Tensor p = softmax(forward_layers(xb));
    const std::vector<float> v = p.to_vector();
    probs.insert(probs.end(), v.begin(), v.end());
  }
  return Tensor::from_vector(Shape{xh.dim(0), classes}, probs);
}

}  // namespace mf
