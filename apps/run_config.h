// run_config.h: train_mnist's named steps before the training itself: its flags, the
// checks of its output paths, the reconciliation of a resumed run with its checkpoint, the
// device, the data, the model and the restored state.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "apps/flags.h"
#include "data/mnist.h"
#include "io/checkpoint.h"
#include "train/sequential.h"

namespace mf::apps {

// The shortest decimal that reads back as exactly `v` ("0.2", "0.2000001", "1e-08"). Plain
// %g keeps six digits, which would print 0.2000001 as "0.2" and make a message about two
// different values show the same number twice.
std::string gnum(double v);

// s in lower case (ASCII).
std::string lower(std::string s);

// What the flags set, with their defaults.
struct Options {
  std::string device = "auto", data_dir, metrics_json, optimizer = "adam", pipeline = "auto", conv_algo = "find",
              kernels = "default";
  std::string save, resume, plot;
  std::int64_t epochs = 5, batch_size = 64, seed = 0, threads = 0, gpu = 0, gpu_memory_limit_mb = 0,
               workspace_mb = 64, limit_train = 0;
  double lr = 1e-3, momentum = 0.0, validation_split = 0.2, min_accuracy = 0.0;
  bool fp16 = false, no_graph = false, deterministic = false, no_tf32 = false, dense_grad = false, verbose = false,
       quiet = false, overwrite = false;
};


struct RunData {
  mf::data::Mnist mnist;
  mf::data::Split split;
};

// Where a resumed run stands: the epochs done (the one a stop cut short restarts), and the
// saved epochs' history, which this run's epochs follow.
struct Resumed {
  int initial_epoch = 0;
  bool partial = false;  // the last saved epoch was cut short by a stop
  std::vector<mf::EpochLog> epochs;
};

// The flags, with their help texts, ranges and defaults (o's initial values).
void define_flags(Flags& flags, Options& o);

// Outputs that would destroy something are refused before anything runs: two flags naming
// one file, an output on a data file or on a checkpoint, --save over an existing run.
void check_outputs(const Options& o);

// --resume: the checkpoint is read and checked in full before anything else, and its
// settings become the run's; a flag given with another value is an error. Returns the
// checkpoint (empty without --resume).
mf::io::CheckpointFile reconcile_resume(Options& o, const Flags& flags);

// The device (and on the GPU its index and memory cap), the CPU threads and the
// convolutions' options; --fp16 without a GPU is an error.
mf::Device choose_device(const Options& o, const Flags& flags);

// The images, the validation split and --limit-train.
RunData load_data(const Options& o);

// --pipeline as the training loop takes it.
mf::Pipeline pipeline_of(const Options& o);
// The kernel options the flags ask for: --kernels, --conv-algo, --workspace-mb,
// --deterministic, --dense-grad. Throws std::invalid_argument (one line) for a rung `device`
// does not have, and for --kernels fused with a --pipeline other than resident or auto.
mf::KernelOptions kernel_options(const Options& o, mf::Device device);

// The article's model for these images, its summary printed, on `device`, compiled with
// the optimizer asked for.
mf::Sequential build_model(const Options& o, const mf::data::Mnist& mnist, mf::Device device);

// The flags --help marks "GPU:", given for a run on the CPU, which ignores them (and
// --dense-grad on the GPU): one note line each way.
void note_ignored_flags(const Options& o, const Flags& flags, mf::Device device);

// --resume: the checkpoint's weights and optimizer state into `model` (built and compiled
// already), with a line saying what was restored and notes when nothing would be trained
// or saved. Without --resume, a fresh start.
Resumed restore_resumed(const Options& o, const mf::io::CheckpointFile& resume, mf::Sequential& model);

}  // namespace mf::apps
