// run_config.cpp: train_mnist's steps before the training (run_config.h).
#include "apps/run_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "apps/common.h"
#include "apps/flags.h"
#include "apps/progress.h"
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


namespace mf::apps {

std::string gnum(double v) {
  char b[32];
  for (int digits = 1; digits <= 17; ++digits) {  // 17 digits always round-trip a double
    std::snprintf(b, sizeof b, "%.*g", digits, v);
    if (std::strtod(b, nullptr) == v) break;
  }
  return b;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}


void define_flags(Flags& flags, Options& o) {
  using namespace mf;
  flags.add_string("device", &o.device, "where to train", {"auto", "cpu", "gpu"});
  flags.add_string("data", &o.data_dir, "folder with the four MNIST IDX files (raw or .gz; 4-D image files for images with channels); $MF_DATA_DIR sets the default");
  flags.add_int("epochs", &o.epochs, 1, 1000, "training epochs");
  flags.add_int("batch-size", &o.batch_size, 1, 65536, "samples per step");
  flags.add_double("lr", &o.lr, 1e-8, 10.0, "learning rate");
  flags.add_string("optimizer", &o.optimizer, "optimizer", {"adam", "sgd"});
  flags.add_double("momentum", &o.momentum, 0.0, 1.0, "momentum of --optimizer sgd (Adam has none)", false);
  flags.add_double("validation-split", &o.validation_split, 0.0, 1.0,
                   "fraction of the training images held out (the LAST ones, as Keras does)", false);
  flags.add_int("seed", &o.seed, 0, INT64_MAX, "seed for the weights and the shuffles");
  flags.add_int("threads", &o.threads, 0, 1024, "CPU threads (0: every CPU this process may use)");
  flags.add_string("metrics-json", &o.metrics_json, "write per-epoch metrics and the test result to this JSON file");
  flags.add_double("min-accuracy", &o.min_accuracy, 0.0, 1.0, "exit with status 3 if the test accuracy is below this");
  flags.add_int("limit-train", &o.limit_train, 0, INT64_MAX, "train on only the first N training images (0: all)");
  flags.add_bool("fp16", &o.fp16, "GPU: mixed precision (f16 activations, f32 master weights, dynamic loss scale)");
  flags.add_int("gpu", &o.gpu, 0, 1023, "GPU index among the visible devices (CUDA_VISIBLE_DEVICES is honoured)");
  flags.add_int("gpu-memory-limit", &o.gpu_memory_limit_mb, 0, 1 << 24,
                "GPU: cap device memory at this many MiB (0: no cap); going past it is an out-of-memory error");
  flags.add_string("pipeline", &o.pipeline, "GPU: how batches reach the device", {"auto", "resident", "prefetch", "naive"});
  flags.add_bool("no-graph", &o.no_graph, "GPU: run the step eagerly instead of replaying a CUDA graph");
  flags.add_bool("dense-grad", &o.dense_grad,
                 "CPU: multiply the zeros of the convolution's output gradient too, instead of skipping them");
  flags.add_string("kernels", &o.kernels,
                   "which rung of the kernel ladder runs the layers: naive (plain loops / one CUDA thread per "
                   "output), library (im2col + Eigen / cuDNN + cuBLAS), tuned (CPU: our tiles), fused (GPU: the whole "
                   "training step in 9 fused kernels and Adam's, resident pipeline only); default: tuned on the "
                   "CPU, library on the GPU (docs/gpu_vs_cpu.md)",
                   {"default", "naive", "library", "tuned", "fused"});
  flags.add_string("conv-algo", &o.conv_algo, "GPU: cuDNN algorithm choice", {"find", "heuristic"});
  flags.add_int("workspace-mb", &o.workspace_mb, 0, 1 << 20, "GPU: cuDNN workspace limit in MiB");
  flags.add_bool("deterministic", &o.deterministic,
                 "GPU: only cuDNN algorithms that give the same bits at every run (two runs with one seed on one "
                 "card then print the same losses); may be slower. The CPU path always is");
  flags.add_bool("no-tf32", &o.no_tf32,
                 "GPU: no TF32 (exact FP32 products: cuDNN's FMA math, cuBLAS's pedantic mode), and the fused rung's "
                 "conv2 on CUDA cores instead of Tensor Cores, in FP16 too; by default FP32 convolutions may use TF32, "
                 "as PyTorch's do");
  flags.add_bool("verbose", &o.verbose, "after each epoch, print the kernels each layer ran (CPU) or its GPU algorithms and memory use");
  flags.add_bool("quiet", &o.quiet, "no live progress bar: each epoch's lines are printed when it ends");
  flags.add_string("save", &o.save,
                   "checkpoint here after every epoch and when stopped by Ctrl-C, SIGTERM or SIGHUP (mid-epoch: saved "
                   "as not done, --resume reruns that epoch); a file that exists and is not empty is refused unless it "
                   "is the --resume file or --overwrite is given");
  flags.add_bool("overwrite", &o.overwrite, "let --save replace an existing file that is not the --resume file");
  flags.add_string("resume", &o.resume,
                   "continue the run in this checkpoint up to --epochs (its seed, batch size, precision, optimizer "
                   "and data split; a flag that differs is an error); with --save of the same file the run goes on in it");
  flags.add_string("plot", &o.plot, "write loss and accuracy curves (PNG) here after every epoch");
}

void check_outputs(const Options& o) {
  using namespace mf;
  apps::check_output_path("save", o.save);
  apps::check_output_path("plot", o.plot);
  apps::check_output_path("metrics-json", o.metrics_json);
  // Two of these on one file: --plot or --metrics-json would overwrite the checkpoint
  // (or each other). Only --save may name --resume's file: the run goes on in it.
  {
    const std::pair<const char*, const std::string*> files[] = {
        {"save", &o.save}, {"resume", &o.resume}, {"plot", &o.plot}, {"metrics-json", &o.metrics_json}};
    for (std::size_t i = 0; i < std::size(files); ++i)
      for (std::size_t j = i + 1; j < std::size(files); ++j)
        if (!(i == 0 && j == 1) && apps::same_file(*files[i].second, *files[j].second))
          throw std::invalid_argument(std::string("--") + files[i].first + " " + *files[i].second + " and --" +
                                      files[j].first + " " + *files[j].second +
                                      " name the same file: one would overwrite the other");
  }
  // An output on one of the data files would replace it with a checkpoint, a PNG or JSON as
  // the run goes. The files are only found here, not read; a folder where they cannot be
  // found is reported when the data are loaded, after the checkpoint and device checks.
  {
    const std::vector<std::string> data_files = apps::data_files_in(o.data_dir);
    const std::pair<const char*, const std::string*> outputs[] = {
        {"save", &o.save}, {"plot", &o.plot}, {"metrics-json", &o.metrics_json}};
    for (const auto& [flag, out] : outputs) {
      const std::string file = apps::same_file_among(*out, data_files);
      if (!file.empty())
        throw std::invalid_argument(std::string("--") + flag + " " + *out + " is the data file " + file +
                                    ": writing there would destroy the data");
      // --plot and --metrics-json replace their file each epoch; a checkpoint there (a slip
      // of the tab key: run.ckpt for run.png) would be lost for a picture. (--save on an
      // existing file is judged below.)
      if (out != &o.save && io::is_checkpoint_file(*out))
        throw std::invalid_argument(std::string("--") + flag + " " + *out +
                                    " is a microflow checkpoint: writing there would destroy it (remove it first "
                                    "if that is meant)");
    }
  }
  // A fresh run saving over an existing file would replace a trained model with one epoch
  // of a new run (or less: Ctrl-C saves too). Resuming that file, or --overwrite, says it
  // is meant. An empty file (made by mktemp, or by the shell for `--save /dev/stdout >
  // run.ckpt`) and a device (/dev/null) hold nothing to lose; a symlink to a missing file
  // was refused by check_output_path above.
  if (!o.save.empty() && !o.overwrite && !apps::same_file(o.save, o.resume)) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(o.save, ec) && std::filesystem::file_size(o.save, ec) > 0 && !ec)
      throw std::invalid_argument("--save " + o.save + " already exists: pass --resume " + o.save +
                                  " to continue that run, or --overwrite to replace it");
  }
#if !MF_WITH_STB
  if (!o.plot.empty())
    throw std::invalid_argument("--plot: this build has no PNG support (the stb headers, libstb-dev, were not found)");
#endif
}

mf::Device choose_device(const Options& o, const Flags& flags) {
  using namespace mf;
  if (o.threads > 0) set_num_threads(static_cast<int>(o.threads));
  Device device = Device::kCpu;
  if (o.device == "gpu" || (o.device == "auto" && gpu_available())) device = Device::kGpu;
  if (device == Device::kGpu) {
    if (!gpu_available()) throw NoGpuError("--device gpu: " + gpu_status().reason);
    select_gpu(static_cast<int>(o.gpu));
    if (o.gpu_memory_limit_mb > 0)
      DeviceAllocator::instance().set_limit(static_cast<std::size_t>(o.gpu_memory_limit_mb) << 20);
  } else if (o.fp16 && !o.resume.empty() && !flags.given("fp16")) {
    throw std::invalid_argument("--resume " + o.resume +
                                ": the run was saved in mixed precision (fp16), which needs the GPU (--device gpu)");
  } else if (o.fp16) {
    throw std::invalid_argument(
        "--fp16 needs the GPU: the CPU path computes in FP32 (use --device gpu, or drop --fp16)");
  }
  (void)kernel_options(o, device);  // a rung the device lacks fails here, before any data is read
  return device;
}

mf::Pipeline pipeline_of(const Options& o) {
  using mf::Pipeline;
  for (Pipeline p : {Pipeline::kResident, Pipeline::kPrefetch, Pipeline::kNaive})
    if (o.pipeline == mf::pipeline_name(p)) return p;
  return Pipeline::kAuto;  // the flag admits only these four names
}

mf::KernelOptions kernel_options(const Options& o, mf::Device device) {
  using namespace mf;
  KernelOptions k;
  if (o.kernels != "default" && !parse_rung(o.kernels, k.rung))
    throw std::invalid_argument("--kernels " + o.kernels + ": not a rung (naive, library, tuned or fused)");
  require_rung(k.rung, device, "--kernels " + o.kernels);
  if (k.rung == KernelRung::kFused) mf::check_fused_pipeline(pipeline_of(o));
  k.find = o.conv_algo == "find";
  k.workspace_limit = static_cast<std::size_t>(o.workspace_mb) << 20;
  k.deterministic = o.deterministic;
  k.fma_math_only = o.no_tf32;
  if (o.dense_grad) k.cpu_sparse_below = 0.0;
  return k;
}


RunData load_data(const Options& o) {
  using namespace mf;
  RunData d{data::load_mnist(o.data_dir), {}};
  const data::Mnist& mnist = d.mnist;
  data::Split& split = d.split;
  split = data::split_validation(mnist.train, o.validation_split);
  if (o.limit_train > 0 && o.limit_train < split.train.count)
    split.train = data::subset(split.train, 0, o.limit_train);
  if (split.train.count == 0) throw std::invalid_argument("no training images left after the validation split");
  // As Keras: a split asked for must leave images on both sides (1e-300 of 60,000 rounds to none).
  if (o.validation_split > 0 && split.validation.count == 0)
    throw std::invalid_argument("--validation-split " + gnum(o.validation_split) + " leaves no validation images out of " +
                                std::to_string(mnist.train.count) + " (use 0 for none)");
  return d;
}

mf::Sequential build_model(const Options& o, const mf::data::Mnist& mnist, mf::Device device) {
  using namespace mf;
  // The article's model is for small images: its first Dense layer grows with the image's
  // area (4000x4000 images would give it 4 billion weights, 64 GB with Adam's state).
  // At the other end, two 3x3 convolutions and two 2x2 poolings need 10 pixels a side:
  // 10 -> 8 -> 4 -> 2 -> 1, where 9 -> 7 -> 3 -> 1 leaves the second pool no window.
  constexpr std::int64_t kMaxSide = 256, kMinSide = 10;
  const auto side_error = [&](const char* bound, std::int64_t side) {
    return std::invalid_argument(mnist.dir + ": the images are " + std::to_string(mnist.train.rows) + "x" +
                                 std::to_string(mnist.train.cols) + "; this model takes at " + bound + " " +
                                 std::to_string(side) + "x" + std::to_string(side) + " (MNIST's are 28x28)");
  };
  if (mnist.train.rows > kMaxSide || mnist.train.cols > kMaxSide) throw side_error("most", kMaxSide);
  if (mnist.train.rows < kMinSide || mnist.train.cols < kMinSide) throw side_error("least", kMinSide);
  // Images with channels (a 4-D IDX file: colour, or several planes per digit) widen the
  // first convolution only: 32 x 3 x 3 weights per channel.
  constexpr std::int64_t kMaxChannels = 64;
  if (mnist.train.channels > kMaxChannels)
    throw std::invalid_argument(mnist.dir + ": the images have " + std::to_string(mnist.train.channels) +
                                " channels; this model takes at most " + std::to_string(kMaxChannels) +
                                " (MNIST's have one)");
  Rng rng(static_cast<std::uint64_t>(o.seed));
  Sequential model = Sequential::mnist_cnn(rng, mnist.train.rows, mnist.train.cols, mnist.train.channels,
                                           mnist.train.num_classes);
  std::fputs(model.summary().c_str(), stdout);
  model.to(device);
  model.set_kernel_options(kernel_options(o, device));
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
  return model;
}

void note_ignored_flags(const Options& o, const Flags& flags, mf::Device device) {
  using namespace mf;
  if (device == Device::kCpu) {
    std::vector<std::string> ignored;
    for (const char* f :
         {"gpu", "gpu-memory-limit", "pipeline", "no-graph", "conv-algo", "workspace-mb", "deterministic", "no-tf32"})
      if (flags.given(f) && !(std::string(f) == "pipeline" && o.pipeline == "auto")) ignored.push_back(f);
    std::string list;
    for (std::size_t i = 0; i < ignored.size(); ++i)
      list += (i == 0 ? "--" : i + 1 < ignored.size() ? ", --" : " and --") + ignored[i];
    if (!ignored.empty())
      std::fprintf(stderr, "train_mnist: note: %s appl%s to the GPU only\n", list.c_str(),
                   ignored.size() == 1 ? "ies" : "y");
  }
  if (device != Device::kCpu && o.dense_grad)
    std::fprintf(stderr, "train_mnist: note: --dense-grad applies to the CPU only\n");
}


}  // namespace mf::apps
