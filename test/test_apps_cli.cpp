// test_apps_cli.cpp: train_mnist from the command line: every bad flag or input exits with
// its documented status (2 for a flag, 1 for the rest) and exactly one line on stderr naming
// the problem; a short real run writes its metrics, plot and checkpoint, and resumes from it.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "apps/atomic_file.h"
#include "apps/checkpoint.h"
#include "apps/common.h"
#include "data/idx.h"
#include "kernels/gpu_runtime.h"
#include "test/test_util.h"
#if MF_WITH_STB
#include "apps/image.h"
#endif

namespace fs = std::filesystem;
using namespace mf;

namespace {

using mf::testing::TempDir;

struct RunResult {
  int status;
  std::string out, err;
};

RunResult run(const char* bin, const std::string& args, const TempDir& dir) {
  const std::string out = dir.file("stdout.txt"), err = dir.file("stderr.txt");
  const std::string cmd = mf::testing::program_path(bin) + " " + args + " > " + out + " 2> " + err + " < /dev/null";
  const int st = std::system(cmd.c_str());
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, apps::read_file_bytes(out), apps::read_file_bytes(err)};
}

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// train_mnist's exit status for a bad flag, and for any other error (--help says so).
constexpr int kBadFlag = 2, kError = 1;

// Exits with `status`; stderr is one line, "train_mnist: error: ...", containing `expect`.
void expect_one_line_error(const std::string& args, const std::string& expect, int status) {
  SCOPED_TRACE("train_mnist " + args);
  TempDir dir("_run");
  const RunResult r = run(MF_TRAIN_MNIST_BIN, args, dir);
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
}

TEST(TrainMnistCli, MissingGpuGivesOneLine) {
  if (gpu_available()) GTEST_SKIP() << "this machine has a GPU";
  expect_one_line_error("--device gpu", "--device gpu", kError);
}

TEST(TrainMnistCli, AutoDevicePicksTheGpuOrSaysWhyNot) {
  const std::string data = mnist_dir();
  if (!fs::exists(data)) GTEST_SKIP() << "no MNIST at " << data;
  TempDir dir;
  const RunResult r = run(MF_TRAIN_MNIST_BIN, "--data " + data + " --quiet --limit-train 256 --epochs 1", dir);
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

TEST(TrainMnistCli, ShortRunWritesMetricsPlotCheckpointAndResumes) {
  const std::string data = mnist_dir();
  if (!fs::exists(data)) GTEST_SKIP() << "no MNIST at " << data;
  TempDir dir;
  const std::string ckpt = dir.file("run.ckpt"), plot = dir.file("run.png"), json = dir.file("run.json");
  const std::string common = "--device cpu --data " + data + " --quiet --save " + ckpt + " --plot " + plot +
                             " --metrics-json " + json;
  RunResult r = run(MF_TRAIN_MNIST_BIN, common + " --limit-train 1000 --epochs 1 --validation-split 0.02", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  std::string j = apps::read_file_bytes(json);
  EXPECT_NE(j.find("\"test_accuracy\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"epoch\": 1"), std::string::npos) << j;
#if MF_WITH_STB
  int w = 0, h = 0, c = 0;
  EXPECT_TRUE(apps::image_info(plot, &w, &h, &c));
#endif
  apps::CheckpointFile f = apps::read_checkpoint(ckpt);
  EXPECT_EQ(f.contents.meta.epoch, 1);
  EXPECT_FALSE(f.contents.meta.partial_epoch);
  EXPECT_EQ(f.contents.meta.limit_train, 1000);
  EXPECT_EQ(f.contents.meta.batch_size, 64);

  // A flag that contradicts the checkpoint.
  {
    SCOPED_TRACE("resume with another batch size");
    r = run(MF_TRAIN_MNIST_BIN, "--device cpu --data " + data + " --resume " + ckpt + " --batch-size 32", dir);
    EXPECT_NE(r.status, 0);
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("--batch-size 32 differs from the 64 the run was saved with"), std::string::npos) << r.err;
  }

  // Resume: the split, limit and batch size come from the checkpoint.
  r = run(MF_TRAIN_MNIST_BIN, common + " --resume " + ckpt + " --epochs 2", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("Resuming " + ckpt + ": 1 epoch(s) done"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Epoch 2/2"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Epoch 1/2"), std::string::npos) << r.out;
  f = apps::read_checkpoint(ckpt);
  EXPECT_EQ(f.contents.meta.epoch, 2);
  ASSERT_EQ(f.contents.meta.history.size(), 2u);
  j = apps::read_file_bytes(json);
  EXPECT_NE(j.find("\"epoch\": 1"), std::string::npos) << "the saved epoch is in the metrics: " << j;
  EXPECT_NE(j.find("\"epoch\": 2"), std::string::npos) << j;

#if MF_WITH_STB && defined(MF_PREDICT_BIN)
  // The misclassified-digits grid from that checkpoint.
  r = run(MF_PREDICT_BIN, "--model " + ckpt + " --data " + data + " --grid " + dir.file("grid.png") + " --grid-max 30",
          dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("test images misclassified"), std::string::npos) << r.out;
  EXPECT_TRUE(apps::image_info(dir.file("grid.png"), &w, &h, &c));
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
    const RunResult r = run(MF_TRAIN_MNIST_BIN,
                            "--device cpu --data " + data + " --quiet --verbose --limit-train 1280 --epochs 1 "
                            "--validation-split 0.02 --metrics-json " + json + (dense ? " --dense-grad" : ""),
                            dir);
    ASSERT_EQ(r.status, 0) << r.err;
    // --verbose names the kernels conv2d_1's backward ran: the flag must have switched them.
    const std::size_t at = r.out.find("  conv2d_1 ");
    ASSERT_NE(at, std::string::npos) << r.out;
    const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    EXPECT_NE(line.find(dense ? "dense tiles (dZ not listed" : "sparse lists: "), std::string::npos) << line;
    const std::string j = apps::read_file_bytes(json);
    loss[dense] = json_number(j, "loss");
    val_loss[dense] = json_number(j, "val_loss");
  }
  // 20 Adam steps from the same start; rounding differences grow but stay far below 1 %.
  EXPECT_NEAR(loss[1], loss[0], 1e-3 * loss[0]);
  EXPECT_NEAR(val_loss[1], val_loss[0], 1e-2 * val_loss[0]);
  EXPECT_GT(loss[0], 0.1);  // a real loss, not a default
}
