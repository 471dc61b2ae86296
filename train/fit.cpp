// fit.cpp: the epoch loop, the same on both devices; the StepRunner does the device's part.
#include "train/fit.h"

#include <chrono>
#include <limits>

#include "data/batching.h"
#include "train/sequential.h"

namespace mf {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

History run_epochs(Sequential& model, StepRunner& runner, const data::Dataset& train,
                   const data::Dataset* validation, const FitOptions& options, const FitCallbacks& callbacks) {
  History history;
  history.completed_epochs = options.initial_epoch;
  const std::int64_t bs = options.batch_size;
  const std::int64_t steps = data::num_batches(train.count, bs);
  for (int epoch = options.initial_epoch; epoch < options.epochs; ++epoch) {
    model.set_training(true);
    const std::vector<std::int32_t> perm = data::epoch_permutation(train.count, options.seed, epoch);
    const auto t0 = Clock::now();
    runner.begin_epoch(epoch, perm);
    double last_progress = -1.0;
    std::int64_t step = 0;
    for (; step < steps; ++step) {
      const std::int64_t b0 = step * bs, nb = std::min(bs, train.count - b0);
      runner.step(epoch, step, b0, nb);
      const double el = seconds_since(t0);
      if (callbacks.on_progress && (el - last_progress >= options.progress_interval_s || step + 1 == steps)) {
        last_progress = el;
        const StepStats st = runner.progress(epoch, step + 1);
        callbacks.on_progress({epoch, step + 1, steps, st.loss_sum / st.count, st.correct / st.count, el});
      }
      if (callbacks.should_stop && callbacks.should_stop()) {
        history.interrupted = true;
        ++step;
        break;
      }
    }
    EpochLog log;
    log.epoch = epoch;
    log.steps = step;
    log.val_loss = log.val_accuracy = std::numeric_limits<double>::quiet_NaN();
    runner.end_epoch(epoch, step, step == steps, log);  // the GPU's last wait
    log.train_seconds = seconds_since(t0);
    if (!model.finish_epoch(log, step == steps, history, validation, callbacks)) break;
  }
  model.set_training(true);
  return history;
}

}  // namespace mf
