// test_checkpoint.cpp: checkpoints: exact round trips, resume == uninterrupted training, and
// every kind of bad file refused with its own message and the model left untouched.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "train/sequential.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tensor/rng.h"
#include "test/test_util.h"

namespace fs = std::filesystem;
using namespace mf;
using io::CheckpointError;

namespace {

// A fresh folder per test, removed at the end.
using mf::testing::TempDir;

// 28x28 images: random pixels, labels 0..9. Enough to give the optimizer real state.
data::Dataset synthetic(std::int64_t n, std::uint64_t seed) {
  data::Dataset d;
  d.count = n;
  d.rows = d.cols = 28;
  d.images.resize(static_cast<std::size_t>(n * 28 * 28));
  d.labels.resize(static_cast<std::size_t>(n));
  Rng rng(seed);
  for (auto& p : d.images) p = static_cast<std::uint8_t>(rng.below(256));
  for (auto& l : d.labels) l = static_cast<std::uint8_t>(rng.below(10));
  return d;
}

Sequential make_model(std::uint64_t seed, bool adam = true) {
  Rng rng(seed);
  Sequential m = Sequential::mnist_cnn(rng);
  if (adam) m.compile(std::make_unique<Adam>());
  else m.compile(std::make_unique<SGD>(0.01f, 0.9f));
  return m;
}

// Every weight and optimizer state tensor of a model, as bytes, for exact comparisons.
std::vector<std::vector<float>> snapshot(Sequential& m) {
  std::vector<std::vector<float>> s;
  for (Parameter* p : m.parameters()) s.push_back(p->value.to_vector());
  if (m.optimizer())
    for (auto& [name, t] : m.optimizer()->state()) s.push_back(t.to_vector());
  return s;
}

std::string slurp(const std::string& path) { return io::read_file_bytes(path); }
void spit(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}

io::CheckpointMeta meta_for(int epoch) {
  io::CheckpointMeta m;
  m.epoch = epoch;
  m.seed = 42;
  m.batch_size = 32;
  m.lr = 1e-3;
  m.validation_split = 0.2;
  EpochLog e;
  e.epoch = 0;
  e.loss = 2.25;
  e.accuracy = 0.125;
  e.val_loss = std::nan("");
  e.val_accuracy = std::nan("");
  e.steps = 4;
  e.samples = 128;
  m.history.push_back(e);
  return m;
}

// A model trained a few steps (so m and v are not zero), saved to `path`.
Sequential trained_and_saved(const std::string& path, std::uint64_t seed = 1) {
  Sequential m = make_model(seed);
  FitOptions fo;
  fo.epochs = 1;
  fo.batch_size = 32;
  m.fit(synthetic(96, 5), nullptr, fo);
  io::save_checkpoint(path, m, *m.optimizer(), meta_for(1));
  return m;
}

// Loading `path` into a fresh model must fail with a message containing `expect`, and
// leave the model exactly as it was.
void expect_refused(const std::string& path, const std::string& expect) {
  Sequential m = make_model(99);
  const auto before = snapshot(m);
  try {
    io::load_checkpoint(path, m, *m.optimizer());
    ADD_FAILURE() << "loading " << path << " should have failed with '" << expect << "'";
  } catch (const CheckpointError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find(expect), std::string::npos) << "message: " << w;
    EXPECT_EQ(w.rfind(path + ": ", 0), 0u) << "the message must start with the file: " << w;
    EXPECT_EQ(w.find('\n'), std::string::npos) << "one line: " << w;
  }
  EXPECT_EQ(snapshot(m), before) << "a failed load changed the model";
}

}  // namespace

TEST(Checkpoint, RoundTripRestoresWeightsAndOptimizerStateExactly) {
  TempDir dir;
  const std::string path = dir.file("a.ckpt");
  Sequential a = trained_and_saved(path);
  Sequential b = make_model(2);  // other seed: other weights
  ASSERT_NE(snapshot(a), snapshot(b));
  const io::CheckpointMeta m = io::load_checkpoint(path, b, *b.optimizer());
  EXPECT_EQ(snapshot(a), snapshot(b));
  EXPECT_EQ(b.optimizer()->iterations(), 3);
  EXPECT_EQ(m.epoch, 1);
  EXPECT_FALSE(m.partial_epoch);
  EXPECT_EQ(m.seed, 42u);
  EXPECT_EQ(m.batch_size, 32);
  EXPECT_EQ(m.optimizer, "Adam");
  EXPECT_EQ(m.iterations, 3);
  ASSERT_EQ(m.history.size(), 1u);
  EXPECT_EQ(m.history[0].loss, 2.25);
  EXPECT_TRUE(std::isnan(m.history[0].val_loss));
  EXPECT_EQ(m.history[0].samples, 128);
  // Nothing left behind but the checkpoint itself (no temporary files).
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}), 1);
}

TEST(Checkpoint, WeightsOnlyLoadIgnoresOptimizerState) {
  TempDir dir;
  const std::string path = dir.file("a.ckpt");
  Sequential a = trained_and_saved(path);
  Rng rng(3);
  Sequential plain = Sequential::mnist_cnn(rng);  // not compiled: predict's case
  io::load_checkpoint(path, plain, nullptr);
  auto pa = a.parameters(), pb = plain.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(pa[i]->value.to_vector(), pb[i]->value.to_vector());
}

TEST(Checkpoint, ResumeEqualsUninterruptedTraining) {
  TempDir dir;
  const data::Dataset train = synthetic(320, 11);
  FitOptions fo;
  fo.batch_size = 16;
  fo.seed = 7;

  Sequential straight = make_model(1);
  fo.epochs = 2;
  straight.fit(train, nullptr, fo);

  Sequential first = make_model(1);
  fo.epochs = 1;
  first.fit(train, nullptr, fo);
  io::save_checkpoint(dir.file("e1.ckpt"), first, *first.optimizer(), meta_for(1));

  Sequential resumed = make_model(123);  // another seed: everything must come from the file
  const io::CheckpointMeta m = io::load_checkpoint(dir.file("e1.ckpt"), resumed, *resumed.optimizer());
  fo.epochs = 2;
  fo.initial_epoch = m.epoch;
  const History h = resumed.fit(train, nullptr, fo);
  EXPECT_EQ(h.completed_epochs, 2);
  EXPECT_EQ(resumed.optimizer()->iterations(), straight.optimizer()->iterations());
  // Same data order (seed, epoch), same state: the same floating-point operations.
  EXPECT_EQ(snapshot(resumed), snapshot(straight));
}

TEST(Checkpoint, TruncatedFilesAreRefused) {
  TempDir dir;
  const std::string good = dir.file("good.ckpt");
  trained_and_saved(good);
  const std::string bytes = slurp(good);
  for (std::size_t keep : {std::size_t{3}, std::size_t{20}, std::size_t{27}, std::size_t{200}, bytes.size() / 2,
                           bytes.size() - 1}) {
    SCOPED_TRACE(keep);
    const std::string path = dir.file("trunc.ckpt");
    spit(path, bytes.substr(0, keep));
    expect_refused(path, "truncated");
  }
}

TEST(Checkpoint, BitFlipsAreRefusedByTheChecksum) {
  TempDir dir;
  const std::string good = dir.file("good.ckpt");
  trained_and_saved(good);
  const std::string bytes = slurp(good);
  // In the architecture string, in the metadata, in a weight, in the optimizer state and in
  // the checksum itself.
  for (std::size_t at : {std::size_t{30}, std::size_t{400}, bytes.size() / 3, bytes.size() - 100, bytes.size() - 2}) {
    SCOPED_TRACE(at);
    std::string bad = bytes;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    const std::string path = dir.file("flip.ckpt");
    spit(path, bad);
    expect_refused(path, "checksum mismatch");
  }
}

TEST(Checkpoint, ForeignEmptyAndOtherVersionFilesAreRefused) {
  TempDir dir;
  spit(dir.file("empty.ckpt"), "");
  expect_refused(dir.file("empty.ckpt"), "empty file");
  spit(dir.file("png.ckpt"), std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16));
  expect_refused(dir.file("png.ckpt"), "not a microflow checkpoint");
  spit(dir.file("text.ckpt"), "hello\n");
  expect_refused(dir.file("text.ckpt"), "not a microflow checkpoint");
  expect_refused(dir.file("missing.ckpt"), "cannot open");

  const std::string good = dir.file("good.ckpt");
  trained_and_saved(good);
  std::string v2 = slurp(good);
  v2[8] = 2;  // format version 2
  spit(dir.file("v2.ckpt"), v2);
  expect_refused(dir.file("v2.ckpt"), "format version 2, this build reads version 1");
  spit(dir.file("long.ckpt"), slurp(good) + "x");
  expect_refused(dir.file("long.ckpt"), "extra bytes");
}

// A device or a pipe that is not a checkpoint is refused after its first bytes: /dev/zero
// used to be read to the 4 GiB limit (24 s, 8.6 GB) before its magic was looked at.
TEST(Checkpoint, DevicesAndPipesThatAreNotCheckpointsAreRefusedAtOnce) {
  expect_refused("/dev/zero", "not a microflow checkpoint");
  // A pipe offering 4 MiB of text: reading stops at the first chunk, so the writer can put
  // no more than that chunk and a pipe buffer in before the reader goes (EPIPE).
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const auto old_sigpipe = std::signal(SIGPIPE, SIG_IGN);
  std::size_t written = 0;
  std::thread writer([&] {
    const std::string chunk(4096, 'x');
    while (written < (std::size_t{4} << 20)) {
      const ssize_t n = ::write(fds[1], chunk.data(), chunk.size());
      if (n <= 0) break;  // EPIPE: the reader is gone
      written += static_cast<std::size_t>(n);
    }
    ::close(fds[1]);
  });
  const std::string path = "/dev/fd/" + std::to_string(fds[0]);
  try {
    io::read_checkpoint(path);
    ADD_FAILURE() << "a pipe of text was read as a checkpoint";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": not a microflow checkpoint (the file does not start with \"MFCKPT\")");
  }
  ::close(fds[0]);
  writer.join();
  std::signal(SIGPIPE, old_sigpipe);
  EXPECT_LT(written, std::size_t{1} << 20) << "the pipe was read on after its first bytes";
}

// A checkpoint is at most kMaxCheckpointBytes: a larger file is refused from its size,
// unread, even when it starts like one. The real one is far below the limit.
TEST(Checkpoint, FilesLargerThanTheLimitAreRefusedUnread) {
  TempDir dir;
  const std::string good = dir.file("good.ckpt");
  trained_and_saved(good);
  EXPECT_LT(slurp(good).size(), io::kMaxCheckpointBytes / 100);
  // A sparse file: its size is set, no disk space is used.
  const std::string big = dir.file("big.ckpt");
  spit(big, slurp(good).substr(0, 24));
  ASSERT_EQ(::truncate(big.c_str(), static_cast<off_t>(io::kMaxCheckpointBytes) + 1), 0);
  expect_refused(big, "too large (" + std::to_string(io::kMaxCheckpointBytes + 1) + " bytes, at most " +
                          std::to_string(io::kMaxCheckpointBytes) + " expected)");
}

// A pipe or a device says nothing of its size: it is read up to the limit and then refused,
// never to an end it may not have (/dev/zero here). A head check that passes does not change
// that; a regular file exactly at the limit is read whole.
TEST(AtomicFile, AStreamWithoutASizeIsReadUpToTheLimitOnly) {
  for (const bool with_head_check : {false, true}) {
    SCOPED_TRACE(with_head_check ? "head check passes" : "no head check");
    std::size_t head_seen = 0;
    const io::HeadCheck check = [&](const std::string& head) { head_seen = head.size(); };
    try {
      io::read_file_bytes("/dev/zero", 100000, with_head_check ? check : nullptr);
      ADD_FAILURE() << "read /dev/zero to an end";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "/dev/zero: too large (more than 100000 bytes expected)");
    }
    if (with_head_check) {
      EXPECT_GE(head_seen, io::kHeadCheckBytes) << "the head check ran, on the first bytes";
    }
  }
  TempDir dir;
  spit(dir.file("f"), std::string(1000, 'x'));
  EXPECT_EQ(io::read_file_bytes(dir.file("f"), 1000).size(), 1000u);
  EXPECT_THROW(io::read_file_bytes(dir.file("f"), 999), std::runtime_error);
}

// History values that training cannot produce (a loss of 1.7e308, inf or below 0, an
// accuracy outside [0, 1], a negative time) are read as NaN, "not known": the plot leaves
// them out, the JSON writes null, and the weights load. A negative count of steps or
// samples makes the file malformed.
TEST(Checkpoint, HistoryValuesOutOfRangeAreReadAsNotKnown) {
  TempDir dir;
  const double inf = INFINITY;
  struct Case {
    std::function<void(EpochLog&)> spoil;
    std::function<double(const EpochLog&)> read;
  };
  const std::vector<Case> cases = {
      {[](EpochLog& e) { e.loss = 1.7e308; }, [](const EpochLog& e) { return e.loss; }},
      {[&](EpochLog& e) { e.loss = inf; }, [](const EpochLog& e) { return e.loss; }},
      {[](EpochLog& e) { e.loss = -0.5; }, [](const EpochLog& e) { return e.loss; }},
      {[](EpochLog& e) { e.accuracy = 1.5; }, [](const EpochLog& e) { return e.accuracy; }},
      {[&](EpochLog& e) { e.val_loss = inf; }, [](const EpochLog& e) { return e.val_loss; }},
      {[](EpochLog& e) { e.val_accuracy = -0.25; }, [](const EpochLog& e) { return e.val_accuracy; }},
      {[&](EpochLog& e) { e.train_seconds = -inf; }, [](const EpochLog& e) { return e.train_seconds; }},
  };
  Sequential m = trained_and_saved(dir.file("unused.ckpt"));
  const io::CheckpointMeta good = meta_for(1);
  for (std::size_t k = 0; k < cases.size(); ++k) {
    SCOPED_TRACE("case " + std::to_string(k));
    io::CheckpointMeta meta = good;
    cases[k].spoil(meta.history[0]);
    const std::string path = dir.file("odd.ckpt");
    io::save_checkpoint(path, m, *m.optimizer(), meta);
    Sequential fresh = make_model(7);
    const io::CheckpointMeta back = io::load_checkpoint(path, fresh, *fresh.optimizer());
    ASSERT_EQ(back.history.size(), 1u);
    EXPECT_TRUE(std::isnan(cases[k].read(back.history[0]))) << cases[k].read(back.history[0]);
    // The other values, and the weights, are as saved.
    EXPECT_EQ(back.history[0].steps, good.history[0].steps);
    EXPECT_EQ(back.history[0].samples, good.history[0].samples);
    EXPECT_EQ(fresh.parameters()[0]->value.to_vector(), m.parameters()[0]->value.to_vector());
  }
  // A negative count is refused, and never saved over a good file.
  io::CheckpointMeta meta = good;
  meta.history[0].steps = -1;
  const std::string path = dir.file("bad.ckpt");
  spit(path, io::serialize_checkpoint(m, m.optimizer(), meta));
  expect_refused(path, "malformed checkpoint: meta 'history' of epoch 1: a negative count of steps or samples");
  const std::string kept = dir.file("kept.ckpt");
  io::save_checkpoint(kept, m, *m.optimizer(), good);
  const std::string before = slurp(kept);
  try {
    io::save_checkpoint(kept, m, *m.optimizer(), meta);
    ADD_FAILURE() << "saved a history that loading refuses";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("not saved, the file on disk is kept"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slurp(kept), before);
  // The ends of the ranges, and no validation set (NaN), are kept as they are.
  meta = good;
  meta.history[0].loss = std::numeric_limits<float>::max();
  meta.history[0].accuracy = 1;
  meta.history[0].val_loss = meta.history[0].val_accuracy = std::nan("");
  io::save_checkpoint(dir.file("edge.ckpt"), m, *m.optimizer(), meta);
  Sequential fresh = make_model(7);
  const io::CheckpointMeta back = io::load_checkpoint(dir.file("edge.ckpt"), fresh, *fresh.optimizer());
  EXPECT_EQ(back.history[0].loss, static_cast<double>(std::numeric_limits<float>::max()));
  EXPECT_EQ(back.history[0].accuracy, 1.0);
  EXPECT_TRUE(std::isnan(back.history[0].val_loss));
}

// A whole file (good checksum) that holds insane values is refused, naming the tensor, and
// the model is left as it was; such values are never saved over a checkpoint either: NaN weights would predict "nan%" for every class; a negative
// step count would flip the sign of Adam's bias correction.
TEST(Checkpoint, NonFiniteWeightsAndNegativeCountsAreRefused) {
  TempDir dir;
  struct Case {
    std::function<void(Sequential&)> spoil;
    std::string expect;
  };
  const std::vector<Case> cases{
      {[](Sequential& m) { m.parameters()[0]->value.data<float>()[3] = std::nanf(""); },
       "weight tensor 'conv2d/kernel' holds a non-finite value (nan at element 3)"},
      {[](Sequential& m) { m.parameters()[5]->value.data<float>()[0] = -INFINITY; },
       "weight tensor 'dense/bias' holds a non-finite value (-inf at element 0)"},
      {[](Sequential& m) {
         for (auto& [name, t] : m.optimizer()->state())
           if (name == "adam.step") t.data<std::int32_t>()[0] = -1;
       },
       "optimizer state 'optimizer/adam.step' holds a negative count (-1)"},
      {[](Sequential& m) {
         for (auto& [name, t] : m.optimizer()->state())
           if (name == "adam.v") t.data<float>()[2] = -1.0f;
       },
       "optimizer state 'optimizer/adam.v' holds a negative value (-1.000000 at element 2), which a mean of squares "
       "cannot be"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expect);
    Sequential bad = make_model(1);
    c.spoil(bad);
    const std::string path = dir.file("bad.ckpt");
    // save_checkpoint refuses to write these (below): written here as a buggy build would.
    spit(path, io::serialize_checkpoint(bad, bad.optimizer(), meta_for(1)));
    Sequential m = make_model(2);
    const auto before = snapshot(m);
    try {
      io::load_checkpoint(path, m, m.optimizer());
      ADD_FAILURE() << "loaded";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << e.what();
    }
    EXPECT_EQ(snapshot(m), before) << "nothing restored";

    // Saving such a model (a step that diverged) keeps the checkpoint already on disk.
    const std::string good = dir.file("good.ckpt");
    io::save_checkpoint(good, m, *m.optimizer(), meta_for(1));
    const std::string kept = slurp(good);
    try {
      io::save_checkpoint(good, bad, *bad.optimizer(), meta_for(2));
      ADD_FAILURE() << "saved";
    } catch (const CheckpointError& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("not saved, the file on disk is kept: " + c.expect), std::string::npos) << w;
    }
    EXPECT_EQ(slurp(good), kept);
  }
}

TEST(Checkpoint, OtherArchitectureIsRefusedNamingBoth) {
  TempDir dir;
  Rng rng(1);
  Sequential five = Sequential::mnist_cnn(rng, 28, 28, 1, 5);  // 5 classes
  five.compile(std::make_unique<Adam>());
  const std::string path = dir.file("five.ckpt");
  io::save_checkpoint(path, five, *five.optimizer(), meta_for(1));
  Sequential ten = make_model(2);
  expect_refused(path, "saved for another model: checkpoint " + five.architecture() + " vs this model " +
                           ten.architecture());
  // The same layers for other images: a run on other data, said so.
  for (const auto& [rows, channels] : {std::pair<int, int>{28, 3}, {32, 1}}) {
    Sequential other = Sequential::mnist_cnn(rng, rows, rows, channels);
    other.compile(std::make_unique<Adam>());
    io::save_checkpoint(path, other, *other.optimizer(), meta_for(1));
    expect_refused(path, "saved for a model of (" + std::to_string(rows) + ", " + std::to_string(rows) + ", " +
                             std::to_string(channels) +
                             ") images (rows, cols, channels); this one takes (28, 28, 1): the checkpoint comes "
                             "from other data");
  }
}

TEST(Checkpoint, OtherOptimizerOrWeightsOnlyIsRefusedForResume) {
  TempDir dir;
  const std::string path = dir.file("adam.ckpt");
  trained_and_saved(path);
  Sequential sgd = make_model(2, /*adam=*/false);
  const auto before = snapshot(sgd);
  try {
    io::load_checkpoint(path, sgd, *sgd.optimizer());
    ADD_FAILURE() << "expected an error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("was trained with Adam, this run uses SGD"), std::string::npos) << e.what();
  }
  EXPECT_EQ(snapshot(sgd), before);

  Sequential a = make_model(1);
  const std::string wo = dir.file("weights.ckpt");
  io::save_checkpoint(wo, a, nullptr, meta_for(0));
  expect_refused(wo, "weights only");
}

TEST(Checkpoint, FailedSaveKeepsTheOldCheckpoint) {
  TempDir dir;
  const std::string path = dir.file("run.ckpt");
  Sequential a = trained_and_saved(path);
  const std::string old = slurp(path);
  Sequential other = make_model(5);

  // 1. No temporary file can be created: a folder is in the way of every name tried.
  for (int i = 0; i < io::kAtomicTempAttempts; ++i) fs::create_directory(io::atomic_temp_name(path, i));
  try {
    io::save_checkpoint(path, other, *other.optimizer(), meta_for(2));
    ADD_FAILURE() << "expected a CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create a temporary file"), std::string::npos) << e.what();
  }
  for (int i = 0; i < io::kAtomicTempAttempts; ++i) fs::remove(io::atomic_temp_name(path, i));
  EXPECT_EQ(slurp(path), old);

  // 2. The disk "fills up" half way through the write: a file-size limit makes write() fail
  //    with EFBIG (SIGXFSZ ignored so that the call returns an error instead).
  {
    auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
    rlimit saved{};
    ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
    rlimit small = saved;
    small.rlim_cur = 4096;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
    std::string msg;
    try {
      io::save_checkpoint(path, other, *other.optimizer(), meta_for(2));
    } catch (const CheckpointError& e) {
      msg = e.what();
    }
    setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, old_handler);
    EXPECT_NE(msg.find("cannot save checkpoint"), std::string::npos) << msg;
  }
  EXPECT_EQ(slurp(path), old);

  // 3. The folder does not exist.
  EXPECT_THROW(io::save_checkpoint(dir.file("no/such/folder/x.ckpt"), other, *other.optimizer(), meta_for(2)),
               CheckpointError);

  // No temporary files left, and the old checkpoint still loads.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}), 1);
  Sequential b = make_model(9);
  io::load_checkpoint(path, b, *b.optimizer());
  EXPECT_EQ(snapshot(a), snapshot(b));
}

// Someone sharing the folder plants a symlink where the temporary file will be made, pointing
// at one of their victim's files: the save must neither follow it (truncating the target)
// nor remove it, and must still succeed under another name.
TEST(AtomicFile, PlantedSymlinkAtTheTemporaryNameIsNotFollowed) {
  TempDir dir;
  const std::string path = dir.file("run.ckpt"), victim = dir.file("victim.txt");
  spit(victim, "precious data\n");
  const std::string first = io::atomic_temp_name(path, 0);
  EXPECT_EQ(first, path + ".tmp." + std::to_string(::getpid()));
  fs::create_symlink(victim, first);

  const std::string text = "new contents";
  io::write_bytes_atomic(path, text.data(), text.size());
  EXPECT_EQ(slurp(victim), "precious data\n") << "the symlink's target was written through";
  EXPECT_EQ(slurp(path), text);
  EXPECT_FALSE(fs::is_symlink(path)) << "the symlink itself was renamed into place";
  ASSERT_TRUE(fs::is_symlink(first)) << "someone else's file was removed";
  EXPECT_EQ(fs::read_symlink(first), victim);
  // Nothing else left behind: the victim, the planted link and the new file.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}), 3);

  // A symlink pointing at a name that does not exist yet is not followed either (O_CREAT
  // alone would create its target).
  fs::remove(first);
  fs::create_symlink(dir.file("created_by_link.txt"), first);
  io::write_bytes_atomic(path, text.data(), text.size());
  EXPECT_FALSE(fs::exists(dir.file("created_by_link.txt")));
  EXPECT_EQ(slurp(path), text);
}

// Outputs that are not plain files: a symlink to a file has its target replaced and stays a
// link; a pipe or device (--metrics-json /dev/stdout) is written in place, never replaced by
// a regular file. And read_file_bytes reads a pipe (/dev/stdin, <(...)) to its end, where
// its size (0) says nothing.
TEST(AtomicFile, SymlinksAndPipesAreWrittenThroughNotReplaced) {
  TempDir dir;
  const std::string target = dir.file("real.json"), link = dir.file("link.json");
  spit(target, "old");
  fs::create_symlink(target, link);
  io::write_bytes_atomic(link, "new", 3);
  EXPECT_TRUE(fs::is_symlink(link)) << "the link was replaced by a file";
  EXPECT_EQ(slurp(target), "new");
  // A symlink to nothing is refused rather than replaced.
  fs::create_symlink(dir.file("missing.json"), dir.file("dangling.json"));
  EXPECT_THROW(io::write_bytes_atomic(dir.file("dangling.json"), "x", 1), std::runtime_error);
  EXPECT_TRUE(fs::is_symlink(dir.file("dangling.json")));

  // A FIFO with a reader: the bytes go down the pipe, and the FIFO is still a FIFO.
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  io::write_bytes_atomic(fifo, "through the pipe", 16);
  char got[32] = {};
  EXPECT_EQ(::read(reader, got, sizeof got), 16);
  EXPECT_STREQ(got, "through the pipe");
  ::close(reader);
  EXPECT_TRUE(fs::is_fifo(fifo)) << "the FIFO was replaced by a file";
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}), 4) << "no temporary files";

  // Reading a pipe.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ASSERT_EQ(::write(fds[1], "piped bytes", 11), 11);
  ::close(fds[1]);
  EXPECT_EQ(io::read_file_bytes("/dev/fd/" + std::to_string(fds[0])), "piped bytes");
  ::close(fds[0]);
}

// A checkpoint kept private (chmod 600) stays private when a save replaces it: the new file
// used to get 0644, readable by everyone.
TEST(AtomicFile, ReplacedFileKeepsItsPermissions) {
  TempDir dir;
  for (const ::mode_t mode : {0600, 0640, 0444}) {
    const std::string path = dir.file("run.ckpt");
    spit(path, "old");
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    io::write_bytes_atomic(path, "new", 3);
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, mode) << std::oct << (st.st_mode & 07777) << " for " << mode;
    EXPECT_EQ(slurp(path), "new");
    fs::remove(path);
  }
  // A new file: 0644 less the umask.
  const ::mode_t mask = ::umask(022);
  io::write_bytes_atomic(dir.file("new.ckpt"), "x", 1);
  ::umask(mask);
  struct stat st {};
  ASSERT_EQ(::stat(dir.file("new.ckpt").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
}

// A name of up to 255 bytes is written, although "<name>.tmp.<pid>" would pass that limit
// (it failed at the save, after the training); a longer one is refused by name, before any
// work, by output_target.
TEST(AtomicFile, NamesUpTo255BytesAreWrittenAndLongerOnesRefused) {
  TempDir dir;
  for (const std::size_t n : {250, 255}) {
    const std::string path = dir.file(std::string(n, 'c'));
    const std::string tmp = io::atomic_temp_name(path, 3);
    EXPECT_EQ(io::parent_dir(tmp), io::parent_dir(path));
    EXPECT_LE(tmp.size() - io::parent_dir(tmp).size() - 1, 255u) << tmp;
    io::write_bytes_atomic(path, "first", 5);
    io::write_bytes_atomic(path, "second", 6);
    EXPECT_EQ(slurp(path), "second");
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}), 2) << "no temporary files";
  const std::string too_long = dir.file(std::string(256, 'c'));
  try {
    io::output_target(too_long);
    ADD_FAILURE() << "a 256-byte name was not refused";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), too_long + ": the file's name is 256 bytes long, more than the 255 a name can have");
  }
}

// For a death test's child: writes 1 MiB to `path` with write_bytes_atomic under a 4 KiB
// RLIMIT_FSIZE, past which write() raises SIGXFSZ, handled by `on_limit`: a signal that
// comes in the middle of the write, at a known point.
void write_past_a_4k_file_limit(const std::string& path, void (*on_limit)(int)) {
  struct sigaction sa {};
  sa.sa_handler = on_limit;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGXFSZ, &sa, nullptr);
  rlimit small{};
  getrlimit(RLIMIT_FSIZE, &small);
  small.rlim_cur = 4096;
  setrlimit(RLIMIT_FSIZE, &small);
  const std::string big(std::size_t{1} << 20, 'x');
  io::write_bytes_atomic(path, big.data(), big.size());
}

// The names of the files in `dir`, each followed by a space.
std::string names_in(const TempDir& dir) {
  std::string names;
  for (const auto& e : fs::directory_iterator(dir.path())) names += e.path().filename().string() + " ";
  return names;
}

// What train_mnist's second Ctrl-C does: the process ends in the middle of a save, from a
// signal handler. The handler removes the temporary file; the old file stays as it was.
extern "C" void exit_removing_the_temp_file(int) {
  io::remove_temp_file_in_progress();
  ::_exit(130);
}

TEST(AtomicFileDeathTest, ProcessEndingMidWriteLeavesNoTemporaryFile) {
  TempDir dir;
  const std::string path = dir.file("run.ckpt");
  spit(path, "old checkpoint\n");
  EXPECT_EXIT(
      {
        write_past_a_4k_file_limit(path, exit_removing_the_temp_file);
        std::fprintf(stderr, "the write finished");
        std::exit(0);
      },
      ::testing::ExitedWithCode(130), "");
  EXPECT_EQ(slurp(path), "old checkpoint\n");
  EXPECT_EQ(names_in(dir), "run.ckpt ") << "the temporary file was left behind";
}

// predict's Ctrl-C (remove_temp_file_on_stop_signals): a SIGINT in the middle of a write
// removes the temporary file and ends the process as SIGINT does by default (the shell's
// 130). The SIGINT is sent from inside the write, by the SIGXFSZ handler.
extern "C" void interrupt_the_write(int) { (void)::raise(SIGINT); }

TEST(AtomicFileDeathTest, CtrlCMidWriteLeavesNoTemporaryFileAndEndsAsCtrlC) {
  TempDir dir;
  const std::string path = dir.file("grid.png");
  spit(path, "old grid\n");
  EXPECT_EXIT(
      {
        io::remove_temp_file_on_stop_signals();
        write_past_a_4k_file_limit(path, interrupt_the_write);
        std::fprintf(stderr, "the write finished");
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGINT), "");
  EXPECT_EQ(slurp(path), "old grid\n");
  EXPECT_EQ(names_in(dir), "grid.png ") << "the temporary file was left behind";
}

TEST(Checkpoint, ParserBoundsEveryLength) {
  // With the checksum check off (as the fuzzer runs it), a header claiming huge sizes must
  // be refused as malformed, naming the field, not allocated. Each length, count, rank and
  // dimension of the format (checkpoint.h) is set to all ones in turn.
  TempDir dir;
  const std::string path = dir.file("a.ckpt");
  trained_and_saved(path);
  const std::string bytes = slurp(path);
  const auto u32_at = [&](std::size_t at) {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
    return v;
  };
  // The fields' offsets, walked as the format lays them out: architecture, meta, count, and
  // the first tensor record's name, dtype, rank, first dimension and data size.
  const std::size_t arch = 24, meta = arch + 4 + u32_at(arch), count = meta + 4 + u32_at(meta);
  const std::size_t name = count + 4, rank = name + 4 + u32_at(name) + 1, dim0 = rank + 1;
  ASSERT_GE(static_cast<unsigned char>(bytes[rank]), 1) << "the first tensor has at least one dimension";
  const std::size_t nbytes = dim0 + 8 * static_cast<unsigned char>(bytes[rank]);
  const struct {
    std::size_t at, width;
    const char* expect;
  } fields[] = {{arch, 4, "architecture length"}, {meta, 4, "meta length"},       {count, 4, "tensor count"},
                {name, 4, "tensor name length"},  {rank, 1, "has rank 255"},      {dim0, 8, "larger than the file"},
                {nbytes, 8, "does not match"}};
  for (const auto& f : fields) {
    SCOPED_TRACE(f.expect);
    std::string bad = bytes;
    for (std::size_t i = 0; i < f.width; ++i) bad[f.at + i] = static_cast<char>(0xff);
    try {
      io::parse_checkpoint(reinterpret_cast<const std::uint8_t*>(bad.data()), bad.size(), "mem", false);
      ADD_FAILURE() << "expected malformed";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("malformed"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(f.expect), std::string::npos) << e.what();
    }
  }
}

// Damage the checksum cannot be trusted to name: a file size in the header larger than any
// checkpoint is a corrupted header, not a file cut short; a control byte in a name (a NUL
// would end the message there, an ESC would reach the terminal) is refused naming the byte.
TEST(Checkpoint, DamagedHeaderAndNamesSayWhatIsWrong) {
  TempDir dir;
  const std::string path = dir.file("a.ckpt");
  trained_and_saved(path);
  const std::string bytes = slurp(path);
  std::string bad = bytes;
  bad[20] = static_cast<char>(bad[20] ^ 0x40);  // the file size's fifth byte: 2^38 more
  spit(dir.file("size.ckpt"), bad);
  expect_refused(dir.file("size.ckpt"), "corrupted header: it gives the file's size as " +
                                            std::to_string(bytes.size() + (std::uint64_t{1} << 38)) +
                                            " bytes, more than any checkpoint has (256 MiB at most); the file has " +
                                            std::to_string(bytes.size()));
  // Cut short, it still says truncated.
  spit(dir.file("cut.ckpt"), bytes.substr(0, bytes.size() - 100));
  expect_refused(dir.file("cut.ckpt"), "truncated: ");

  const auto u32_at = [&](std::size_t at) {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
    return v;
  };
  const std::size_t arch = 24, meta = arch + 4 + u32_at(arch), count = meta + 4 + u32_at(meta), name = count + 4;
  ASSERT_EQ(bytes.substr(name + 4, 6), "conv2d");
  for (const auto& [at, byte, expect] :
       {std::tuple<std::size_t, char, std::string>{name + 4 + 2, '\0', "tensor name holds the control byte 0x00 at "
                                                                       "its byte 2"},
        {name + 4, '\x1b', "tensor name holds the control byte 0x1b at its byte 0"},
        {arch + 4 + 1, '\n', "architecture holds the control byte 0x0a at its byte 1"},
        {meta + 4 + 1, '\t', "meta holds the control byte 0x09 at its byte 1"}}) {
    SCOPED_TRACE(expect);
    std::string b = bytes;
    b[at] = byte;
    try {
      io::parse_checkpoint(reinterpret_cast<const std::uint8_t*>(b.data()), b.size(), "mem", false);
      ADD_FAILURE() << "expected malformed";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("mem: malformed checkpoint: " + expect + " (a damaged file)"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(CheckpointGpu, MixedPrecisionLoadRefreshesHalfCopies) {
  MF_SKIP_WITHOUT_GPU();
  TempDir dir;
  const std::string path = dir.file("a.ckpt");
  Sequential a = trained_and_saved(path);
  Rng rng(4);
  Sequential g = Sequential::mnist_cnn(rng);
  g.to(Device::kGpu);
  g.set_compute_dtype(DType::kF16);
  g.compile(std::make_unique<Adam>());
  // The f32 optimizer state has no loss scaler: an fp32 checkpoint does not fit an fp16 run.
  EXPECT_THROW(io::load_checkpoint(path, g, *g.optimizer()), CheckpointError);
  io::load_checkpoint(path, g, nullptr);  // weights only
  auto pa = a.parameters(), pg = g.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pg[i]->value.to_vector(), pa[i]->value.to_vector());
    ASSERT_TRUE(pg[i]->half.defined());
    EXPECT_EQ(pg[i]->half.to_vector(), pa[i]->value.to(DType::kF16).to_vector()) << pg[i]->name;
  }
  // And a mixed-precision run round-trips with its loss-scaler state.
  const std::string p16 = dir.file("fp16.ckpt");
  io::save_checkpoint(p16, g, *g.optimizer(), meta_for(1));
  Rng rng2(8);
  Sequential g2 = Sequential::mnist_cnn(rng2);
  g2.to(Device::kGpu);
  g2.set_compute_dtype(DType::kF16);
  g2.compile(std::make_unique<Adam>());
  io::load_checkpoint(p16, g2, *g2.optimizer());
  EXPECT_EQ(snapshot(g2), snapshot(g));
}
