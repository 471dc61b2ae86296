// train_mnist.cpp: trains the article's MNIST CNN on the CPU or the GPU, Keras-style output.
//
//   train_mnist --data DIR                      # GPU if there is one, else CPU
//   train_mnist --device cpu --threads 2
//   train_mnist --device gpu --fp16 --batch-size 1024
//   train_mnist --save run.ckpt --plot run.png   # checkpoint and curves after every epoch
//   train_mnist --resume run.ckpt --save run.ckpt --epochs 10   # continue a saved run in it
//   train_mnist --save run.ckpt --overwrite      # start afresh over an existing checkpoint
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>
#include <unistd.h>

#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "apps/common.h"
#include "apps/flags.h"
#include "apps/progress.h"
#include "apps/run_config.h"
#include "data/mnist.h"
#include "runtime/device_allocator.h"
#include "runtime/errors.h"
#include "runtime/gpu_runtime.h"
#include "kernels/kernel_options.h"
#include "train/sequential.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#if MF_WITH_STB
#include "apps/plot.h"
#endif
#include "runtime/parallel.h"
#include "tensor/rng.h"

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_stop_signal{0};  // the signal that asked to stop first; 0: none
static_assert(std::atomic<bool>::is_always_lock_free, "the signal handler needs a lock-free flag");
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");

// Writes a C string to stderr from a signal handler (write is async-signal-safe).
void signal_safe_print(const char* s) {
  std::size_t n = 0;
  while (s[n]) ++n;
  (void)!::write(STDERR_FILENO, s, n);
}

// Ctrl-C (SIGINT), SIGTERM (kill, a batch scheduler, `timeout`) and SIGHUP (the terminal
// closed) all stop a run the same way. First signal: finish the current step, save, report.
// Second: leave at once, removing the temporary file of a save in progress (the checkpoint
// itself is only ever replaced whole); only async-signal-safe calls here: write, unlink and
// _exit. The exit status is 128 + the first signal's number, as a shell reports a process
// the signal killed (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP).
extern "C" void on_stop_signal(int sig) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, sig);
  if (g_stop.exchange(true)) {
    signal_safe_print("\ntrain_mnist: exiting now\n");
    mf::io::remove_temp_file_in_progress();
    ::_exit(128 + g_stop_signal.load());
  }
  signal_safe_print(sig == SIGINT    ? "\ntrain_mnist: stopping after this step (Ctrl-C again to quit at once)\n"
                    : sig == SIGTERM ? "\ntrain_mnist: terminated (SIGTERM): stopping after this step\n"
                                     : "\ntrain_mnist: hangup (SIGHUP): stopping after this step\n");
}

// sigaction rather than std::signal, whose System V flavour resets the handler after the
// first signal (the second Ctrl-C would then kill the process without a word).
void catch_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
}

// "NaN" or "infinite", for the messages about a loss that is not a number.
const char* non_finite_name(double v) { return std::isnan(v) ? "NaN" : "infinite"; }

// A metric as the epoch lines print it: four significant digits ("0.1147", "1.325e+36").
std::string metric(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

}  // namespace

using namespace mf::apps;  // Options and the steps of a run (run_config.h)

static int run_main(int argc, char** argv) {
  using namespace mf;
  Options o;
  o.data_dir = apps::default_data_dir();
  apps::Flags flags("train_mnist", "[flags]\n\nTrains the MNIST CNN of the article (Conv32-Pool-Conv64-Pool-Dense64-Dense10)\n"
                                   "with Adam and reports Keras-style progress and the test accuracy.\n"
                                   "Exit status: 0 done; 1 an error in the data, a file, the device or the\n"
                                   "training, or flags that contradict each other or the checkpoint; 2 a flag that cannot\n"
                                   "be parsed (unknown, or a missing or out-of-range value); 3 test accuracy below\n"
                                   "--min-accuracy; 130 stopped by Ctrl-C, 143 by SIGTERM, 129 by SIGHUP (with --save,\n"
                                   "after saving the run).");
  define_flags(flags, o);

  try {
    if (!flags.parse(argc, argv)) return 0;
  } catch (const apps::FlagError& e) {
    std::fprintf(stderr, "train_mnist: error: %s\n", e.what());
    return 2;
  }

  // What the run is doing, and what to try, for an out-of-host-memory message.
  std::string stage = "reading the flags and the checkpoint";
  const char* oom_hint = "free some memory";
  try {
    check_outputs(o);
    const io::CheckpointFile resume = reconcile_resume(o, flags);
    const Device device = choose_device(o, flags);
    stage = "loading the data from " + o.data_dir;
    oom_hint = "free some memory, or use a machine with more";
    const RunData run_data = load_data(o);
    const data::Mnist& mnist = run_data.mnist;
    const data::Split& split = run_data.split;
    stage = "building the model";
    oom_hint = "try a smaller --batch-size";
    Sequential model = build_model(o, mnist, device);
    // Where the run stands: the saved epochs (when resuming) followed by this run's.
    Resumed resumed = restore_resumed(o, resume, model);
    std::vector<EpochLog> all_epochs = std::move(resumed.epochs);
    const int initial_epoch = resumed.initial_epoch;
    const bool resumed_partial = resumed.partial;
    io::CheckpointMeta meta;
    meta.seed = static_cast<std::uint64_t>(o.seed);
    meta.batch_size = o.batch_size;
    meta.fp16 = o.fp16;
    meta.lr = o.lr;
    meta.momentum = o.momentum;
    meta.validation_split = o.validation_split;
    meta.limit_train = o.limit_train;
    meta.device = device_name(device);
    auto save = [&](int epochs_done, bool partial) {
      if (o.save.empty()) return;
      meta.epoch = epochs_done;
      meta.partial_epoch = partial;
      meta.history = all_epochs;
      meta.created.clear();
      io::save_checkpoint(o.save, model, model.optimizer(), meta);
    };
    auto plot = [&] {
#if MF_WITH_STB
      if (o.plot.empty() || all_epochs.empty()) return;
      apps::write_training_plot(o.plot, all_epochs,
                                std::string("MNIST CNN, ") + device_name(device) + (o.fp16 ? ", fp16" : ", fp32") +
                                    ", batch " + std::to_string(o.batch_size) + ", " + model.optimizer()->name());
#endif
    };

    const std::string hw = apps::hardware_description(device, static_cast<int>(o.gpu));
    std::printf("Training on %s (%s), %s, %s kernels, batch %lld, %lld training / %lld validation images, %s\n",
                device_name(device), hw.c_str(), o.fp16 ? "mixed precision fp16" : "fp32", rung_name(model.rung()),
                static_cast<long long>(o.batch_size), static_cast<long long>(split.train.count),
                static_cast<long long>(split.validation.count), model.optimizer()->describe().c_str());
    if (o.device == "auto" && device == Device::kCpu)  // why not the GPU: the article's first check
      std::printf("  (--device auto chose the CPU: %s)\n", gpu_status().reason.c_str());
    std::fflush(stdout);

    FitOptions fo;
    fo.epochs = static_cast<int>(o.epochs);
    fo.batch_size = o.batch_size;
    fo.seed = static_cast<std::uint64_t>(o.seed);
    // Not clamped to --epochs: with initial_epoch >= epochs fit trains nothing and reports
    // completed_epochs = initial_epoch, so the final save keeps the checkpoint's epoch count
    // (clamping wrote "1 epoch done" beside weights trained for 2).
    fo.initial_epoch = initial_epoch;
    fo.use_graph = !o.no_graph;
    fo.pipeline = pipeline_of(o);
    note_ignored_flags(o, flags, device);
    apps::ProgressPrinter progress(stdout, !o.quiet && isatty(STDOUT_FILENO), static_cast<int>(o.epochs));
    FitCallbacks cb;
    cb.on_progress = [&](const Progress& p) { progress.update(p); };
    cb.on_epoch_end = [&](const EpochLog& e) {
      progress.epoch_end(e);
      // The training loss is checked at every step (fit throws NonFiniteLossError); a model
      // whose outputs overflow only on the held-out images is as broken. It stops here,
      // before the save, so the checkpoint keeps the last good epoch.
      if (split.validation.count > 0 && !std::isfinite(e.val_loss))
        throw NonFiniteLossError(std::string("the validation loss became ") + non_finite_name(e.val_loss) +
                                 " at epoch " + std::to_string(e.epoch + 1) + " (training loss " + metric(e.loss) +
                                 "): the model's outputs overflow" +
                                 (o.save.empty() ? std::string()
                                                 : "; epoch " + std::to_string(e.epoch + 1) + " was not saved to " +
                                                       o.save) +
                                 "; lower the learning rate (--lr)");
      all_epochs.push_back(e);
      save(e.epoch + 1, false);
      plot();
      if (o.verbose && device == Device::kGpu) apps::print_gpu_report(model, o.fp16);
      else if (o.verbose) apps::print_cpu_report(model);
    };
    catch_stop_signals();
    // Standard output that cannot be written (`train_mnist | head`, a full disk) stops the run
    // as a signal does, saved; the error is reported at exit. SIGPIPE is ignored (main calls
    // write_failures_are_errors), so a closed pipe is such an error, not a silent death.
    cb.should_stop = [] { return g_stop.load() || std::ferror(stdout) != 0; };

    stage = "training";
    const History h = model.fit(split.train, split.validation.count ? &split.validation : nullptr, fo, cb);
    if (h.interrupted) {
      std::printf("\nInterrupted after %d complete epoch(s).\n", h.completed_epochs);
      // Stopped inside an epoch: its weights are saved, marked as not done, and resuming
      // reruns it. Stopped at an epoch's last step: that epoch finished and is saved as done.
      const bool mid_epoch = h.ended_mid_epoch();
      save(h.completed_epochs, mid_epoch);
      if (!o.save.empty())
        std::printf("Saved %s; continue with --resume %s (epoch %d %s).\n", o.save.c_str(), o.save.c_str(),
                    h.completed_epochs + 1, mid_epoch ? "restarts" : "is next");
    } else {
      // Every finished epoch was saved as it ended, the last one included. A resumed run with
      // nothing left to train is saved here (under another name, keeping the saved epoch's state).
      if (h.epochs.empty()) save(h.completed_epochs, resumed_partial);
    }
    plot();
    // No step is left to finish: from here on a signal exits at once, removing the temporary
    // file of a --metrics-json write in progress.
    g_stop.store(true);

    stage = "evaluating on the test images";
    oom_hint = "free some memory";
    const EvalResult test = model.evaluate(mnist.test);
    std::printf("Test loss: %.4f - Test accuracy: %.4f (%lld images)\n", test.loss, test.accuracy,
                static_cast<long long>(test.count));
    // Not a result: the metrics are not written and the exit status says the run failed.
    if (!std::isfinite(test.loss))
      throw NonFiniteLossError(std::string("the test loss is ") + non_finite_name(test.loss) +
                               " (test accuracy " + metric(test.accuracy) +
                               "): the model's outputs overflow on the test images");
    if (!o.metrics_json.empty()) {
      apps::RunInfo info{device, o.fp16, o.batch_size, num_threads(), hw, mnist.dir, o.seed,
                         device == Device::kCpu || o.deterministic};
      History all = h;
      all.epochs = all_epochs;
      // Stopped inside an epoch: that epoch too, marked partial. Stopped at an epoch's last
      // step, that epoch ended and is in all_epochs already.
      if (h.ended_mid_epoch()) all.epochs.push_back(h.epochs.back());
      apps::write_metrics_json(o.metrics_json, info, all, test, model);
    }
    // Stopped by a signal: 128 + its number. Stopped because standard output failed: main's
    // exit_status_after_stdout reports that failure, with status 1.
    if (h.interrupted) return g_stop_signal.load() ? 128 + g_stop_signal.load() : 0;
    if (test.accuracy < o.min_accuracy) {
      // Four decimals, or as many as it takes to show the two differ (0.10001 against 0.1).
      int digits = 4;
      char acc[40], bar[40];
      do {
        std::snprintf(acc, sizeof acc, "%.*f", digits, test.accuracy);
        std::snprintf(bar, sizeof bar, "%.*f", digits, o.min_accuracy);
      } while (std::strcmp(acc, bar) == 0 && ++digits <= 17);
      std::fprintf(stderr, "train_mnist: error: test accuracy %s is below --min-accuracy %s\n", acc, bar);
      return 3;
    }
    return 0;
  } catch (const std::bad_alloc&) {
    // The C++ library's own message is just "std::bad_alloc": say what ran out and what to try.
    std::fprintf(stderr, "train_mnist: error: out of host memory while %s; %s\n", mf::one_line(stage).c_str(),
                 oom_hint);
    return 1;
  } catch (const OutOfMemoryError& e) {
    // A tensor the host could not allocate names itself ("out of host memory allocating f32
    // (16384, 26, 26, 32) on cpu (1.29 GiB)"); what to try depends on what was running. The
    // GPU's message already says what to try.
    std::string msg = mf::one_line(e.what());
    if (msg.rfind("out of host memory", 0) == 0) msg += " while " + mf::one_line(stage) + "; " + oom_hint;
    std::fprintf(stderr, "train_mnist: error: %s\n", msg.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mnist: error: %s\n", mf::one_line(e.what()).c_str());
    return 1;
  }
}

int main(int argc, char** argv) {
  mf::apps::reserve_standard_fds();
  mf::apps::write_failures_are_errors();  // a closed standard output stops the run, saved (see should_stop)
  return mf::apps::exit_status_after_stdout("train_mnist", run_main(argc, argv));
}
