// train_mnist.cpp: trains the article's MNIST CNN on the CPU or the GPU, Keras-style output.
//
//   train_mnist --data DIR                      # GPU if there is one, else CPU
//   train_mnist --device cpu --threads 2
//   train_mnist --device gpu --fp16 --batch-size 1024
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <unistd.h>

#include "apps/common.h"
#include "apps/flags.h"
#include "apps/progress.h"
#include "data/mnist.h"
#include "kernels/device_allocator.h"
#include "kernels/errors.h"
#include "kernels/gpu_runtime.h"
#include "layers/conv_options.h"
#include "layers/sequential.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tensor/parallel.h"
#include "tensor/rng.h"

namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_sigint(int) { g_stop.store(true); }

struct Options {
  std::string device = "auto", data_dir, metrics_json, optimizer = "adam", pipeline = "auto", conv_algo = "find";
  std::int64_t epochs = 5, batch_size = 64, seed = 0, threads = 0, gpu = 0, gpu_memory_limit_mb = 0,
               workspace_mb = 64, limit_train = 0;
  double lr = 1e-3, momentum = 0.0, validation_split = 0.2, min_accuracy = 0.0;
  bool fp16 = false, no_graph = false, verbose = false, quiet = false;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace mf;
  Options o;
  o.data_dir = apps::default_data_dir();
  apps::Flags flags("train_mnist", "[flags]\n\nTrains the MNIST CNN of the article (Conv32-Pool-Conv64-Pool-Dense64-Dense10)\n"
                                   "with Adam and reports Keras-style progress and the test accuracy.");
  flags.add_string("device", &o.device, "where to train", {"auto", "cpu", "gpu"});
  flags.add_string("data", &o.data_dir, "folder with the four MNIST IDX files (raw or .gz)");
  flags.add_int("epochs", &o.epochs, 1, 1000, "training epochs");
  flags.add_int("batch-size", &o.batch_size, 1, 65536, "samples per step");
  flags.add_double("lr", &o.lr, 1e-8, 10.0, "learning rate");
  flags.add_string("optimizer", &o.optimizer, "optimizer", {"adam", "sgd"});
  flags.add_double("momentum", &o.momentum, 0.0, 1.0, "SGD momentum", false);
  flags.add_double("validation-split", &o.validation_split, 0.0, 1.0,
                   "fraction of the training images held out (the LAST ones, as Keras does)", false);
  flags.add_int("seed", &o.seed, 0, INT64_MAX, "seed for the weights and the shuffles");
  flags.add_int("threads", &o.threads, 0, 1024, "CPU threads (0: all hardware threads)");
  flags.add_string("metrics-json", &o.metrics_json, "write per-epoch metrics and the test result to this JSON file");
  flags.add_double("min-accuracy", &o.min_accuracy, 0.0, 1.0, "exit with status 3 if the test accuracy is below this");
  flags.add_int("limit-train", &o.limit_train, 0, INT64_MAX, "train on only the first N training images (0: all)");
  flags.add_bool("fp16", &o.fp16, "GPU: mixed precision (f16 activations, f32 master weights, dynamic loss scale)");
  flags.add_int("gpu", &o.gpu, 0, 1023, "GPU index among the visible devices (CUDA_VISIBLE_DEVICES is honoured)");
  flags.add_int("gpu-memory-limit", &o.gpu_memory_limit_mb, 0, 1 << 24,
                "GPU: cap device memory at this many MiB (0: no cap); going past it is an out-of-memory error");
  flags.add_string("pipeline", &o.pipeline, "GPU: how batches reach the device", {"auto", "resident", "prefetch", "naive"});
  flags.add_bool("no-graph", &o.no_graph, "GPU: run the step eagerly instead of replaying a CUDA graph");
  flags.add_string("conv-algo", &o.conv_algo, "GPU: cuDNN algorithm choice", {"find", "heuristic"});
  flags.add_int("workspace-mb", &o.workspace_mb, 0, 1 << 20, "GPU: cuDNN workspace limit in MiB");
  flags.add_bool("verbose", &o.verbose, "print per-layer GPU algorithms and memory use");
  flags.add_bool("quiet", &o.quiet, "no progress bar, one line per epoch");

  try {
    if (!flags.parse(argc, argv)) return 0;
  } catch (const apps::FlagError& e) {
    std::fprintf(stderr, "train_mnist: error: %s\n", e.what());
    return 2;
  }

  try {
    if (o.threads > 0) set_num_threads(static_cast<int>(o.threads));
    // ---- device ----
    Device device = Device::kCpu;
    if (o.device == "gpu" || (o.device == "auto" && gpu_available())) device = Device::kGpu;
    if (device == Device::kGpu) {
      if (!gpu_available()) throw NoGpuError("--device gpu: " + gpu_status().reason);
      select_gpu(static_cast<int>(o.gpu));
      if (o.gpu_memory_limit_mb > 0)
        DeviceAllocator::instance().set_limit(static_cast<std::size_t>(o.gpu_memory_limit_mb) << 20);
    } else if (o.fp16) {
      throw std::invalid_argument(
          "--fp16 needs the GPU: the CPU path computes in FP32 (use --device gpu, or drop --fp16)");
    }
    conv_options().find = o.conv_algo == "find";
    conv_options().workspace_limit = static_cast<std::size_t>(o.workspace_mb) << 20;

    // ---- data ----
    const data::Mnist mnist = data::load_mnist(o.data_dir);
    data::Split split = data::split_validation(mnist.train, o.validation_split);
    if (o.limit_train > 0 && o.limit_train < split.train.count)
      split.train = data::subset(split.train, 0, o.limit_train);
    if (split.train.count == 0) throw std::invalid_argument("no training images left after the validation split");

    // ---- model ----
    Rng rng(static_cast<std::uint64_t>(o.seed));
    Sequential model = Sequential::mnist_cnn(rng, mnist.train.rows, mnist.train.cols, 1, mnist.train.num_classes);
    std::fputs(model.summary().c_str(), stdout);
    model.to(device);
    if (o.fp16) model.set_compute_dtype(DType::kF16);
    std::unique_ptr<Optimizer> opt;
    if (o.optimizer == "adam") {
      AdamConfig ac;
      ac.lr = static_cast<float>(o.lr);
      opt = std::make_unique<Adam>(ac);
    } else {
      opt = std::make_unique<SGD>(static_cast<float>(o.lr), static_cast<float>(o.momentum));
    }
    model.compile(std::move(opt));

    const std::string hw = apps::hardware_description(device, static_cast<int>(o.gpu));
    std::printf("Training on %s (%s), %s, batch %lld, %lld training / %lld validation images, %s\n",
                device_name(device), hw.c_str(), o.fp16 ? "mixed precision fp16" : "fp32",
                static_cast<long long>(o.batch_size), static_cast<long long>(split.train.count),
                static_cast<long long>(split.validation.count), model.optimizer()->describe().c_str());
    std::fflush(stdout);

    FitOptions fo;
    fo.epochs = static_cast<int>(o.epochs);
    fo.batch_size = o.batch_size;
    fo.seed = static_cast<std::uint64_t>(o.seed);
    fo.use_graph = !o.no_graph;
    fo.pipeline = o.pipeline == "resident" ? Pipeline::kResident
                  : o.pipeline == "prefetch" ? Pipeline::kPrefetch
                  : o.pipeline == "naive"    ? Pipeline::kNaive
                                             : Pipeline::kAuto;
    if (device == Device::kCpu && (o.pipeline != "auto" || o.no_graph))
      std::fprintf(stderr, "train_mnist: note: --pipeline and --no-graph apply to the GPU only\n");

    apps::ProgressPrinter progress(stdout, !o.quiet && isatty(STDOUT_FILENO), static_cast<int>(o.epochs));
    FitCallbacks cb;
    cb.on_progress = [&](const Progress& p) { progress.update(p); };
    cb.on_epoch_end = [&](const EpochLog& e) {
      progress.epoch_end(e);
      if (o.verbose && device == Device::kGpu) apps::print_gpu_report(model, o.fp16);
    };
    std::signal(SIGINT, on_sigint);
    cb.should_stop = [] { return g_stop.load(); };

    const History h = model.fit(split.train, split.validation.count ? &split.validation : nullptr, fo, cb);
    std::signal(SIGINT, SIG_DFL);
    if (h.interrupted) std::printf("\nInterrupted after %d complete epoch(s).\n", h.completed_epochs);

    const EvalResult test = model.evaluate(mnist.test);
    std::printf("Test loss: %.4f - Test accuracy: %.4f (%lld images)\n", test.loss, test.accuracy,
                static_cast<long long>(test.count));
    if (!o.metrics_json.empty()) {
      apps::RunInfo info{device, o.fp16, o.batch_size, num_threads(), hw, mnist.dir, o.seed};
      apps::write_metrics_json(o.metrics_json, info, h, test, model);
    }
    if (h.interrupted) return 130;
    if (test.accuracy < o.min_accuracy) {
      std::fprintf(stderr, "train_mnist: error: test accuracy %.4f is below --min-accuracy %.4f\n", test.accuracy,
                   o.min_accuracy);
      return 3;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mnist: error: %s\n", apps::one_line(e.what()).c_str());
    return 1;
  }
}
