// gpu_steps.cu: the GPU's training steps. Batches come from the dataset kept on the
// device (or from a prefetching or a naive host pipeline: batch_sources.cu), the whole step
// is replayed as a CUDA graph (step_graph.h), and the loss statistics are summed on the
// device and read back only at progress points and at the end of an epoch: those reads are
// the loop's only host waits.
//
// A step is: [gather the batch] -> forward -> softmax cross-entropy -> backward ->
// optimizer update -> [advance the batch cursor], all enqueued on the compute stream.
// Nothing in it takes a host argument that changes from step to step (the batch position
// is a cursor in device memory, the Adam step count and the loss scale live on the device),
// so one captured graph per batch size replays every step of that size.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/batching.h"
#include "kernels/gpu/launchers.h"
#include "kernels/kernel_options.h"
#include "layers/softmax_xent.h"
#include "runtime/cuda_check.h"
#include "runtime/gpu_context.h"
#include "runtime/gpu_runtime.h"
#include "train/gpu_trainer.h"
#include "train/sequential.h"

namespace mf {

void GpuTrainerDeleter::operator()(GpuTrainer* t) const { delete t; }

namespace {

using Layers = std::vector<std::unique_ptr<Layer>>;

// Sizes the step's buffers for a fit (reusing what an earlier fit left) and drops the
// graphs: anything may have run on the model since.
void begin_fit(GpuTrainer& t, const FitOptions& o, DType dtype, const data::Dataset& train, const Layers& layers,
               bool fused) {
  t.graph.begin_fit(o.use_graph);
  t.fit_data = nullptr;
  t.pipeline = o.pipeline == Pipeline::kAuto ? Pipeline::kResident : o.pipeline;
  t.fused = fused;
  if (fused) check_fused_pipeline(t.pipeline);
  t.half = dtype == DType::kF16;
  t.batch = std::min(o.batch_size, train.count);
  t.sample = train.sample_size();
  t.fitted = true;
  ensure(t.x, Shape{t.batch, train.rows, train.cols, train.channels}, dtype, Device::kGpu);
  ensure(t.labels, Shape{t.batch}, DType::kI32, Device::kGpu);
  ensure(t.stats, Shape{kNumStats}, DType::kF32, Device::kGpu);
  ensure(t.cursor, Shape{2}, DType::kI32, Device::kGpu);  // 8 bytes: one int64
  if (t.pipeline == Pipeline::kResident) ensure(t.perm, Shape{train.count}, DType::kI32, Device::kGpu);
  t.size_pipeline_buffers();
  if (fused) t.fused_step.size(layers, t.batch, train.rows, train.cols, train.channels, t.half);
}

// Enqueues one training step of nb samples on the compute stream (eagerly, or into a graph
// being captured), and records where every layer's output, input gradient and other step
// buffers (Layer::step_buffers) live.
void step_body(GpuTrainer& t, Layers& layers, Optimizer& opt, std::int64_t nb, cudaStream_t s) {
  if (t.fused) {
    t.graph.addrs().clear();
    return t.fused_step.enqueue(t, layers, opt, nb, s, t.graph.addrs());
  }
  if (t.pipeline == Pipeline::kResident)
    launch_gather_batch(t.fit_data->images.data<std::uint8_t>(), t.fit_data->labels.data<std::uint8_t>(),
                        t.perm.data<std::int32_t>(), t.cursor_ptr(), nb, t.sample, t.x.raw(), t.half,
                        t.labels.data<std::int32_t>(), s);
  const Tensor xb = t.x.slice(0, nb);
  const Tensor yb = t.labels.slice(0, nb);
  std::vector<const void*>& addrs = t.graph.addrs();
  addrs.clear();
  const Tensor* h = &xb;
  for (auto& l : layers) {
    h = &l->forward(*h);
    addrs.push_back(h->raw());
  }
  ensure(t.dlogits, h->shape(), h->dtype(), Device::kGpu);
  // The launcher is called on `s`, the stream this step is enqueued (or captured) on, rather
  // than through softmax_xent(), which picks compute_stream() itself. grad_scale 1/nb: the
  // batch's mean loss; the loss scale (FP16) is read on the device at every replay.
  launch_softmax_xent(h->raw(), t.half, yb.data<std::int32_t>(), nb, h->dim(1), t.dlogits.raw(),
                      1.0f / static_cast<float>(nb), opt.device_loss_scale(), t.stats.data<float>(),
                      GpuContext::current().reduction_scratch(reduction_scratch_bytes()), s);
  const Tensor* g = &t.dlogits;
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
    g = &(*it)->backward(*g);
    addrs.push_back(g->raw());
  }
  for (auto& l : layers) l->step_buffers(addrs);
  opt.step();
  if (t.pipeline == Pipeline::kResident) launch_advance_cursor(t.cursor_ptr(), nb, s);
}

[[noreturn]] void throw_non_finite(double loss_sum, bool half, int epoch, std::int64_t step_from,
                                   std::int64_t step_to) {
  const std::string what = std::isnan(loss_sum) ? "NaN" : "infinite";
  const std::string where = " at epoch " + std::to_string(epoch + 1) +
                            (step_from + 1 >= step_to ? ", step " + std::to_string(step_to)
                                                      : ", between steps " + std::to_string(step_from + 1) + " and " +
                                                            std::to_string(step_to));
  throw NonFiniteLossError("the training loss became " + what + where +
                           (half ? ": the f16 activations overflowed; lower the learning rate (--lr) or train in "
                                   "FP32 (without --fp16)"
                                 : ": lower the learning rate (--lr)"));
}

// FP16: a dynamic loss scale that keeps falling means every gradient overflows whatever the
// scale; training cannot go on (and must not go on with a model it cannot update).
void check_loss_scale(double scale, double min_scale, std::int64_t skipped, std::int64_t steps, int epoch,
                      bool epoch_end) {
  const std::string tail = ". The model diverges in FP16: lower the learning rate (--lr) or train in FP32 (without "
                           "--fp16)";
  if (epoch_end && steps > 0 && skipped >= steps)
    throw std::runtime_error("no loss scale keeps the FP16 gradients finite: all " + std::to_string(steps) +
                             " steps of epoch " + std::to_string(epoch + 1) +
                             " were skipped for inf/NaN gradients (loss scale now " + std::to_string(scale) + ")" +
                             tail);
  if (skipped > 0 && scale <= min_scale)
    throw std::runtime_error("no loss scale keeps the FP16 gradients finite: the loss scale fell to its minimum (" +
                             std::to_string(scale) + ") with " + std::to_string(skipped) + " steps of epoch " +
                             std::to_string(epoch + 1) + " skipped for inf/NaN gradients" + tail);
}

// The fused step's graphs hold this many steps each (step_graph.h): an epoch of 750 steps is
// 47 launches.
constexpr int kFusedStepsPerGraph = 16;

// The GPU's side of the epoch loop (train/fit.h).
class GpuSteps : public StepRunner {
 public:
  GpuSteps(GpuTrainer& t, Layers& layers, Optimizer& opt, const data::Dataset& train, std::int64_t batch,
           cudaStream_t s)
      : t_(t), layers_(layers), opt_(opt), train_(train), batch_(batch), s_(s) {}

  void begin_epoch(int, const std::vector<std::int32_t>& perm) override {
    perm_ = &perm;
    checked_ = skipped_ = 0;
    pending_ = 0;
    cut_ = false;
    t_.stats.fill_zero_async(s_);
    if (t_.pipeline == Pipeline::kResident) {
      // One 4-byte index per image (192 KB for 48k) and a reset cursor: the epoch's only
      // host-to-device traffic. Ordered after the last epoch's steps on the same stream.
      gpu_copy_async(t_.perm.raw(), perm.data(), perm.size() * sizeof(std::int32_t), CopyKind::kHostToDevice, s_);
      gpu_memset_async(t_.cursor.raw(), 0, sizeof(std::int64_t), s_);
    } else if (t_.pipeline == Pipeline::kPrefetch) {
      prefetch_ = std::make_unique<Prefetcher>(t_, train_, perm, batch_, data::num_batches(train_.count, batch_));
    }
  }

  void step(int, std::int64_t step, std::int64_t b0, std::int64_t nb) override {
    if (group_ > 1 && nb == batch_) {
      // Grouped: the full batches in runs of group_ steps from the epoch's start (the last
      // run before the partial batch is shorter, the same length every epoch), each run one
      // graph launch. The rest of a run cut by progress() goes step by step.
      const bool run_ends = (step + 1) % group_ == 0 || step + 1 == full_steps_;
      if (cut_) {
        run_steps(batch_, 1);
        cut_ = !run_ends;
        return;
      }
      ++pending_;
      if (run_ends) {
        run_steps(batch_, pending_);
        pending_ = 0;
      }
      return;
    }
    flush();
    if (prefetch_) prefetch_->feed(step, nb, s_);
    else if (t_.pipeline == Pipeline::kNaive) t_.naive_feed(train_, perm_->data() + b0, nb, s_);
    run_steps(nb, 1);
  }

  StepStats progress(int epoch, std::int64_t steps_done) override {
    flush();
    const StepStats st = t_.read_stats(t_.stats, s_);  // waits for the GPU
    if (!t_.half && !std::isfinite(st.loss_sum)) throw_non_finite(st.loss_sum, false, epoch, checked_, steps_done);
    checked_ = steps_done;
    if (t_.half) {
      skipped_ += opt_.take_skipped_steps();
      check_loss_scale(opt_.loss_scale(), opt_.min_loss_scale(), skipped_, steps_done, epoch, false);
    }
    return st;
  }

  void end_epoch(int epoch, std::int64_t steps_done, bool complete, EpochLog& log) override {
    flush();
    if (prefetch_) prefetch_->finish();
    const StepStats st = t_.read_stats(t_.stats, s_);  // the final wait for the GPU
    log.samples = static_cast<std::int64_t>(st.count);
    if (st.count > 0) {
      log.loss = st.loss_sum / st.count;
      log.accuracy = st.correct / st.count;
    }
    log.loss_scale = 1.0;
    if (t_.half) {
      skipped_ += opt_.take_skipped_steps();
      log.loss_scale = opt_.loss_scale();
      log.skipped_steps = skipped_;
      check_loss_scale(log.loss_scale, opt_.min_loss_scale(), skipped_, steps_done, epoch, complete);
    }
    if (!std::isfinite(st.loss_sum)) throw_non_finite(st.loss_sum, t_.half, epoch, checked_, steps_done);
  }

 private:
  void run_steps(std::int64_t nb, int k) {
    t_.graph.run(nb, s_, opt_.learning_rate(), [&] { step_body(t_, layers_, opt_, nb, s_); }, k);
  }
  // Runs the steps a grouped run holds back, one by one (before anyone reads the GPU's
  // statistics); the rest of their run follows them one by one too.
  void flush() {
    if (pending_ == 0) return;
    for (int i = 0; i < pending_; ++i) run_steps(batch_, 1);
    pending_ = 0;
    cut_ = true;
  }

  GpuTrainer& t_;
  Layers& layers_;
  Optimizer& opt_;
  const data::Dataset& train_;
  const std::int64_t batch_;
  const cudaStream_t s_;
  const std::vector<std::int32_t>* perm_ = nullptr;
  std::unique_ptr<Prefetcher> prefetch_;
  std::int64_t checked_ = 0, skipped_ = 0;  // steps whose loss was seen finite; FP16 steps skipped
  // Steps per graph launch: kFusedStepsPerGraph for the fused step (its batch is read on the
  // device), else 1; the full batches of an epoch; the steps held back; a run was cut.
  const int group_ = t_.fused ? kFusedStepsPerGraph : 1;
  const std::int64_t full_steps_ = train_.count / batch_;
  int pending_ = 0;
  bool cut_ = false;
};

}  // namespace

std::string Sequential::gpu_training_info() const { return gpu_ ? gpu_->describe() : ""; }

History Sequential::fit_gpu(const data::Dataset& train, const data::Dataset* validation, const FitOptions& options,
                            const FitCallbacks& callbacks) {
  check_gpu_batch(options.batch_size);  // fit() has capped it at the data's size
  const cudaStream_t s = GpuContext::current().stream();
  if (!gpu_) gpu_.reset(new GpuTrainer);
  GpuTrainer& t = *gpu_;
  begin_fit(t, options, compute_dtype(), train, layers_, rung() == KernelRung::kFused);
  refresh_half_weights();  // weights loaded into the masters since the last step
  if (t.pipeline == Pipeline::kResident) t.fit_data = &t.device_data(train, false, s);
  if (t.half) optimizer_->take_skipped_steps();  // count this fit's skipped steps only
  GpuSteps steps(t, layers_, *optimizer_, train, options.batch_size, s);
  return run_epochs(*this, steps, train, validation, options, callbacks);
}

void Sequential::buffers_written(const std::vector<const void*>& addrs, std::size_t first) {
  // The fused step's graphs use buffers of its own, which no layer call moves.
  if (!gpu_ || gpu_->fused) return;
  // The layers' own step buffers, recorded after the outputs and the input gradients: a
  // training-mode forward from a callback may have moved one (MaxPool2D's argmax_) while
  // every output still fitted.
  std::vector<const void*> own;
  for (auto& l : layers_) l->step_buffers(own);
  gpu_->graph.drop_if_moved(addrs, first, own, 2 * layers_.size());
}

EvalResult Sequential::evaluate_gpu(const data::Dataset& d, std::int64_t batch_size) {
  EvalResult r;
  if (d.count == 0 || layers_.empty()) return r;
  GpuContext& ctx = GpuContext::current();
  const cudaStream_t s = ctx.stream();
  if (!gpu_) gpu_.reset(new GpuTrainer);
  GpuTrainer& t = *gpu_;
  const bool half = compute_dtype() == DType::kF16;
  refresh_half_weights();
  const std::int64_t bs = gpu_inference_batch(std::min(batch_size, d.count));  // d.count >= 1 here
  const std::int64_t sample = d.sample_size();
  DeviceData& dd = t.device_data(d, true, s);
  ensure(t.eval_x, Shape{bs, d.rows, d.cols, d.channels}, compute_dtype(), Device::kGpu);
  ensure(t.eval_labels, Shape{bs}, DType::kI32, Device::kGpu);
  ensure(t.eval_stats, Shape{kNumStats}, DType::kF32, Device::kGpu);
  ensure(t.eval_cursor, Shape{2}, DType::kI32, Device::kGpu);
  t.eval_stats.fill_zero_async(s);
  gpu_memset_async(t.eval_cursor.raw(), 0, sizeof(std::int64_t), s);
  std::vector<const void*> outputs;
  {
    InferenceMode inference(*this);
    for (std::int64_t b0 = 0; b0 < d.count; b0 += bs) {
      const std::int64_t nb = std::min(bs, d.count - b0);
      // In order: the identity permutation, read at the cursor, which advances by nb.
      launch_gather_batch(dd.images.data<std::uint8_t>(), dd.labels.data<std::uint8_t>(),
                          dd.identity.data<std::int32_t>(), t.eval_cursor_ptr(), nb, sample, t.eval_x.raw(), half,
                          t.eval_labels.data<std::int32_t>(), s);
      const Tensor xb = t.eval_x.slice(0, nb);
      const Tensor* h = &xb;
      outputs.clear();
      for (auto& l : layers_) {
        h = &l->forward(*h);
        outputs.push_back(h->raw());
      }
      launch_softmax_xent(h->raw(), half, t.eval_labels.data<std::int32_t>(), nb, h->dim(1), nullptr,
                          1.0f / static_cast<float>(nb), nullptr, t.eval_stats.data<float>(),
                          ctx.reduction_scratch(reduction_scratch_bytes()), s);
      launch_advance_cursor(t.eval_cursor_ptr(), nb, s);
    }
  }
  const StepStats st = t.read_stats(t.eval_stats, s);  // the one wait
  buffers_written(outputs, 0);
  r.count = static_cast<std::int64_t>(st.count);
  if (r.count > 0) {
    r.loss = st.loss_sum / st.count;
    r.accuracy = st.correct / st.count;
  }
  return r;
}

}  // namespace mf
