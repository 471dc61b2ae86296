// resume.cpp: train_mnist --resume: the flags reconciled with the checkpoint's settings,
// and the checkpoint's state restored into the model (run_config.h).
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
#include "data/mnist.h"
#include "runtime/errors.h"
#include "runtime/gpu_runtime.h"
#include "kernels/kernel_options.h"
#include "train/sequential.h"
#include "optim/adam.h"
#include "optim/sgd.h"


namespace mf::apps {

mf::io::CheckpointFile reconcile_resume(Options& o, const Flags& flags) {
  using namespace mf;
  io::CheckpointFile resume;
  if (!o.resume.empty()) {
    resume = io::read_checkpoint(o.resume);
    const io::CheckpointMeta& m = resume.contents.meta;
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

Resumed restore_resumed(const Options& o, const mf::io::CheckpointFile& resume, mf::Sequential& model) {
  using namespace mf;
  Resumed r;
  if (!o.resume.empty()) {
    io::restore_checkpoint(resume.contents, reinterpret_cast<const std::uint8_t*>(resume.bytes.data()), o.resume,
                             model, model.optimizer());
    const io::CheckpointMeta& m = resume.contents.meta;
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

}  // namespace mf::apps
