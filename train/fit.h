// fit.h: what a training run is given and what it gives back (Keras's fit() arguments,
// callbacks and History), and the one epoch loop both devices run, over a StepRunner: the
// device's way of running a step (train/cpu_steps.cpp, train/gpu_steps.cu).
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/mnist.h"

namespace mf {

class Sequential;

// How batches reach the GPU (--pipeline). The article's tf.data lesson, three ways.
enum class Pipeline {
  kAuto,      // resident on the GPU, host (no copies) on the CPU
  kResident,  // whole u8 dataset on the device; a device-side permutation picks batches
  kPrefetch,  // pinned host buffers, copies on their own stream, double buffered
  kNaive,     // a pageable copy each step, waited for (the article's slow example)
};
const char* pipeline_name(Pipeline p);
// The fused rung (--kernels fused) reads each batch from the training set kept on the GPU:
// any pipeline but resident (kAuto is resident on the GPU) is refused in one line
// (std::invalid_argument).
void check_fused_pipeline(Pipeline p);

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

// Running sums of an epoch's training loss statistics.
struct StepStats {
  double loss_sum = 0, correct = 0, count = 0;
};

// One device's training steps, for the epoch loop (run_epochs). Each call may throw:
// NonFiniteLossError for a NaN or infinite loss, std::runtime_error when FP16 cannot go on.
class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // Before the first step of `epoch`, whose order is `perm` (indices into the training set).
  virtual void begin_epoch(int epoch, const std::vector<std::int32_t>& perm) = 0;
  // Trains on the images perm[b0 .. b0 + nb), the `step`-th batch (0-based) of `epoch`.
  virtual void step(int epoch, std::int64_t step, std::int64_t b0, std::int64_t nb) = 0;
  // The epoch's statistics after `steps_done` steps, for progress (the GPU waits here).
  virtual StepStats progress(int epoch, std::int64_t steps_done) = 0;
  // After the epoch's last step run (`steps_done` of them; `complete` when that is all of
  // them): fills log's samples, loss, accuracy, loss_scale and skipped_steps.
  virtual void end_epoch(int epoch, std::int64_t steps_done, bool complete, EpochLog& log) = 0;
};

// The epoch loop, one for both devices: epochs [initial_epoch, epochs) of `train` in
// batches of options.batch_size, shuffled per epoch from the seed; progress and stop
// requests after each step; a complete epoch is validated on `validation` (when it has
// images) and reported to on_epoch_end. fit() checks its arguments before calling it.
History run_epochs(Sequential& model, StepRunner& runner, const data::Dataset& train,
                   const data::Dataset* validation, const FitOptions& options, const FitCallbacks& callbacks);

}  // namespace mf
