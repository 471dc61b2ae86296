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

#include "apps/atomic_file.h"
#include "apps/checkpoint.h"
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
#if MF_WITH_STB
#include "apps/plot.h"
#endif
#include "tensor/parallel.h"
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
    mf::apps::remove_temp_file_in_progress();
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

// The shortest decimal that reads back as exactly `v` ("0.2", "0.2000001", "1e-08"). Plain
// %g keeps six digits, which would print 0.2000001 as "0.2" and make a message about two
// different values show the same number twice.
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

struct Options {
  std::string device = "auto", data_dir, metrics_json, optimizer = "adam", pipeline = "auto", conv_algo = "find";
  std::string save, resume, plot;
  std::int64_t epochs = 5, batch_size = 64, seed = 0, threads = 0, gpu = 0, gpu_memory_limit_mb = 0,
               workspace_mb = 64, limit_train = 0;
  double lr = 1e-3, momentum = 0.0, validation_split = 0.2, min_accuracy = 0.0;
  bool fp16 = false, no_graph = false, deterministic = false, dense_grad = false, verbose = false, quiet = false,
       overwrite = false;
};

// "NaN" or "infinite", for the messages about a loss that is not a number.
const char* non_finite_name(double v) { return std::isnan(v) ? "NaN" : "infinite"; }

// A metric as the epoch lines print it: four significant digits ("0.1147", "1.325e+36").
std::string metric(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

// ---- the steps of a run, in order ----

// The flags, with their help texts, ranges and defaults (o's initial values).
void define_flags(mf::apps::Flags& flags, Options& o) {
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
  flags.add_string("conv-algo", &o.conv_algo, "GPU: cuDNN algorithm choice", {"find", "heuristic"});
  flags.add_int("workspace-mb", &o.workspace_mb, 0, 1 << 20, "GPU: cuDNN workspace limit in MiB");
  flags.add_bool("deterministic", &o.deterministic,
                 "GPU: only cuDNN algorithms that give the same bits at every run (two runs with one seed on one "
                 "card then print the same losses); may be slower. The CPU path always is");
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

// Outputs that would destroy something are refused before anything runs: two flags naming
// one file, an output on a data file or on a checkpoint, --save over an existing run.
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
      if (out != &o.save && apps::is_checkpoint_file(*out))
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

// --resume: the checkpoint is read and checked in full before anything else, and its
// settings become the run's; a flag given with another value is an error. Returns the
// checkpoint (empty without --resume).
mf::apps::CheckpointFile reconcile_resume(Options& o, const mf::apps::Flags& flags) {
  using namespace mf;
  apps::CheckpointFile resume;
  if (!o.resume.empty()) {
    resume = apps::read_checkpoint(o.resume);
    const apps::CheckpointMeta& m = resume.contents.meta;
    auto differs = [&](const char* flag, const std::string& given, const std::string& saved) {
      throw std::invalid_argument("--resume " + o.resume + ": --" + flag + " " + given + " differs from the " +
                                  saved + " the run was saved with (leave --" + flag +
                                  " out to continue with the saved value)");
    };
    // A saved setting must lie in the range its flag allows: the checksum proves the file
    // is whole, not that a build or a person wrote sane values (a batch size of 2^62 would
    // wrap the tensor sizes, a NaN learning rate would train to NaN). The ranges are the
    // flags' own, so they are written once.
    auto check_saved = [&](const char* key, const char* flag, auto value, const std::string& shown) {
      if (!flags.accepts(flag, value))
        throw std::invalid_argument("--resume " + o.resume + ": saved " + key + "=" + shown +
                                    " is out of range: --" + flag + " must be " + flags.range_text(flag));
    };
    if (flags.given("seed") && static_cast<std::uint64_t>(o.seed) != m.seed)
      differs("seed", std::to_string(o.seed), std::to_string(m.seed));
    o.seed = static_cast<std::int64_t>(m.seed);
    check_saved("batch_size", "batch-size", m.batch_size, std::to_string(m.batch_size));
    if (flags.given("batch-size") && o.batch_size != m.batch_size)
      differs("batch-size", std::to_string(o.batch_size), std::to_string(m.batch_size));
    o.batch_size = m.batch_size;
    if (flags.given("fp16") && o.fp16 != m.fp16)
      throw std::invalid_argument("--resume " + o.resume +
                                  ": the run was saved in fp32; --fp16 cannot be switched on when resuming it");
    o.fp16 = m.fp16;
    if (m.optimizer.empty())
      throw std::invalid_argument("--resume " + o.resume + ": holds weights only (no optimizer state)");
    if (flags.given("optimizer") && o.optimizer != lower(m.optimizer))
      differs("optimizer", o.optimizer, "optimizer " + m.optimizer);
    o.optimizer = lower(m.optimizer);
    check_saved("validation_split", "validation-split", m.validation_split, gnum(m.validation_split));
    if (flags.given("validation-split") && o.validation_split != m.validation_split)
      differs("validation-split", gnum(o.validation_split), "split " + gnum(m.validation_split));
    o.validation_split = m.validation_split;
    check_saved("limit_train", "limit-train", m.limit_train, std::to_string(m.limit_train));
    if (flags.given("limit-train") && o.limit_train != m.limit_train)
      differs("limit-train", std::to_string(o.limit_train), "limit " + std::to_string(m.limit_train));
    o.limit_train = m.limit_train;
    // The learning rate and momentum may change on purpose (fine-tuning); default: saved.
    // A saved lr of exactly 0 means "not recorded" (CheckpointMeta's default): --lr's
    // default is used then. Any other saved lr, NaN included, must be in --lr's range.
    if (!flags.given("lr") && m.lr != 0) {
      check_saved("lr", "lr", m.lr, gnum(m.lr));
      o.lr = m.lr;
    }
    if (!flags.given("momentum")) {
      check_saved("momentum", "momentum", m.momentum, gnum(m.momentum));
      o.momentum = m.momentum;
    }
  }
  // Adam has no momentum term (its beta_1 plays that part): a --momentum given with it would
  // be ignored and still be written into the checkpoint.
  if (flags.given("momentum") && o.optimizer != "sgd")
    throw std::invalid_argument("--momentum applies to --optimizer sgd only; this run uses " + o.optimizer +
                                (o.resume.empty() ? "" : " (saved in " + o.resume + ")"));
  return resume;
}

// The device (and on the GPU its index and memory cap), the CPU threads and the
// convolutions' options; --fp16 without a GPU is an error.
mf::Device choose_device(const Options& o, const mf::apps::Flags& flags) {
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
  conv_options().find = o.conv_algo == "find";
  conv_options().workspace_limit = static_cast<std::size_t>(o.workspace_mb) << 20;
  conv_options().deterministic = o.deterministic;
  if (o.dense_grad) conv_options().cpu_sparse_below = 0.0;
  return device;
}

struct RunData {
  mf::data::Mnist mnist;
  mf::data::Split split;
};

// The images, the validation split and --limit-train.
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

// The article's model for these images, its summary printed, on `device`, compiled with
// the optimizer asked for.
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

// The flags --help marks "GPU:", given for a run on the CPU, which ignores them (and
// --dense-grad on the GPU): one note line each way.
void note_ignored_flags(const Options& o, const mf::apps::Flags& flags, mf::Device device) {
  using namespace mf;
  if (device == Device::kCpu) {
    std::vector<std::string> ignored;
    for (const char* f :
         {"gpu", "gpu-memory-limit", "pipeline", "no-graph", "conv-algo", "workspace-mb", "deterministic"})
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

// Where a resumed run stands: the epochs done (the one a stop cut short restarts), and the
// saved epochs' history, which this run's epochs follow.
struct Resumed {
  int initial_epoch = 0;
  bool partial = false;  // the last saved epoch was cut short by a stop
  std::vector<mf::EpochLog> epochs;
};

// --resume: the checkpoint's weights and optimizer state into `model` (built and compiled
// already), with a line saying what was restored and notes when nothing would be trained
// or saved. Without --resume, a fresh start.
Resumed restore_resumed(const Options& o, const mf::apps::CheckpointFile& resume, mf::Sequential& model) {
  using namespace mf;
  Resumed r;
  if (!o.resume.empty()) {
    apps::restore_checkpoint(resume.contents, reinterpret_cast<const std::uint8_t*>(resume.bytes.data()), o.resume,
                             model, model.optimizer());
    const apps::CheckpointMeta& m = resume.contents.meta;
    r.initial_epoch = m.epoch;
    r.partial = m.partial_epoch;
    for (const EpochLog& e : m.history)
      if (e.epoch < m.epoch) r.epochs.push_back(e);
    std::printf("Resuming %s: %d epoch(s) done%s, %lld optimizer steps\n", o.resume.c_str(), m.epoch,
                m.partial_epoch ? (", epoch " + std::to_string(m.epoch + 1) + " was interrupted and restarts").c_str()
                                : "",
                static_cast<long long>(model.optimizer()->iterations()));
    if (r.initial_epoch >= o.epochs)
      std::fprintf(stderr, "train_mnist: note: the checkpoint already has %d epoch(s) and --epochs is %lld: "
                           "nothing to train (raise --epochs to continue)\n",
                   r.initial_epoch, static_cast<long long>(o.epochs));
    else if (o.save.empty())
      std::fprintf(stderr, "train_mnist: note: --resume without --save: the epochs trained now are saved nowhere "
                           "(--save %s goes on in the checkpoint)\n", o.resume.c_str());
  }
  return r;
}

}  // namespace

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
    const apps::CheckpointFile resume = reconcile_resume(o, flags);
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
    apps::CheckpointMeta meta;
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
      apps::save_checkpoint(o.save, model, model.optimizer(), meta);
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
    std::printf("Training on %s (%s), %s, batch %lld, %lld training / %lld validation images, %s\n",
                device_name(device), hw.c_str(), o.fp16 ? "mixed precision fp16" : "fp32",
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
    fo.pipeline = o.pipeline == "resident" ? Pipeline::kResident
                  : o.pipeline == "prefetch" ? Pipeline::kPrefetch
                  : o.pipeline == "naive"    ? Pipeline::kNaive
                                             : Pipeline::kAuto;
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
    std::fprintf(stderr, "train_mnist: error: out of host memory while %s; %s\n", apps::one_line(stage).c_str(),
                 oom_hint);
    return 1;
  } catch (const OutOfMemoryError& e) {
    // A tensor the host could not allocate names itself ("out of host memory allocating f32
    // (16384, 26, 26, 32) on cpu (1.29 GiB)"); what to try depends on what was running. The
    // GPU's message already says what to try.
    std::string msg = apps::one_line(e.what());
    if (msg.rfind("out of host memory", 0) == 0) msg += " while " + apps::one_line(stage) + "; " + oom_hint;
    std::fprintf(stderr, "train_mnist: error: %s\n", msg.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mnist: error: %s\n", apps::one_line(e.what()).c_str());
    return 1;
  }
}

int main(int argc, char** argv) {
  mf::apps::reserve_standard_fds();
  mf::apps::write_failures_are_errors();  // a closed standard output stops the run, saved (see should_stop)
  return mf::apps::exit_status_after_stdout("train_mnist", run_main(argc, argv));
}
