// test_apps_cli.cpp: train_mnist from the command line: every bad flag or input exits with
// its documented status (2 for a flag, 1 for the rest) and exactly one line on stderr naming
// the problem; a short real run writes its metrics, plot and checkpoint, and resumes from it;
// a signal or a closed output stops a run with its checkpoint saved whole.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <thread>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "apps/common.h"
#include "apps/flags.h"
#include "data/idx.h"
#include "runtime/gpu_runtime.h"
#include "train/sequential.h"
#include "optim/adam.h"
#include "tensor/rng.h"
#include "test/test_util.h"
#if MF_WITH_STB
#include "io/image.h"
#endif

namespace fs = std::filesystem;
using namespace mf;

namespace {

using mf::testing::count_lines;
using mf::testing::read_whole_file;
using mf::testing::run_program;
using mf::testing::RunResult;
using mf::testing::sh_quote;
using mf::testing::TempDir;

// train_mnist's exit status for a bad flag, and for any other error (--help says so).
constexpr int kBadFlag = 2, kError = 1;

// Exits with `status`; stderr is one line, "train_mnist: error: ...", containing `expect`.
void expect_one_line_error(const std::string& args, const std::string& expect, int status) {
  SCOPED_TRACE("train_mnist " + args);
  TempDir dir("_run");
  const RunResult r = run_program(MF_TRAIN_MNIST_BIN, args, dir);
  EXPECT_EQ(r.status, status);
  EXPECT_EQ(count_lines(r.err), 1) << "stderr:\n" << r.err;
  EXPECT_EQ(r.err.rfind("train_mnist: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(expect), std::string::npos) << "stderr: " << r.err;
}

// The number after `"key": ` in a metrics JSON (the first occurrence), or NaN.
double json_number(const std::string& json, const std::string& key) {
  const std::size_t at = json.find("\"" + key + "\": ");
  return at == std::string::npos ? std::nan("") : std::strtod(json.c_str() + at + key.size() + 4, nullptr);
}

std::string mnist_dir() {
  const char* d = std::getenv("MF_MNIST_DIR");
  return d && *d ? d : apps::default_data_dir();
}

// The four MNIST files in `dir`, raw, with 20 images each of 28x28.
void write_tiny_mnist(const TempDir& dir) {
  const std::vector<std::uint8_t> img(20 * 28 * 28, 7), lab(20, 3);
  data::write_idx(dir.file("train-images-idx3-ubyte"), {20, 28, 28}, img, false);
  data::write_idx(dir.file("train-labels-idx1-ubyte"), {20}, lab, false);
  data::write_idx(dir.file("t10k-images-idx3-ubyte"), {20, 28, 28}, img, false);
  data::write_idx(dir.file("t10k-labels-idx1-ubyte"), {20}, lab, false);
}

// write_tiny_mnist, with every other test label 5 (the rest 3): a model that answers one
// class for the alike images scores 0.5 at most.
void write_tiny_mnist_half_threes(const TempDir& dir) {
  write_tiny_mnist(dir);
  std::vector<std::uint8_t> labels(20, 3);
  for (std::size_t i = 0; i < labels.size(); i += 2) labels[i] = 5;
  data::write_idx(dir.file("t10k-labels-idx1-ubyte"), {20}, labels, false);
}

// MNIST files in `dir` with n blank training images (label 3), a sparse file: its size is
// right but it takes no disk. With 2,000,000 images (1.5 GB) reading it has to allocate the
// 1.5 GB first, which fails under a 1 GB address-space limit.
void write_blank_mnist(const TempDir& dir, std::uint32_t n) {
  write_tiny_mnist(dir);
  const std::string images = dir.file("train-images-idx3-ubyte");
  {
    std::ofstream f(images, std::ios::binary | std::ios::trunc);
    const unsigned char header[16] = {0, 0, 8, 3, static_cast<unsigned char>(n >> 24), static_cast<unsigned char>(n >> 16),
                                      static_cast<unsigned char>(n >> 8), static_cast<unsigned char>(n), 0, 0, 0, 28,
                                      0, 0, 0, 28};
    f.write(reinterpret_cast<const char*>(header), sizeof header);
  }
  fs::resize_file(images, 16 + std::uintmax_t{n} * 28 * 28);
  data::write_idx(dir.file("train-labels-idx1-ubyte"), {n}, std::vector<std::uint8_t>(n, 3), false);
}

// A PNG of side x side 16-bit RGBA pixels, all zero: a small file (2.3 MB for side 8192)
// that stb_image decodes into 8 bytes a pixel, and more while it inflates it.
void write_blank_rgba16_png(const std::string& path, std::uint32_t side) {
  auto be32 = [](std::uint32_t v) {
    const char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                       static_cast<char>(v)};
    return std::string(b, 4);
  };
  auto chunk = [&](const std::string& type, const std::string& data) {
    const std::string body = type + data;
    const auto crc = crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size()));
    return be32(static_cast<std::uint32_t>(data.size())) + body + be32(static_cast<std::uint32_t>(crc));
  };
  // IHDR: width, height, bit depth 16, colour type 6 (RGBA), deflate, no filter, no interlace.
  const std::string ihdr = be32(side) + be32(side) + std::string("\x10\x06\x00\x00\x00", 5);
  std::vector<unsigned char> row(1 + std::size_t{side} * 8, 0), out(1 << 16);  // filter byte, pixels
  std::string idat;
  z_stream z{};
  deflateInit(&z, Z_BEST_SPEED);
  for (std::uint32_t y = 0; y <= side; ++y) {
    const bool last = y == side;
    z.next_in = row.data();
    z.avail_in = last ? 0 : static_cast<uInt>(row.size());
    do {
      z.next_out = out.data();
      z.avail_out = static_cast<uInt>(out.size());
      deflate(&z, last ? Z_FINISH : Z_NO_FLUSH);
      idat.append(reinterpret_cast<const char*>(out.data()), out.size() - z.avail_out);
    } while (z.avail_out == 0);
  }
  deflateEnd(&z);
  std::ofstream(path, std::ios::binary) << "\x89PNG\r\n\x1a\n" << chunk("IHDR", ihdr) << chunk("IDAT", idat)
                                        << chunk("IEND", "");
}

// A 1 GB address-space limit, for the out-of-memory tests. AddressSanitizer and
// ThreadSanitizer reserve far more address space than that for their shadow memory, so a
// sanitized build cannot run under it.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kCanLimitAddressSpace = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kCanLimitAddressSpace = false;
#else
constexpr bool kCanLimitAddressSpace = true;
#endif
#else
constexpr bool kCanLimitAddressSpace = true;
#endif
const char kUlimit1Gb[] = "ulimit -v 1000000";

// What a checkpoint for --resume holds after one epoch: train_mnist's model (the
// architecture fits), compiled with Adam, and the run's settings (batch 64, lr 1e-3, split 0.2).
struct SavedRun {
  Sequential model;
  io::CheckpointMeta meta;
};
SavedRun saved_after_one_epoch() {
  Rng rng(1);
  SavedRun r{Sequential::mnist_cnn(rng), {}};
  r.model.compile(std::make_unique<Adam>());
  r.meta.epoch = 1;
  r.meta.batch_size = 64;
  r.meta.lr = 1e-3;
  r.meta.validation_split = 0.2;
  return r;
}


// train_mnist started in the background with `args`; its stderr goes to `err` (closed when
// `err` is empty), its stdout to `out` or, when `out` is empty, into a pipe whose read end
// is `*read_end`.
pid_t start_train_mnist(const std::vector<std::string>& args, const std::string& out, const std::string& err,
                        int* read_end = nullptr) {
  const std::string bin = mf::testing::program_path(MF_TRAIN_MNIST_BIN);
  std::vector<char*> argv{const_cast<char*>(bin.c_str())};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int fds[2] = {-1, -1};
  if (out.empty() && ::pipe(fds) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {  // the child: only async-signal-safe calls until exec
    const int o = out.empty() ? fds[1] : ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = err.empty() ? 2 : ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int in = ::open("/dev/null", O_RDONLY);
    if (o < 0 || e < 0 || in < 0 || ::dup2(o, 1) < 0 || ::dup2(e, 2) < 0 || ::dup2(in, 0) < 0) ::_exit(126);
    if (out.empty()) ::close(fds[0]);
    if (err.empty()) ::close(2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  if (out.empty()) {
    ::close(fds[1]);
    *read_end = fds[0];
  }
  return pid;
}

// The exit status of `pid`, or -1 when a signal ended it. One still running after 120 s is
// killed: a hang fails the test instead of stalling it.
int wait_exit_status(pid_t pid) {
  int st = 0;
  for (int i = 0; i < 1200 && ::waitpid(pid, &st, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (::waitpid(pid, &st, WNOHANG) == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &st, 0);
    ADD_FAILURE() << "train_mnist still running after 120 s";
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Files in `dir` left by an unfinished atomic write ("run.ckpt.tmp.1234").
std::vector<std::string> temp_files_in(const TempDir& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir.file("")))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) found.push_back(e.path().string());
  return found;
}

// Waits up to 30 s for `text` to appear in the file `path` that a child writes.
void wait_for_text(const std::string& path, const std::string& text) {
  for (int i = 0; i < 600 && read_whole_file(path).find(text) == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

// A long run on the 20 tiny images, one line per epoch, saving after each: a signal or a
// closed output reaches it in the middle of its training.
std::vector<std::string> long_tiny_run(const TempDir& dir) {
  return {"--device", "cpu", "--threads", "1", "--data", dir.file(""), "--epochs", "1000", "--batch-size", "1",
          "--validation-split", "0", "--quiet", "--save", dir.file("run.ckpt")};
}

}  // namespace

TEST(TrainMnistCli, BadFlagsGiveOneLine) {
  expect_one_line_error("--batch-size 0", "--batch-size must be between 1 and", kBadFlag);
  expect_one_line_error("--epochs -1", "--epochs must be between 1 and", kBadFlag);
  expect_one_line_error("--validation-split 1.5", "--validation-split must be in [0, 1)", kBadFlag);
  expect_one_line_error("--lr abc", "--lr expects a number, got 'abc'", kBadFlag);
  expect_one_line_error("--frobnicate", "unknown flag --frobnicate", kBadFlag);
  expect_one_line_error("--epochs", "--epochs needs a value", kBadFlag);
  expect_one_line_error("--device tpu", "--device must be one of auto, cpu, gpu", kBadFlag);
  expect_one_line_error("--fp16 --device cpu", "--fp16 needs the GPU", kError);
  // An empty value would read as "not given": a fresh run over the checkpoint.
  expect_one_line_error("--resume ''", "--resume needs a value, got an empty string", kBadFlag);
  expect_one_line_error("--save --quiet", "--save needs a value, got the flag --quiet", kBadFlag);
}

TEST(TrainMnistCli, FlagValueWithANewlineGivesOneLine) {
  // The shell passes the newline inside the quotes on to the program.
  expect_one_line_error("--epochs '1\n2'", "--epochs expects a whole number, got '1 2'", kBadFlag);
  expect_one_line_error("--lr '1\n2'", "--lr expects a number, got '1 2'", kBadFlag);
  expect_one_line_error("'--a\nb'", "unknown flag --a b", kBadFlag);
#if MF_WITH_STB && defined(MF_PREDICT_BIN)
  TempDir dir;
  const RunResult r = run_program(MF_PREDICT_BIN, "--top '1\n2'", dir);
  EXPECT_EQ(r.status, kBadFlag);
  EXPECT_EQ(r.err, "predict: error: --top expects a whole number, got '1 2'\n");
#endif
}

// The parser all three programs share (train_mnist, predict, doctor): every FlagError is one
// line, whatever the value held.
TEST(Flags, ErrorsAreOneLine) {
  std::int64_t n = 0;
  double x = 0;
  std::string s = "a";
  apps::Flags flags("prog", "");
  flags.add_int("n", &n, 1, 10, "");
  flags.add_double("x", &x, 0.0, 1.0, "");
  flags.add_string("s", &s, "", {"a", "b"});
  for (std::vector<std::string> args :
       {std::vector<std::string>{"--n", "1\n2"}, {"--n", "99\n"}, {"--x", "0.5\r\n"}, {"--s", "a\nb"},
        {"--what\never"}, {"stray\narg"}, {"--n", "1\v"}, {"--s", "a\fb"}, {"--x", "\x1b[2J"}}) {
    std::vector<char*> argv{const_cast<char*>("prog")};
    for (auto& a : args) argv.push_back(a.data());
    try {
      flags.parse(static_cast<int>(argv.size()), argv.data());
      ADD_FAILURE() << "expected a FlagError for " << args[0];
    } catch (const apps::FlagError& e) {
      const std::string w = e.what();
      // No control character: a terminal shows \v and \f as line breaks, and ESC starts a command.
      EXPECT_TRUE(std::none_of(w.begin(), w.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
          << w;
    }
  }
}

// What a real command line holds besides plain flags: "--", a value that looks like a flag,
// an empty value, numbers beyond a double or an int64, and values that round to a bound.
TEST(Flags, EdgesOfTheCommandLine) {
  struct Parsed {
    std::string s = "default", error;
    double x = 0.5;
    std::int64_t n = 1;
    std::vector<std::string> positional;
  };
  auto parse = [](std::vector<std::string> args) {
    Parsed p;
    bool quiet = false;
    apps::Flags flags("prog", "");
    flags.add_string("s", &p.s, "");
    flags.add_double("x", &p.x, 0.0, 1.0, "", /*hi_inclusive=*/false);
    flags.add_int("n", &p.n, 1, 100, "");
    flags.add_bool("quiet", &quiet, "");
    flags.allow_positional("FILE");
    std::vector<char*> argv{const_cast<char*>("prog")};
    for (auto& a : args) argv.push_back(a.data());
    try {
      flags.parse(static_cast<int>(argv.size()), argv.data());
      p.positional = flags.positional();
    } catch (const apps::FlagError& e) {
      p.error = e.what();
    }
    return p;
  };
  // "--" ends the flags: what follows is an argument, even when it looks like a flag.
  Parsed p = parse({"--s", "a", "--", "--quiet", "f.png"});
  EXPECT_EQ(p.error, "");
  EXPECT_EQ(p.s, "a");
  EXPECT_EQ(p.positional, (std::vector<std::string>{"--quiet", "f.png"}));
  EXPECT_EQ(parse({"--", "x"}).positional, std::vector<std::string>{"x"});
  // A forgotten value: the next flag is not taken as the value; --s=--x says it is meant.
  EXPECT_EQ(parse({"--s", "--quiet"}).error,
            "--s needs a value, got the flag --quiet (write --s=VALUE for a value that starts with --)");
  EXPECT_EQ(parse({"--s=--quiet"}).s, "--quiet");
  // An empty value would read as "not given".
  EXPECT_EQ(parse({"--s", ""}).error, "--s needs a value, got an empty string");
  EXPECT_EQ(parse({"--s="}).error, "--s needs a value, got an empty string");
  // Numbers: beyond a double or below its normal range, beyond an int64, rounding to a bound.
  EXPECT_EQ(parse({"--x", "1e999"}).error, "--x must be in [0, 1), got 1e999 (beyond a double)");
  EXPECT_EQ(parse({"--x", "1e-320"}).error, "--x must be in [0, 1), got 1e-320 (below the smallest normal double)");
  EXPECT_EQ(parse({"--x", "inf"}).error, "--x expects a number, got 'inf'");
  EXPECT_EQ(parse({"--x", "0.99999999999"}).error, "--x must be in [0, 1), got 0.99999999999 (1 in single precision)");
  EXPECT_EQ(parse({"--x", "0.9999"}).x, 0.9999);
  EXPECT_EQ(parse({"--n", "99999999999999999999"}).error,
            "--n must be between 1 and 100, got 99999999999999999999 (beyond a 64-bit integer)");
  EXPECT_EQ(parse({"--n", "-5"}).error, "--n must be between 1 and 100, got -5");
}

// The ranges of the flags, for checking values that come from elsewhere (a checkpoint).
TEST(Flags, ReportsTheRangesItAccepts) {
  std::int64_t n = 0;
  double x = 0, y = 0;
  bool b = false;
  apps::Flags flags("prog", "");
  flags.add_int("n", &n, 1, 65536, "");
  flags.add_double("x", &x, 1e-8, 10.0, "");
  flags.add_double("y", &y, 0.0, 1.0, "", /*hi_inclusive=*/false);
  flags.add_bool("b", &b, "");
  EXPECT_EQ(flags.range_text("n"), "between 1 and 65536");
  EXPECT_EQ(flags.range_text("x"), "in [1e-08, 10]");
  EXPECT_EQ(flags.range_text("y"), "in [0, 1)");
  EXPECT_TRUE(flags.accepts("n", std::int64_t{1}));
  EXPECT_TRUE(flags.accepts("n", std::int64_t{65536}));
  EXPECT_FALSE(flags.accepts("n", std::int64_t{0}));
  EXPECT_FALSE(flags.accepts("n", std::int64_t{65537}));
  EXPECT_FALSE(flags.accepts("n", std::int64_t{4611686018427387904}));
  EXPECT_TRUE(flags.accepts("x", 10.0));
  EXPECT_FALSE(flags.accepts("x", 1e300));
  EXPECT_FALSE(flags.accepts("x", 0.0));
  EXPECT_FALSE(flags.accepts("x", std::nan("")));
  EXPECT_TRUE(flags.accepts("y", 0.0));
  EXPECT_FALSE(flags.accepts("y", 1.0));  // the upper end is excluded
  EXPECT_FALSE(flags.accepts("y", -1e-300));
  // Asking about a flag that has no range is the caller's bug.
  EXPECT_THROW(flags.range_text("b"), std::logic_error);
  EXPECT_THROW(flags.accepts("nope", 1.0), std::logic_error);
  EXPECT_THROW(flags.accepts("x", std::int64_t{1}), std::logic_error);  // a double flag
}

TEST(TrainMnistCli, BadDataGivesOneLine) {
  expect_one_line_error("--data /nonexistent/mnist", "/nonexistent/mnist", kError);
  // A folder with the four files, the training images cut short.
  TempDir dir;
  const std::vector<std::uint8_t> img(20 * 28 * 28, 7), lab(20, 3);
  data::write_idx(dir.file("train-images-idx3-ubyte"), {20, 28, 28}, img, false);
  data::write_idx(dir.file("train-labels-idx1-ubyte"), {20}, lab, false);
  data::write_idx(dir.file("t10k-images-idx3-ubyte"), {20, 28, 28}, img, false);
  data::write_idx(dir.file("t10k-labels-idx1-ubyte"), {20}, lab, false);
  fs::resize_file(dir.file("train-images-idx3-ubyte"), 16 + 28 * 28 * 5 + 100);
  expect_one_line_error("--device cpu --data " + dir.file(""), "train-images-idx3-ubyte", kError);
  // Valid files of two 4000x4000 images: refused before a model of 4 billion weights is built.
  TempDir big("_big");
  const std::vector<std::uint8_t> huge(2 * 4000 * 4000, 0), two(2, 1);
  for (const char* set : {"train", "t10k"}) {
    data::write_idx(big.file(std::string(set) + "-images-idx3-ubyte.gz"), {2, 4000, 4000}, huge, true);
    data::write_idx(big.file(std::string(set) + "-labels-idx1-ubyte.gz"), {2}, two, true);
  }
  expect_one_line_error("--device cpu --validation-split 0 --data " + big.file(""),
                        "the images are 4000x4000; this model takes at most 256x256 (MNIST's are 28x28)", kError);
  // Too small for the two poolings: named as the images' fault, not as a layer's error. 10x10
  // is the least that trains (10 -> 8 -> 4 -> 2 -> 1).
  for (const auto& [rows, cols] : {std::pair<std::uint32_t, std::uint32_t>{9, 9}, {10, 9}, {3, 40}, {10, 10}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    TempDir small("_" + std::to_string(rows) + "x" + std::to_string(cols));
    const std::vector<std::uint8_t> pixels(20 * rows * cols, 7);
    for (const char* set : {"train", "t10k"}) {
      data::write_idx(small.file(std::string(set) + "-images-idx3-ubyte"), {20, rows, cols}, pixels, false);
      data::write_idx(small.file(std::string(set) + "-labels-idx1-ubyte"), {20}, lab, false);
    }
    const std::string args = "--device cpu --quiet --epochs 1 --data " + small.file("");
    if (rows < 10 || cols < 10) {
      expect_one_line_error(args, small.file("") + ": the images are " + std::to_string(rows) + "x" +
                                      std::to_string(cols) + "; this model takes at least 10x10 (MNIST's are 28x28)",
                            kError);
    } else {
      const RunResult r = run_program(MF_TRAIN_MNIST_BIN, args, small);
      EXPECT_EQ(r.status, 0) << r.err;
      EXPECT_NE(r.out.find("Test accuracy"), std::string::npos) << r.out;
    }
  }
  // A split asked for that leaves no validation image (1 - 1e-300 rounds to 1) is refused, as
  // Keras refuses it; 0 asks for none.
  write_tiny_mnist(dir);
  expect_one_line_error("--device cpu --data " + dir.file("") + " --validation-split 1e-300",
                        "--validation-split 1e-300 leaves no validation images out of 20 (use 0 for none)", kError);
}

// Images with channels, in 4-D IDX files named idx4-ubyte: the model's first convolution
// takes them all (32 x 3 x 3 weights per channel), and it learns a task only the channels
// tell apart: the label is the channel that is bright (0, 1 or 2), the image's brightness
// the same whichever it is. Too many channels are refused before a model is built.
TEST(TrainMnistCli, ImagesWithChannelsTrain) {
  TempDir dir;
  mf::Rng rng(5);
  for (const auto& [set, n] : {std::pair<std::string, std::uint32_t>{"train", 600}, {"t10k", 200}}) {
    std::vector<std::uint8_t> img(std::size_t{n} * 28 * 28 * 3), lab(n);
    for (std::uint32_t i = 0; i < n; ++i) {
      lab[i] = static_cast<std::uint8_t>(rng.below(3));
      for (std::size_t px = 0; px < 28 * 28; ++px)
        for (std::size_t c = 0; c < 3; ++c)
          img[(i * 28 * 28 + px) * 3 + c] =
              static_cast<std::uint8_t>(c == lab[i] ? 100 + rng.below(156) : rng.below(100));
    }
    data::write_idx(dir.file(set + "-images-idx4-ubyte"), {n, 28, 28, 3}, img, false);
    data::write_idx(dir.file(set + "-labels-idx1-ubyte"), {n}, lab, false);
  }
  const std::string json = dir.file("run.json");
  const RunResult r = run_program(MF_TRAIN_MNIST_BIN,
                                  "--device cpu --quiet --epochs 2 --validation-split 0.1 --data " + dir.file("") +
                                      " --metrics-json " + json + " --save " + dir.file("run.ckpt"),
                                  dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(" conv2d (Conv2D)                 (None, 26, 26, 32)       896\n"), std::string::npos)
      << r.out;  // 3*3*3*32 + 32
  EXPECT_NE(r.out.find("Total params: 122,506"), std::string::npos) << r.out;    // MNIST's 121,930 + 2*288
  // Seen: 100 % after the first epoch; chance is a third, and a model blind to the
  // channels (their sum or mean is the same for every label) stays near it.
  EXPECT_GT(json_number(io::read_file_bytes(json), "test_accuracy"), 0.9) << r.out;
#ifdef MF_PREDICT_BIN
  // predict classifies MNIST's one-channel digits, and says so for this checkpoint.
  const RunResult p = run_program(MF_PREDICT_BIN, "--model " + dir.file("run.ckpt") + " x.png", dir);
  EXPECT_EQ(p.status, kError);
  EXPECT_EQ(count_lines(p.err), 1) << p.err;
  EXPECT_NE(p.err.find("saved for a model of (28, 28, 3) images (rows, cols, channels); this one takes (28, 28, 1)"),
            std::string::npos)
      << p.err;
#endif
  // Resumed on one-channel digits, the run is refused in the same words.
  TempDir gray("_gray");
  write_tiny_mnist(gray);
  const RunResult resumed = run_program(
      MF_TRAIN_MNIST_BIN, "--device cpu --epochs 3 --data " + gray.file("") + " --resume " + dir.file("run.ckpt"), dir);
  EXPECT_EQ(resumed.status, kError);
  EXPECT_EQ(count_lines(resumed.err), 1) << resumed.err;
  EXPECT_NE(resumed.err.find(": the checkpoint comes from other data"), std::string::npos) << resumed.err;
#if MF_WITH_STB && defined(MF_PREDICT_BIN)
  // A one-channel model's grid of misclassified digits from three-channel test images.
  ASSERT_EQ(run_program(MF_TRAIN_MNIST_BIN, "--device cpu --epochs 1 --quiet --data " + gray.file("") + " --save " +
                                                gray.file("gray.ckpt"),
                        dir)
                .status,
            0);
  const RunResult grid = run_program(MF_PREDICT_BIN,
                                     "--model " + gray.file("gray.ckpt") + " --data " + dir.file("") + " --grid " +
                                         dir.file("grid.png"),
                                     dir);
  EXPECT_EQ(grid.status, kError);
  EXPECT_EQ(count_lines(grid.err), 1) << grid.err;
  EXPECT_NE(grid.err.find(" are (28, 28, 3) (rows, cols, channels); the model takes (28, 28, 1)"), std::string::npos)
      << grid.err;
  EXPECT_FALSE(fs::exists(dir.file("grid.png")));
#endif

  TempDir wide("_wide");
  const std::vector<std::uint8_t> pixels(2 * 28 * 28 * 65, 0), two(2, 1);
  for (const char* set : {"train", "t10k"}) {
    data::write_idx(wide.file(std::string(set) + "-images-idx4-ubyte"), {2, 28, 28, 65}, pixels, false);
    data::write_idx(wide.file(std::string(set) + "-labels-idx1-ubyte"), {2}, two, false);
  }
  expect_one_line_error("--device cpu --validation-split 0 --data " + wide.file(""),
                        "the images have 65 channels; this model takes at most 64 (MNIST's have one)", kError);
}

TEST(TrainMnistCli, MissingGpuGivesOneLine) {
  if (gpu_available()) GTEST_SKIP() << "this machine has a GPU";
  expect_one_line_error("--device gpu", "--device gpu", kError);
}

TEST(TrainMnistCli, AutoDevicePicksTheGpuOrSaysWhyNot) {
  const std::string data = mnist_dir();
  if (!fs::exists(data)) GTEST_SKIP() << "no MNIST at " << data;
  TempDir dir;
  const RunResult r = run_program(MF_TRAIN_MNIST_BIN, "--data " + sh_quote(data) + " --quiet --limit-train 256 --epochs 1", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string why = "(--device auto chose the CPU: " + gpu_status().reason + ")";
  if (gpu_available()) {
    EXPECT_NE(r.out.find("Training on gpu"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("--device auto chose the CPU"), std::string::npos) << r.out;
  } else {
    EXPECT_NE(r.out.find("Training on cpu"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(why), std::string::npos) << r.out;
  }
}

TEST(TrainMnistCli, OneThreadIsCountedInTheSingular) {
  const std::string data = mnist_dir();
  if (!fs::exists(data)) GTEST_SKIP() << "no MNIST at " << data;
  TempDir dir;
  const RunResult r = run_program(MF_TRAIN_MNIST_BIN,
                                  "--device cpu --threads 1 --verbose --data " + sh_quote(data) +
                                      " --quiet --limit-train 256 --epochs 1 --metrics-json " + sh_quote(dir.file("m.json")),
                                  dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(", 1 thread)"), std::string::npos) << r.out;       // the Training line
  EXPECT_NE(r.out.find("CPU layers (1 thread):"), std::string::npos) << r.out;  // --verbose
  EXPECT_EQ(r.out.find("1 threads"), std::string::npos) << r.out;
  EXPECT_NE(io::read_file_bytes(dir.file("m.json")).find(", 1 thread\""), std::string::npos);
}

// --kernels picks the rung of the kernel ladder: the run says which ran, on its Training line
// and in the metrics; --help lists the rungs; a rung the device lacks, or no rung at all,
// is one line.
TEST(TrainMnistCli, KernelsFlagPicksTheRung) {
  TempDir dir;
  write_tiny_mnist(dir);
  for (const char* rung : {"naive", "library", "tuned"}) {
    SCOPED_TRACE(rung);
    const std::string json = dir.file(std::string(rung) + ".json");
    const RunResult r = run_program(MF_TRAIN_MNIST_BIN,
                                    "--device cpu --quiet --epochs 1 --kernels " + std::string(rung) + " --data " +
                                        sh_quote(dir.file("")) + " --metrics-json " + sh_quote(json),
                                    dir);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find(std::string("fp32, ") + rung + " kernels, batch 64"), std::string::npos) << r.out;
    EXPECT_NE(read_whole_file(json).find(std::string("\"kernels\": \"") + rung + "\""), std::string::npos);
  }
  const RunResult plain = run_program(MF_TRAIN_MNIST_BIN, "--device cpu --quiet --epochs 1 --data " + sh_quote(dir.file("")), dir);
  EXPECT_NE(plain.out.find("fp32, tuned kernels"), std::string::npos) << plain.out;  // the CPU's default
  const RunResult help = run_program(MF_TRAIN_MNIST_BIN, "--help", dir);
  EXPECT_NE(help.out.find("--kernels"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("(default|naive|library|tuned|fused)"), std::string::npos) << help.out;
  expect_one_line_error("--device cpu --kernels fused", "--kernels fused: the rung 'fused' is the GPU's", kError);
  expect_one_line_error("--kernels fast", "--kernels must be one of default, naive, library, tuned, fused", kBadFlag);
}

TEST(TrainMnistCli, BadOutputAndCheckpointPathsGiveOneLine) {
  expect_one_line_error("--save /nonexistent/dir/run.ckpt", "--save /nonexistent/dir/run.ckpt: folder", kError);
  expect_one_line_error("--plot /nonexistent/dir/p.png", "--plot /nonexistent/dir/p.png: folder", kError);
  expect_one_line_error("--resume /nonexistent/run.ckpt", "/nonexistent/run.ckpt: cannot open", kError);
  TempDir dir;
  std::FILE* f = std::fopen(dir.file("junk.ckpt").c_str(), "wb");
  std::fputs("junk", f);
  std::fclose(f);
  expect_one_line_error("--resume " + dir.file("junk.ckpt"), "not a microflow checkpoint", kError);
}

// An output path that names a folder fails before any training (here: before the data are
// even read, so the error is about the path, not the missing data).
TEST(TrainMnistCli, OutputPathThatIsAFolderIsRefusedBeforeTraining) {
  TempDir dir;
  const std::string folder = dir.path().string();
  for (const char* flag : {"save", "metrics-json", "plot"}) {
    SCOPED_TRACE(flag);
    const std::string f = std::string("--") + flag + " ";
    expect_one_line_error("--data /nonexistent/mnist " + f + folder, f + folder + ": is a folder, not a file",
                          kError);
    expect_one_line_error("--data /nonexistent/mnist " + f + folder + "/", f + folder + "/: is a folder, not a file",
                          kError);
    // Not there yet, but the trailing '/' says folder all the same.
    expect_one_line_error("--data /nonexistent/mnist " + f + folder + "/new/",
                          f + folder + "/new/: ends in '/': names a folder, not a file", kError);
  }
  // The check does not refuse a plain new file in an existing folder.
  expect_one_line_error("--data /nonexistent/mnist --save " + dir.file("run.ckpt"), "/nonexistent/mnist", kError);
  // A "folder" that is a file (access() alone lets it through).
  std::ofstream(dir.file("notes.txt")) << "a file";
  expect_one_line_error("--data /nonexistent/mnist --metrics-json " + dir.file("notes.txt") + "/m.json",
                        "--metrics-json " + dir.file("notes.txt") + "/m.json: " + dir.file("notes.txt") +
                            " is a file, not a folder",
                        kError);
}

// --plot or --metrics-json on the checkpoint would overwrite it with a PNG or JSON at the end
// of the run; two outputs on one file keep only the last. Refused before anything is read,
// whatever the spelling (relative, through a symlink). --save may be --resume's file.
TEST(TrainMnistCli, OutputsNamingTheSameFileAreRefused) {
  TempDir dir;
  const std::string ckpt = dir.file("keep.ckpt");
  std::ofstream(ckpt) << "the checkpoint";
  fs::create_symlink(ckpt, dir.file("link.ckpt"));
  const std::string rel = "./" + fs::path(dir.file("new.json")).lexically_relative(fs::current_path()).string();
  struct Case {
    std::string args, first, second;
  };
  for (const Case& c : std::vector<Case>{
           {"--resume " + ckpt + " --metrics-json " + ckpt, "--resume " + ckpt, "--metrics-json " + ckpt},
           {"--save " + ckpt + " --plot " + ckpt, "--save " + ckpt, "--plot " + ckpt},
           {"--resume " + dir.file("link.ckpt") + " --plot " + ckpt, "--resume " + dir.file("link.ckpt"),
            "--plot " + ckpt},
           {"--plot " + dir.file("new.json") + " --metrics-json " + rel, "--plot " + dir.file("new.json"),
            "--metrics-json " + rel}}) {
    expect_one_line_error("--data /nonexistent/mnist " + c.args,
                          c.first + " and " + c.second + " name the same file: one would overwrite the other", kError);
    EXPECT_EQ(io::read_file_bytes(ckpt), "the checkpoint");
  }
  // --save on --resume's file is how a run goes on: refused here only for the bad checkpoint.
  expect_one_line_error("--data /nonexistent/mnist --resume " + ckpt + " --save " + ckpt,
                        "not a microflow checkpoint", kError);
}

// --plot and --metrics-json replace their file every epoch: one that names a checkpoint (any
// checkpoint, not only this run's --save or --resume) is refused before anything is read, and
// the checkpoint is left whole; a file that is not a checkpoint (last run's plot) is replaced
// as before. predict --grid is held to the same.
TEST(TrainMnistCli, PlotOrMetricsOverACheckpointIsRefused) {
  TempDir dir;
  const std::string ckpt = dir.file("run.ckpt"), old_plot = dir.file("old.png");
  SavedRun run = saved_after_one_epoch();
  io::save_checkpoint(ckpt, run.model, run.model.optimizer(), run.meta);
  const std::string before = io::read_file_bytes(ckpt);
  fs::create_symlink(ckpt, dir.file("link.ckpt"));
  for (const char* flag : {"plot", "metrics-json"})
    for (const std::string& path : {ckpt, dir.file("link.ckpt")}) {
      SCOPED_TRACE(std::string(flag) + " " + path);
      const std::string f = std::string("--") + flag + " " + path;
      expect_one_line_error("--data /nonexistent/mnist " + f,
                            f + " is a microflow checkpoint: writing there would destroy it", kError);
    }
  EXPECT_TRUE(io::read_file_bytes(ckpt) == before) << "the checkpoint was changed";
  // Not a checkpoint: the check lets it through (the run stops at the missing data).
  std::ofstream(old_plot) << "MFCKP, almost";
  expect_one_line_error("--data /nonexistent/mnist --plot " + old_plot, "/nonexistent/mnist", kError);
#if MF_WITH_STB && defined(MF_PREDICT_BIN)
  const RunResult r = run_program(MF_PREDICT_BIN, "--model " + old_plot + " --grid " + ckpt, dir);
  EXPECT_EQ(r.status, kBadFlag);
  EXPECT_EQ(r.err, "predict: error: --grid " + ckpt + " is a microflow checkpoint: writing there would destroy it "
                   "(remove it first if that is meant)\n");
  EXPECT_TRUE(io::read_file_bytes(ckpt) == before) << "the checkpoint was changed";
#endif
}

// --save on an existing file that the run does not resume would replace a trained model
// with a new run's first epoch (or less, on Ctrl-C): refused before the data are read,
// unless --overwrite says so. Resuming that file is how a run goes on, and is let through.
TEST(TrainMnistCli, SaveOverAnExistingFileNeedsResumeOrOverwrite) {
  TempDir dir;
  const std::string ckpt = dir.file("good.ckpt");
  std::ofstream(ckpt) << "the checkpoint";
  fs::create_symlink(ckpt, dir.file("link.ckpt"));
  const std::string refused = " already exists: pass --resume ";
  expect_one_line_error("--data /nonexistent/mnist --save " + ckpt,
                        "--save " + ckpt + refused + ckpt + " to continue that run, or --overwrite to replace it",
                        kError);
  // Through a symlink, and while resuming another file (refused before that file is read).
  expect_one_line_error("--data /nonexistent/mnist --save " + dir.file("link.ckpt"), refused, kError);
  expect_one_line_error("--data /nonexistent/mnist --resume " + dir.file("other.ckpt") + " --save " + ckpt, refused,
                        kError);
  EXPECT_EQ(io::read_file_bytes(ckpt), "the checkpoint");
  // A device or an empty file holds nothing to lose: no --overwrite needed (the run stops at
  // the missing data).
  expect_one_line_error("--data /nonexistent/mnist --save /dev/null", "/nonexistent/mnist", kError);
  std::ofstream(dir.file("empty.ckpt")).flush();
  expect_one_line_error("--data /nonexistent/mnist --save " + dir.file("empty.ckpt"), "/nonexistent/mnist", kError);
  // --overwrite, or --resume of that very file, passes this check (and stops at what follows).
  expect_one_line_error("--data /nonexistent/mnist --save " + ckpt + " --overwrite", "/nonexistent/mnist", kError);
  expect_one_line_error("--data /nonexistent/mnist --resume " + dir.file("link.ckpt") + " --save " + ckpt,
                        "not a microflow checkpoint", kError);

  // A real run: --overwrite replaces the checkpoint with the new run's.
  const std::string data = mnist_dir();
  if (!fs::exists(data)) GTEST_SKIP() << "no MNIST at " << data;
  const std::string common = "--device cpu --data " + sh_quote(data) + " --quiet --limit-train 64 --epochs 1 "
                             "--validation-split 0.02 --save " + ckpt + " --overwrite";
  const RunResult r = run_program(MF_TRAIN_MNIST_BIN, common, dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(io::read_checkpoint(ckpt).contents.meta.epoch, 1);
}

// An output on one of the data files would replace it: refused before any training, whatever
// the path's spelling, and the file is left as it was.
TEST(TrainMnistCli, OutputsOnTheDataFilesAreRefused) {
  TempDir data, other;
  write_tiny_mnist(data);
  const std::string labels = data.file("t10k-labels-idx1-ubyte"), images = data.file("train-images-idx3-ubyte");
  const std::string labels_before = io::read_file_bytes(labels), images_before = io::read_file_bytes(images);
  fs::create_symlink(images, other.file("images-link"));
  for (const char* flag : {"save", "plot", "metrics-json"}) {
    SCOPED_TRACE(flag);
    const std::string f = std::string("--") + flag + " ";
    expect_one_line_error("--device cpu --data " + data.file("") + " " + f + labels,
                          f + labels + " is the data file " + labels + ": writing there would destroy the data",
                          kError);
    expect_one_line_error("--device cpu --data " + data.file("") + " " + f + other.file("images-link"),
                          f + other.file("images-link") + " is the data file " + images, kError);
  }
  // --overwrite lets --save replace a checkpoint, never the data.
  expect_one_line_error("--device cpu --data " + data.file("") + " --overwrite --save " + labels,
                        "--save " + labels + " is the data file " + labels, kError);
  EXPECT_TRUE(io::read_file_bytes(labels) == labels_before) << "the labels were overwritten";
  EXPECT_TRUE(io::read_file_bytes(images) == images_before) << "the images were overwritten";
}

// The flags --help marks "GPU:" do nothing on the CPU: a run there names the ones it was
// given in one note (it named --pipeline and --no-graph only, and ignored --gpu,
// --gpu-memory-limit, --conv-algo and --workspace-mb without a word), and trains all the same.
TEST(TrainMnistCli, GpuOnlyFlagsOnTheCpuAreNamed) {
  TempDir data("_data");
  write_tiny_mnist(data);
  const std::string run = "--device cpu --data " + sh_quote(data.file("")) + " --epochs 1 --quiet --validation-split 0 ";
  const std::pair<const char*, const char*> cases[] = {
      {"--conv-algo heuristic", "--conv-algo applies"},
      {"--gpu 1 --workspace-mb 8 --conv-algo find", "--gpu, --conv-algo and --workspace-mb apply"},
      {"--no-graph --gpu-memory-limit 100 --pipeline naive", "--gpu-memory-limit, --pipeline and --no-graph apply"},
      {"--no-tf32", "--no-tf32 applies"},
      {"--pipeline auto", nullptr}};  // what the CPU does anyway
  for (const auto& [flags, note] : cases) {
    SCOPED_TRACE(flags);
    TempDir dir;
    const RunResult r = run_program(MF_TRAIN_MNIST_BIN, run + flags, dir);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err, note ? std::string("train_mnist: note: ") + note + " to the GPU only\n" : "");
    EXPECT_NE(r.out.find("Test accuracy"), std::string::npos) << r.out;
  }
}

// A model whose outputs overflow on held-out images (here: the last layer's weights of a
// saved run scaled by 1e37; the training loss stays finite, if huge) is an error like a NaN
// training loss: the epoch is not saved over the checkpoint, and a non-finite test loss is
// not reported as a result.
TEST(TrainMnistCli, NonFiniteValidationOrTestLossFailsWithoutSaving) {
  const std::string data = mnist_dir();
  if (!fs::exists(data)) GTEST_SKIP() << "no MNIST at " << data;
  TempDir dir;
  const std::string ckpt = dir.file("run.ckpt");
  RunResult r = run_program(MF_TRAIN_MNIST_BIN,
                    "--device cpu --data " + sh_quote(data) + " --quiet --limit-train 64 --epochs 1 --validation-split 0.02 "
                    "--save " + ckpt,
                    dir);
  ASSERT_EQ(r.status, 0) << r.err;
  {
    Rng rng(0);
    Sequential model = Sequential::mnist_cnn(rng);
    model.compile(std::make_unique<Adam>());
    const io::CheckpointMeta meta = io::load_checkpoint(ckpt, model, *model.optimizer());
    Parameter* kernel = model.parameters()[model.parameters().size() - 2];  // dense_1: kernel, then bias
    ASSERT_EQ(kernel->name, "kernel");
    float* w = kernel->value.data<float>();
    for (std::int64_t i = 0; i < kernel->value.numel(); ++i) w[i] *= 1e37f;
    io::save_checkpoint(ckpt, model, *model.optimizer(), meta);
  }
  const std::string saved = io::read_file_bytes(ckpt);

  // Epoch 2 trains, then its validation loss overflows: an error, and the checkpoint unchanged.
  r = run_program(MF_TRAIN_MNIST_BIN,
          "--device cpu --data " + sh_quote(data) + " --quiet --resume " + ckpt + " --save " + ckpt + " --epochs 2", dir);
  EXPECT_EQ(r.status, kError);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("train_mnist: error: the validation loss became "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("at epoch 2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("epoch 2 was not saved to " + ckpt), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("Test loss"), std::string::npos) << r.out;
  EXPECT_TRUE(io::read_file_bytes(ckpt) == saved) << "the checkpoint was rewritten";

  // Nothing left to train: the test loss overflows; an error, and no metrics written.
  const std::string json = dir.file("m.json");
  r = run_program(MF_TRAIN_MNIST_BIN,
          "--device cpu --data " + sh_quote(data) + " --quiet --resume " + ckpt + " --epochs 1 --metrics-json " + json, dir);
  EXPECT_EQ(r.status, kError);
  EXPECT_NE(r.err.find("train_mnist: error: the test loss is "), std::string::npos) << r.err;
  EXPECT_EQ(count_lines(r.err), 2) << "the note that nothing is to train, then the error: " << r.err;
  EXPECT_FALSE(fs::exists(json));
  EXPECT_TRUE(io::read_file_bytes(ckpt) == saved);
}

// --resume alone trains on and keeps nothing: it says so. With --save of the checkpoint the
// run goes on in it, without a note.
TEST(TrainMnistCli, ResumeWithoutSaveSaysTheNewEpochsAreSavedNowhere) {
  TempDir dir;
  write_tiny_mnist(dir);
  auto [model, m] = saved_after_one_epoch();
  const std::string path = dir.file("run.ckpt");
  io::save_checkpoint(path, model, *model.optimizer(), m);
  const std::string args = "--device cpu --quiet --epochs 2 --data " + dir.file("") + " --resume " + path;
  RunResult r = run_program(MF_TRAIN_MNIST_BIN, args, dir);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "train_mnist: note: --resume without --save: the epochs trained now are saved nowhere (--save " +
                       path + " goes on in the checkpoint)\n");
  EXPECT_EQ(io::read_checkpoint(path).contents.meta.epoch, 1);
  r = run_program(MF_TRAIN_MNIST_BIN, args + " --save " + path, dir);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(io::read_checkpoint(path).contents.meta.epoch, 2);
}

// Two numbers that differ must not print alike: %g's six digits showed 0.2000001 as 0.2.
TEST(TrainMnistCli, ResumeMessagesShowNumbersInFull) {
  TempDir dir;
  auto [model, m] = saved_after_one_epoch();
  const std::string path = dir.file("run.ckpt");
  io::save_checkpoint(path, model, *model.optimizer(), m);
  const std::string args = "--device cpu --quiet --epochs 2 --data /nonexistent/mnist --resume " + path;
  expect_one_line_error(args + " --validation-split 0.2000001",
                        "--validation-split 0.2000001 differs from the split 0.2 the run was saved with", kError);
  // The same split in another spelling is the same number: accepted.
  expect_one_line_error(args + " --validation-split 2e-1", "/nonexistent/mnist", kError);
  m.validation_split = 1.0000001;
  io::save_checkpoint(path, model, *model.optimizer(), m);
  expect_one_line_error(args, "saved validation_split=1.0000001 is out of range", kError);
  m.validation_split = 0.2;
  m.lr = 10.000001;
  io::save_checkpoint(path, model, *model.optimizer(), m);
  expect_one_line_error(args, "saved lr=10.000001 is out of range", kError);
}

// What a resumed run takes from its checkpoint cannot be changed by a flag, and a checkpoint
// that cannot continue a run is refused, each in one line, before the data is read.
TEST(TrainMnistCli, ResumeRefusesFlagsAndCheckpointsItCannotContinueWith) {
  TempDir dir;
  auto [model, m] = saved_after_one_epoch();
  const std::string path = dir.file("run.ckpt");
  io::save_checkpoint(path, model, *model.optimizer(), m);
  const std::string args = "--device cpu --quiet --epochs 2 --data /nonexistent/mnist --resume " + path;
  expect_one_line_error(args + " --seed 7", "--seed 7 differs from the 0 the run was saved with", kError);
  expect_one_line_error(args + " --optimizer sgd", "--optimizer sgd differs from the optimizer Adam the run was saved with",
                        kError);
  expect_one_line_error(args + " --limit-train 100", "--limit-train 100 differs from the limit 0 the run was saved with",
                        kError);
  expect_one_line_error(args + " --fp16",
                        "the run was saved in fp32; --fp16 cannot be switched on when resuming it", kError);
  // The same values spelled out are no contradiction: the run gets as far as the data.
  expect_one_line_error(args + " --seed 0 --optimizer adam --limit-train 0", "/nonexistent/mnist", kError);

  io::save_checkpoint(path, model, nullptr, m);  // a model to predict with, not a run
  expect_one_line_error(args, "--resume " + path + ": holds weights only (no optimizer state)", kError);
  m.fp16 = true;
  io::save_checkpoint(path, model, *model.optimizer(), m);
  expect_one_line_error(args, "the run was saved in mixed precision (fp16), which needs the GPU (--device gpu)", kError);
}

// --optimizer sgd trains with SGD and momentum, saves it, and resumes it; --min-accuracy
// makes a run whose test accuracy falls short exit with 3 (after printing and saving it).
// All images are alike, so every test image gets the same class, and half of the test labels
// are another class: the accuracy is at most 0.5.
TEST(TrainMnistCli, SgdRunsResumeAndMissingMinAccuracyExitsWith3) {
  TempDir dir;
  write_tiny_mnist_half_threes(dir);
  const std::string ckpt = dir.file("sgd.ckpt"), json = dir.file("sgd.json");
  const std::string args = "--device cpu --quiet --epochs 1 --data " + dir.file("") + " --save " + ckpt;
  RunResult r = run_program(MF_TRAIN_MNIST_BIN,
                            args + " --optimizer sgd --lr 0.01 --momentum 0.9 --min-accuracy 0.9 --metrics-json " + json, dir);
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_EQ(r.err.rfind("train_mnist: error: test accuracy ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(" is below --min-accuracy 0.9000"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("SGD(lr=0.01, momentum=0.9)"), std::string::npos) << r.out;
  EXPECT_LE(json_number(read_whole_file(json), "test_accuracy"), 0.5);
  io::CheckpointFile f = io::read_checkpoint(ckpt);
  EXPECT_EQ(f.contents.meta.optimizer, "SGD");
  EXPECT_EQ(f.contents.meta.momentum, 0.9);
  EXPECT_EQ(f.contents.meta.epoch, 1);

  expect_one_line_error(args + " --epochs 2 --resume " + ckpt + " --optimizer adam",
                        "--optimizer adam differs from the optimizer SGD the run was saved with", kError);
  // Adam has no momentum: --momentum with it would be ignored, and is refused, fresh or resumed.
  expect_one_line_error("--data " + dir.file("") + " --momentum 0.9",
                        "--momentum applies to --optimizer sgd only; this run uses adam", kError);
  r = run_program(MF_TRAIN_MNIST_BIN, "--device cpu --quiet --epochs 2 --data " + dir.file("") + " --resume " + ckpt +
                                          " --save " + ckpt,
                  dir);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("SGD(lr=0.01, momentum=0.9)"), std::string::npos) << "the saved settings: " << r.out;
  EXPECT_EQ(io::read_checkpoint(ckpt).contents.meta.epoch, 2);
}

// A test accuracy just under --min-accuracy is printed with the digits that show it is under
// ("0.5000 is below 0.5000" said nothing). The model answers 3 for every image (its last
// bias for 3 is 1000) and half the test labels are 3: the accuracy is 0.5 exactly.
TEST(TrainMnistCli, MinAccuracyErrorShowsTheDigitsThatDiffer) {
  TempDir dir;
  write_tiny_mnist_half_threes(dir);
  const std::string ckpt = dir.file("threes.ckpt");
  SavedRun run = saved_after_one_epoch();
  Parameter* bias = run.model.parameters().back();  // dense_1: kernel, then bias
  ASSERT_EQ(bias->name, "bias");
  bias->value.data<float>()[3] = 1000.0f;
  io::save_checkpoint(ckpt, run.model, run.model.optimizer(), run.meta);
  // Each run goes on from epoch 1 in a copy of its own (the run saves epoch 2 into it).
  auto run_with_bar = [&](const std::string& bar) {
    const std::string copy = dir.file("run-" + bar + ".ckpt");
    fs::copy_file(ckpt, copy);
    return run_program(MF_TRAIN_MNIST_BIN, "--device cpu --quiet --data " + dir.file("") + " --resume " + copy +
                                               " --save " + copy + " --epochs 2 --min-accuracy " + bar,
                       dir);
  };
  RunResult r = run_with_bar("0.50001");
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_EQ(r.err, "train_mnist: error: test accuracy 0.50000 is below --min-accuracy 0.50001\n");
  r = run_with_bar("0.75");  // four decimals when they differ there
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_EQ(r.err, "train_mnist: error: test accuracy 0.5000 is below --min-accuracy 0.7500\n");
  r = run_with_bar("0.5");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
}

// Running out of host memory names what was being done and what to try, in one line, instead
// of the C++ library's bare "std::bad_alloc". Here the training images need 1.5 GB of a 1 GB
// address space.
TEST(TrainMnistCli, OutOfHostMemoryIsOneLineSayingWhatToTry) {
  if (!kCanLimitAddressSpace) GTEST_SKIP() << "a sanitized build (AddressSanitizer, ThreadSanitizer) cannot run under a 1 GB address-space limit";
  TempDir data, dir;
  write_blank_mnist(data, 2000000);
  const RunResult r = run_program(MF_TRAIN_MNIST_BIN, "--device cpu --threads 1 --data " + data.file(""), dir, kUlimit1Gb);
  EXPECT_EQ(r.status, kError);
  EXPECT_EQ(r.err, "train_mnist: error: out of host memory while loading the data from " + data.file("") +
                       "; free some memory, or use a machine with more\n");
  {
    // Data that fits, a batch whose activations do not: the tensor names itself, and the
    // hint is the batch size.
    TempDir small("_small");
    write_blank_mnist(small, 20000);
    const RunResult b = run_program(
        MF_TRAIN_MNIST_BIN, "--device cpu --threads 1 --quiet --batch-size 20000 --data " + small.file(""), dir, kUlimit1Gb);
    EXPECT_EQ(b.status, kError);
    EXPECT_EQ(b.err, "train_mnist: error: out of host memory allocating f32 (16000, 26, 26, 32) on cpu (1.29 GiB) "
                     "while training; try a smaller --batch-size\n");
  }
#if MF_WITH_STB && defined(MF_PREDICT_BIN)
  // predict --grid reads the same data.
  Rng rng(1);
  Sequential model = Sequential::mnist_cnn(rng);
  io::save_checkpoint(dir.file("m.ckpt"), model, nullptr, {});
  const RunResult p = run_program(MF_PREDICT_BIN,
                          "--model " + dir.file("m.ckpt") + " --data " + data.file("") + " --grid " +
                              dir.file("grid.png"),
                          dir, kUlimit1Gb);
  EXPECT_EQ(p.status, kError);
  EXPECT_EQ(p.err, "predict: error: out of host memory while loading the data for --grid and drawing the "
                   "misclassified digits; free some memory, or use a machine with more\n");
  EXPECT_FALSE(fs::exists(dir.file("grid.png")));
  // An image whose pixels do not fit in memory is named as that, not as a bad file (it read
  // "corrupt or unsupported PNG (stb_image: outofmem)").
  write_blank_rgba16_png(dir.file("big.png"), 8192);
  const RunResult q = run_program(MF_PREDICT_BIN, "--model " + dir.file("m.ckpt") + " " + dir.file("big.png"), dir, kUlimit1Gb);
  EXPECT_EQ(q.status, kError);
  EXPECT_EQ(q.err, "predict: error: " + dir.file("big.png") +
                       ": out of host memory decoding this 8192x8192 PNG; free some memory, or give a smaller image\n");
#endif
}

// Results printed to a full disk or a closed pipe are lost: that is an error, not exit 0.
TEST(TrainMnistCli, FailingToWriteStandardOutputIsAnError) {
  TempDir dir;
  std::vector<const char*> programs{MF_TRAIN_MNIST_BIN};
#if defined(MF_PREDICT_BIN)
  programs.push_back(MF_PREDICT_BIN);
#endif
  for (const char* bin : programs) {
    SCOPED_TRACE(bin);
    const std::string err = dir.file("err.txt");
    const int st = std::system((sh_quote(mf::testing::program_path(bin)) + " --help > /dev/full 2> " + err).c_str());
    EXPECT_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, kError);
    const std::string e = io::read_file_bytes(err);
    EXPECT_EQ(count_lines(e), 1) << e;
    EXPECT_NE(e.find("error: could not write the output (standard output): No space left on device"),
              std::string::npos)
        << e;
  }
}

// SIGTERM (kill, a batch scheduler, `timeout`) and SIGHUP (the terminal closed) stop a run
// as Ctrl-C does: the step finishes, the checkpoint is saved whole, the exit status is the
// shell's for that signal, and no temporary file is left. They used to kill it at once,
// losing the epoch in progress without a word.
TEST(TrainMnistCli, SigtermAndSighupStopAfterSavingAsCtrlCDoes) {
  for (const int sig : {SIGTERM, SIGHUP}) {
    SCOPED_TRACE(sig == SIGTERM ? "SIGTERM" : "SIGHUP");
    TempDir dir;
    write_tiny_mnist(dir);
    const std::string out = dir.file("out.txt"), err = dir.file("err.txt");
    const pid_t pid = start_train_mnist(long_tiny_run(dir), out, err);
    ASSERT_GT(pid, 0);
    wait_for_text(out, "Epoch 2/");  // printed once epoch 1 has been saved
    ::kill(pid, sig);
    EXPECT_EQ(wait_exit_status(pid), 128 + sig);
    const std::string e = io::read_file_bytes(err);
    EXPECT_EQ(count_lines(e), 2) << e;  // the blank line that ends the progress line, then the note
    EXPECT_NE(e.find("stopping after this step"), std::string::npos) << e;
    EXPECT_NE(read_whole_file(out).find("Saved " + dir.file("run.ckpt")), std::string::npos);
    const io::CheckpointFile saved = io::read_checkpoint(dir.file("run.ckpt"));
    EXPECT_GE(saved.contents.meta.epoch, 1);
    EXPECT_TRUE(temp_files_in(dir).empty()) << temp_files_in(dir)[0];
  }
}

// Ctrl-C with --metrics-json: each epoch is listed once, and an epoch the stop cut short
// last, marked partial. A stop at an epoch's last step listed that epoch twice. With one
// step per epoch (batch 20 of the 20 images) every stop is at an epoch's end; with 20 steps
// (batch 1) most stops are inside one.
TEST(TrainMnistCli, StoppedRunsMetricsListEachEpochOnce) {
  for (const char* batch : {"20", "1"}) {
    SCOPED_TRACE(std::string("--batch-size ") + batch);
    TempDir dir;
    write_tiny_mnist(dir);
    std::vector<std::string> args = long_tiny_run(dir);
    for (std::size_t i = 0; i + 1 < args.size(); ++i)
      if (args[i] == "--batch-size") args[i + 1] = batch;
    const std::string json = dir.file("m.json"), out = dir.file("out.txt");
    args.insert(args.end(), {"--metrics-json", json});
    const pid_t pid = start_train_mnist(args, out, dir.file("err.txt"));
    ASSERT_GT(pid, 0);
    wait_for_text(out, "Epoch 3/");
    ::kill(pid, SIGINT);
    EXPECT_EQ(wait_exit_status(pid), 130);
    const std::string m = io::read_file_bytes(json);
    // Each epoch's entry: its number, steps, and whether it is marked partial.
    std::vector<int> numbers;
    std::vector<bool> partial;
    std::vector<long> steps;
    for (std::size_t at = m.find("{\"epoch\": "); at != std::string::npos; at = m.find("{\"epoch\": ", at + 1)) {
      const std::string entry = m.substr(at, m.find('}', at) - at);
      numbers.push_back(std::atoi(entry.c_str() + 10));
      steps.push_back(static_cast<long>(json_number(entry, "steps")));
      partial.push_back(entry.find("\"partial\": true") != std::string::npos);
    }
    ASSERT_GE(numbers.size(), 2u) << m;
    const long full = batch[0] == '2' ? 1 : 20;
    for (std::size_t i = 0; i < numbers.size(); ++i) {
      EXPECT_EQ(numbers[i], static_cast<int>(i) + 1) << m;
      const bool last = i + 1 == numbers.size();
      EXPECT_EQ(partial[i], last && steps[i] < full) << "epoch " << numbers[i] << " of\n" << m;
      if (!last) {
        EXPECT_EQ(steps[i], full) << m;
      }
    }
    EXPECT_NE(m.find("\"interrupted\": true"), std::string::npos) << m;
  }
}

// `train_mnist | head`: when standard output can no longer be written the run stops as it
// would on Ctrl-C, saved, and says why in one line with status 1. SIGPIPE used to end it
// without a word at its next line of output, before that epoch was saved.
TEST(TrainMnistCli, ClosedStandardOutputStopsTheRunSavedWithAnError) {
  TempDir dir;
  write_tiny_mnist(dir);
  const std::string err = dir.file("err.txt");
  int read_end = -1;
  const pid_t pid = start_train_mnist(long_tiny_run(dir), "", err, &read_end);
  ASSERT_GT(pid, 0);
  std::string seen;
  char buf[4096];
  for (ssize_t n; seen.find("Epoch 2/") == std::string::npos && (n = ::read(read_end, buf, sizeof buf)) > 0;)
    seen.append(buf, static_cast<std::size_t>(n));
  ::close(read_end);  // as `head` does once it has its lines
  EXPECT_NE(seen.find("Epoch 2/"), std::string::npos) << seen;
  EXPECT_EQ(wait_exit_status(pid), kError);
  const std::string e = io::read_file_bytes(err);
  EXPECT_EQ(count_lines(e), 1) << e;
  EXPECT_NE(e.find("train_mnist: error: could not write the output (standard output): Broken pipe"),
            std::string::npos)
      << e;
  const io::CheckpointFile saved = io::read_checkpoint(dir.file("run.ckpt"));
  EXPECT_GE(saved.contents.meta.epoch, 1);
  EXPECT_TRUE(temp_files_in(dir).empty()) << temp_files_in(dir)[0];

  // The checkpoint itself into that pipe (--save /dev/stdout): the failed save is the one
  // error line; the standard output failing with it is not a second (it was).
  std::vector<std::string> args = long_tiny_run(dir);
  args.back() = "/dev/stdout";
  const pid_t pid2 = start_train_mnist(args, "", err, &read_end);
  ASSERT_GT(pid2, 0);
  EXPECT_GT(::read(read_end, buf, sizeof buf), 0);
  ::close(read_end);
  EXPECT_EQ(wait_exit_status(pid2), kError);
  EXPECT_EQ(io::read_file_bytes(err),
            "train_mnist: error: /dev/stdout: cannot save checkpoint: write failed: Broken pipe\n");
}

// Started with stderr closed (`2>&-`), train_mnist must not let a file it opens take
// descriptor 2: the note a signal prints went into the checkpoint being saved there. A FIFO
// as --save holds the save open (the test reads 64 KiB, then stops reading) while SIGTERM
// comes, so the stream the test reads is the checkpoint exactly as it was written.
TEST(TrainMnistCli, WithStderrClosedASignalsNoteStaysOutOfTheCheckpoint) {
  TempDir dir;
  write_tiny_mnist(dir);
  const std::string fifo = dir.file("run.ckpt");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int r = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // the writer's open need not wait
  ASSERT_GE(r, 0);
  const pid_t pid = start_train_mnist(long_tiny_run(dir), dir.file("out.txt"), "");
  ASSERT_GT(pid, 0);
  std::string stream;
  char buf[65536];
  bool signalled = false;
  for (int idle = 0; idle < 6000;) {  // 60 s without data: a failure, not a hang
    const ssize_t n = ::read(r, buf, sizeof buf);
    if (n > 0) {
      stream.append(buf, static_cast<std::size_t>(n));
      if (!signalled && stream.size() >= 65536) {  // the writer now waits on the full pipe
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        ::kill(pid, SIGTERM);
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        signalled = true;
      }
      continue;
    }
    if (n == 0 && !stream.empty()) break;  // the save closed the FIFO: one checkpoint read
    ++idle;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::close(r);
  ::kill(pid, SIGKILL);  // its next save would wait for a reader
  ::waitpid(pid, nullptr, 0);
  EXPECT_TRUE(signalled);
  EXPECT_EQ(stream.find("SIGTERM"), std::string::npos) << "the signal's note is inside the checkpoint";
  // The stop's own save may open the FIFO again before this loop has seen it close, so the
  // stream holds one checkpoint or more, back to back. Each is cut at the size its header
  // gives (a little-endian u64 at byte 16) and must read back whole.
  int checkpoints = 0;
  for (std::size_t at = 0; at < stream.size(); ++checkpoints) {
    ASSERT_GE(stream.size() - at, 24u) << "a piece too short for a checkpoint's header";
    std::uint64_t size = 0;
    for (int i = 0; i < 8; ++i) size |= std::uint64_t{static_cast<unsigned char>(stream[at + 16 + i])} << (8 * i);
    ASSERT_GE(size, 24u);
    ASSERT_LE(size, stream.size() - at) << "checkpoint " << checkpoints + 1 << " is cut short";
    const std::string copy = dir.file("copy" + std::to_string(checkpoints) + ".ckpt");
    std::ofstream(copy, std::ios::binary) << stream.substr(at, size);
    EXPECT_NO_THROW(io::read_checkpoint(copy)) << "checkpoint " << checkpoints + 1;
    at += size;
  }
  EXPECT_GE(checkpoints, 1);
}

// Past the file-size limit (ulimit -f; about 0.5 or 1 MB here, under the checkpoint's
// 1.4 MB) a save fails with one line naming the file and the reason, and leaves no
// temporary file. SIGXFSZ used to end the run in the middle of the write, without a word,
// leaving run.ckpt.tmp.PID behind.
TEST(TrainMnistCli, FileSizeLimitIsAnErrorThatLeavesNoTemporaryFile) {
  TempDir dir;
  write_tiny_mnist(dir);
  const RunResult r = run_program(MF_TRAIN_MNIST_BIN,
                          "--device cpu --data " + dir.file("") + " --epochs 1 --quiet --save " + dir.file("run.ckpt"),
                          dir, "ulimit -f 1000");
  EXPECT_EQ(r.status, kError);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("train_mnist: error: " + dir.file("run.ckpt") + ": "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("File too large"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("run.ckpt")));
  EXPECT_TRUE(temp_files_in(dir).empty()) << temp_files_in(dir)[0];
}

// A checkpoint with a valid checksum but settings the flags would never allow (crafted, or
// written by a buggy build) is refused before anything is allocated or trained, naming the
// file, the key, the value and the range. The data folder does not exist: a setting that
// passes the checks ends at the data, so the message tells which happened.
TEST(TrainMnistCli, ResumeChecksTheRangesOfTheSavedSettings) {
  TempDir dir;
  auto [model, good] = saved_after_one_epoch();
  good.limit_train = 640;
  const std::string path = dir.file("crafted.ckpt");
  const std::string args = "--device cpu --quiet --epochs 2 --data /nonexistent/mnist --resume " + path;

  // The valid settings pass the checks, also with lr=0 (not recorded: the --lr default is used).
  for (double lr : {1e-3, 0.0}) {
    io::CheckpointMeta m = good;
    m.lr = lr;
    io::save_checkpoint(path, model, *model.optimizer(), m);
    expect_one_line_error(args, "/nonexistent/mnist", kError);
  }

  const struct {
    const char* what;
    void (*set)(io::CheckpointMeta&);
    const char* expect;
  } cases[] = {
      {"batch size 2^62 (numel overflows to 0)", [](io::CheckpointMeta& m) { m.batch_size = 4611686018427387904; },
       "saved batch_size=4611686018427387904 is out of range: --batch-size must be between 1 and 65536"},
      {"batch size 1e12 (bad_alloc)", [](io::CheckpointMeta& m) { m.batch_size = 1000000000000; },
       "saved batch_size=1000000000000 is out of range: --batch-size must be between 1 and 65536"},
      {"batch size 0", [](io::CheckpointMeta& m) { m.batch_size = 0; },
       "saved batch_size=0 is out of range: --batch-size must be between 1 and 65536"},
      {"lr 1e300", [](io::CheckpointMeta& m) { m.lr = 1e300; },
       "saved lr=1e+300 is out of range: --lr must be in [1e-08, 10]"},
      {"lr NaN", [](io::CheckpointMeta& m) { m.lr = std::nan(""); },
       "saved lr=nan is out of range: --lr must be in [1e-08, 10]"},
      {"lr negative", [](io::CheckpointMeta& m) { m.lr = -0.001; },
       "saved lr=-0.001 is out of range: --lr must be in [1e-08, 10]"},
      {"momentum 1.5", [](io::CheckpointMeta& m) { m.momentum = 1.5; },
       "saved momentum=1.5 is out of range: --momentum must be in [0, 1)"},
      {"validation split 1", [](io::CheckpointMeta& m) { m.validation_split = 1.0; },
       "saved validation_split=1 is out of range: --validation-split must be in [0, 1)"},
      {"limit_train -5", [](io::CheckpointMeta& m) { m.limit_train = -5; },
       "saved limit_train=-5 is out of range: --limit-train must be between 0 and 9223372036854775807"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    io::CheckpointMeta m = good;
    c.set(m);
    io::save_checkpoint(path, model, *model.optimizer(), m);
    ASSERT_NO_THROW(io::read_checkpoint(path)) << "the crafted file itself must be valid";
    expect_one_line_error(args, "--resume " + path + ": " + c.expect, kError);
  }
}

// Resuming with a smaller --epochs than the checkpoint has trains nothing and must not write
// the checkpoint back with fewer epochs than its weights have seen.
TEST(TrainMnistCli, ResumeWithFewerEpochsKeepsTheSavedEpochCount) {
  const std::string data = mnist_dir();
  if (!fs::exists(data)) GTEST_SKIP() << "no MNIST at " << data;
  TempDir dir;
  const std::string ckpt = dir.file("run.ckpt");
  const std::string common = "--device cpu --data " + sh_quote(data) + " --quiet --save " + ckpt;
  RunResult r = run_program(MF_TRAIN_MNIST_BIN, common + " --limit-train 640 --epochs 2", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const io::CheckpointFile before = io::read_checkpoint(ckpt);
  ASSERT_EQ(before.contents.meta.epoch, 2);

  r = run_program(MF_TRAIN_MNIST_BIN, common + " --resume " + ckpt + " --epochs 1", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("the checkpoint already has 2 epoch(s) and --epochs is 1: nothing to train"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("Epoch "), std::string::npos) << "nothing was to be trained: " << r.out;

  const io::CheckpointFile after = io::read_checkpoint(ckpt);
  EXPECT_EQ(after.contents.meta.epoch, 2);
  EXPECT_FALSE(after.contents.meta.partial_epoch);
  EXPECT_EQ(after.contents.meta.iterations, before.contents.meta.iterations);
  ASSERT_EQ(after.contents.meta.history.size(), 2u);
  EXPECT_EQ(after.contents.meta.history[1].epoch, 1);
  EXPECT_EQ(after.contents.meta.history[1].loss, before.contents.meta.history[1].loss);
  // The same weights and optimizer state, byte for byte.
  ASSERT_EQ(after.contents.tensors.size(), before.contents.tensors.size());
  for (std::size_t i = 0; i < after.contents.tensors.size(); ++i) {
    const io::CheckpointTensor &a = after.contents.tensors[i], &b = before.contents.tensors[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(after.bytes.substr(a.offset, a.nbytes), before.bytes.substr(b.offset, b.nbytes)) << a.name;
  }
}

TEST(TrainMnistCli, ShortRunWritesMetricsPlotCheckpointAndResumes) {
  const std::string data = mnist_dir();
  if (!fs::exists(data)) GTEST_SKIP() << "no MNIST at " << data;
  TempDir dir;
  const std::string ckpt = dir.file("run.ckpt"), plot = dir.file("run.png"), json = dir.file("run.json");
  const std::string common = "--device cpu --data " + sh_quote(data) + " --quiet --save " + ckpt + " --plot " + plot +
                             " --metrics-json " + json;
  RunResult r = run_program(MF_TRAIN_MNIST_BIN, common + " --limit-train 1000 --epochs 1 --validation-split 0.02", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  std::string j = io::read_file_bytes(json);
  EXPECT_NE(j.find("\"test_accuracy\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"epoch\": 1"), std::string::npos) << j;
#if MF_WITH_STB
  int w = 0, h = 0, c = 0;
  EXPECT_TRUE(io::image_info(plot, &w, &h, &c));
#endif
  io::CheckpointFile f = io::read_checkpoint(ckpt);
  EXPECT_EQ(f.contents.meta.epoch, 1);
  EXPECT_FALSE(f.contents.meta.partial_epoch);
  EXPECT_EQ(f.contents.meta.limit_train, 1000);
  EXPECT_EQ(f.contents.meta.batch_size, 64);

  // A flag that contradicts the checkpoint.
  {
    SCOPED_TRACE("resume with another batch size");
    r = run_program(MF_TRAIN_MNIST_BIN, "--device cpu --data " + sh_quote(data) + " --resume " + ckpt + " --batch-size 32", dir);
    EXPECT_NE(r.status, 0);
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("--batch-size 32 differs from the 64 the run was saved with"), std::string::npos) << r.err;
  }

  // Resume: the split, limit and batch size come from the checkpoint.
  r = run_program(MF_TRAIN_MNIST_BIN, common + " --resume " + ckpt + " --epochs 2", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("Resuming " + ckpt + ": 1 epoch(s) done"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Epoch 2/2"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Epoch 1/2"), std::string::npos) << r.out;
  f = io::read_checkpoint(ckpt);
  EXPECT_EQ(f.contents.meta.epoch, 2);
  ASSERT_EQ(f.contents.meta.history.size(), 2u);
  j = io::read_file_bytes(json);
  EXPECT_NE(j.find("\"epoch\": 1"), std::string::npos) << "the saved epoch is in the metrics: " << j;
  EXPECT_NE(j.find("\"epoch\": 2"), std::string::npos) << j;

#if MF_WITH_STB && defined(MF_PREDICT_BIN)
  // The misclassified-digits grid from that checkpoint.
  r = run_program(MF_PREDICT_BIN, "--model " + ckpt + " --data " + sh_quote(data) + " --grid " + dir.file("grid.png") + " --grid-max 30",
          dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("test images misclassified"), std::string::npos) << r.out;
  EXPECT_TRUE(io::image_info(dir.file("grid.png"), &w, &h, &c));
  EXPECT_EQ(w, 10 * 68);
#endif
}

// --dense-grad multiplies the zeros of the convolution's output gradient instead of skipping
// them: the same sums in another order, so the same training up to float rounding.
TEST(TrainMnistCli, DenseGradSwitchesKernelsAndTrainsAlike) {
  const std::string data = mnist_dir();
  if (!fs::exists(data)) GTEST_SKIP() << "no MNIST at " << data;
  TempDir dir;
  double loss[2], val_loss[2];
  for (int dense = 0; dense < 2; ++dense) {
    const std::string json = dir.file("run" + std::to_string(dense) + ".json");
    const RunResult r = run_program(MF_TRAIN_MNIST_BIN,
                            "--device cpu --data " + sh_quote(data) + " --quiet --verbose --limit-train 1280 --epochs 1 "
                            "--validation-split 0.02 --metrics-json " + json + (dense ? " --dense-grad" : ""),
                            dir);
    ASSERT_EQ(r.status, 0) << r.err;
    // --verbose names the kernels conv2d_1's backward ran: the flag must have switched them.
    const std::size_t at = r.out.find("  conv2d_1 ");
    ASSERT_NE(at, std::string::npos) << r.out;
    const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    EXPECT_NE(line.find(dense ? "dense tiles (dZ not listed" : "sparse lists: "), std::string::npos) << line;
    const std::string j = io::read_file_bytes(json);
    loss[dense] = json_number(j, "loss");
    val_loss[dense] = json_number(j, "val_loss");
  }
  // 20 Adam steps from the same start; rounding differences grow but stay far below 1 %.
  EXPECT_NEAR(loss[1], loss[0], 1e-3 * loss[0]);
  EXPECT_NEAR(val_loss[1], val_loss[0], 1e-2 * val_loss[0]);
  EXPECT_GT(loss[0], 0.1);  // a real loss, not a default
}

// The CPU path gives the same bits at every run with one seed, so two runs write the same
// losses to the last digit (the JSON prints each number with the digits that round-trip it);
// --deterministic, a GPU flag, is noted as ignored there and the file says "deterministic".
TEST(TrainMnistCli, TwoCpuRunsWithOneSeedWriteTheSameLosses) {
  const std::string data = mnist_dir();
  if (!fs::exists(data)) GTEST_SKIP() << "no MNIST at " << data;
  TempDir dir;
  std::string epochs[2];
  for (int run = 0; run < 2; ++run) {
    const std::string json = dir.file("run" + std::to_string(run) + ".json");
    const RunResult r = run_program(MF_TRAIN_MNIST_BIN,
                            "--device cpu --data " + sh_quote(data) + " --quiet --limit-train 640 --epochs 2 "
                            "--validation-split 0.05 --seed 7 --deterministic --metrics-json " + json,
                            dir);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("--deterministic applies to the GPU only"), std::string::npos) << r.err;
    const std::string j = io::read_file_bytes(json);
    EXPECT_NE(j.find("\"deterministic\": true"), std::string::npos) << j;
    const std::size_t from = j.find("\"epochs\": ["), to = j.find(']', from);
    ASSERT_NE(from, std::string::npos) << j;
    ASSERT_NE(to, std::string::npos) << j;
    epochs[run] = j.substr(from, to - from);
    EXPECT_GT(json_number(j, "loss"), 0.05);  // a real loss, not a default
  }
  // Every epoch's losses, accuracies and step counts, the times taken out.
  for (std::string& e : epochs)
    e = std::regex_replace(e, std::regex(R"re(, "(train_seconds|ms_per_step)": [^,}]+)re"), "");
  EXPECT_NE(epochs[0].find("\"val_loss\": "), std::string::npos) << epochs[0];
  EXPECT_EQ(epochs[0], epochs[1]);
}

// The scripts answer --help with the comment at their top, and refuse an argument they do not
// take with one line and status 2 before anything else: test.sh ignored every argument but
// --sanitize (a mistyped --sanitise ran the tests without the sanitizers), and the others
// took "--help" for a folder, a build folder or a number of seconds and went on to install,
// build or download.
TEST(Scripts, HelpPrintsTheUsageAndUnknownArgumentsAreRefused) {
  const std::string dir = MF_SCRIPTS_DIR;
  if (!fs::exists(dir + "/test.sh")) GTEST_SKIP() << "no scripts at " << dir;
  TempDir tmp;
  const std::pair<const char*, const char*> cases[] = {
      {"test.sh", "--sanitise"},       {"setup.sh", "--no-such-option"},
      {"fetch_mnist.sh", "--help-me"}, {"bench.sh", "--no-such-option"},
      {"fuzz.sh", "--help-me"},        {"fuzz.sh", "abc"},
      {"skipped_tests.sh", "--x"},     {"device_check.sh", "--no-such-option"},
      {"device_prepare.sh", "--no-such-option"}, {"coverage.sh", "--no-such-option"}};
  for (const auto& [name, bad] : cases) {
    SCOPED_TRACE(std::string(name) + " " + bad);
    const std::string script = dir + "/" + name;
    const RunResult help = run_program(script, "--help", tmp);
    EXPECT_EQ(help.status, 0) << help.err;
    EXPECT_EQ(help.out.rfind(name, 0), 0u) << "--help should start with the script's name:\n" << help.out;
    EXPECT_EQ(help.err, "");
    const RunResult r = run_program(script, bad, tmp);
    EXPECT_EQ(r.status, 2) << r.out << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("error: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(std::string("'") + bad + "'"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
  // train.sh passes its arguments on to train_mnist, so it refuses none itself; --help is
  // answered before the set-up (it installed, downloaded and built first), with
  // train_mnist's flags where it is built. A build folder of its own shows no set-up ran.
  const std::string no_build = tmp.file("no-build");
  RunResult help = run_program(dir + "/train.sh", "--help", tmp, "export MF_BUILD_DIR=" + sh_quote(no_build));
  EXPECT_EQ(help.status, 0) << help.err;
  EXPECT_EQ(help.out.rfind("train.sh", 0), 0u) << help.out;
  EXPECT_NE(help.out.find("train_mnist is not built yet"), std::string::npos) << help.out;
  EXPECT_EQ(help.err, "");
  EXPECT_FALSE(fs::exists(no_build)) << "train.sh --help ran the set-up";
  const std::string built = fs::path(mf::testing::program_path(MF_TRAIN_MNIST_BIN)).parent_path().parent_path();
  help = run_program(dir + "/train.sh", "-h", tmp, "export MF_BUILD_DIR=" + sh_quote(built));
  EXPECT_EQ(help.status, 0) << help.err;
  EXPECT_NE(help.out.find("--epochs"), std::string::npos) << "train_mnist's flags:\n" << help.out;
}

// The Python scripts print their usage on --help where PyTorch is not installed too:
// fp16_drift.py stopped at `import numpy` with a traceback, compare_with_pytorch.py printed
// "SKIPPED" (status 77), and bench_report.py took --help for a results folder.
TEST(Scripts, PythonScriptsPrintTheirUsageWithoutPyTorch) {
  const std::string dir = MF_SCRIPTS_DIR;
  if (!fs::exists(dir + "/bench_report.py")) GTEST_SKIP() << "no scripts at " << dir;
  if (std::system("python3 -c '' > /dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  TempDir tmp;
  for (const char* name : {"fp16_drift.py", "compare_with_pytorch.py", "bench_report.py", "accuracy_over_seeds.py"}) {
    SCOPED_TRACE(name);
    const RunResult r = run_program("python3", sh_quote(dir + "/" + name) + " --help", tmp);
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_GT(count_lines(r.out), 3) << r.out;
    EXPECT_NE(r.out.find(name), std::string::npos) << "the usage shows how to run the script:\n" << r.out;
  }
}

// The seed-study scripts answer a bad --seeds, and a training that fails, with one line of
// their own, not a Python traceback.
TEST(Scripts, SeedStudiesReportBadSeedsAndFailedRunsInOneLine) {
  const std::string dir = MF_SCRIPTS_DIR;
  if (!fs::exists(dir + "/accuracy_over_seeds.py")) GTEST_SKIP() << "no scripts at " << dir;
  if (std::system("python3 -c '' > /dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  TempDir tmp;
  const std::string script = sh_quote(dir + "/accuracy_over_seeds.py") + " ";
  for (const char* seeds : {"abc", "5-2", "0-3,x"}) {
    const RunResult r = run_program("python3", script + "--data " + tmp.file("") + " --seeds " + seeds, tmp);
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_NE(r.err.find("argument --seeds: expected seeds such as 0-63 or 0-3,10, got '" + std::string(seeds) + "'"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("Traceback"), std::string::npos) << r.err;
  }
  const RunResult r = run_program("python3",
                                  script + "--data " + tmp.file("none") + " --seeds 0 --train-mnist " +
                                      sh_quote(mf::testing::program_path(MF_TRAIN_MNIST_BIN)),
                                  tmp);
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.err, "train_mnist: error: " + tmp.file("none") + ": data folder not found\n"
                   "accuracy_over_seeds: error: microflow failed for seed 0 (exit status 1)\n");
}
