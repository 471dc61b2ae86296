// test_ladder_gpu.cpp: the kernel ladder on the GPU. The naive rung (kernels/gpu/naive.cu,
// one thread per output) runs Conv2D and Dense in FP32 and FP16 against the double
// references and the CPU's naive loops; the library rung is LayerGpu.*'s subject
// (test_layers_gpu.cpp). A rung the GPU lacks is a one-line error, and the naive and
// library rungs train the model to the same per-epoch losses. Skipped without a GPU;
// test/emulator runs them on the CUDA emulation as Emulated.LadderGpu.*.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/kernel_options.h"
#include "layers/conv2d.h"
#include "layers/dense.h"
#include "layers/flatten.h"
#include "optim/adam.h"
#include "runtime/gpu_runtime.h"
#include "tensor/half.h"
#include "tensor/rng.h"
#include "test/channel_util.h"
#include "test/test_util.h"
#include "train/sequential.h"

namespace {

using mf::Activation;
using mf::Device;
using mf::DType;
using mf::KernelRung;
using mf::Tensor;
using mf::testing::all_close;
using mf::testing::Tol;

// FP32: the same f32 sums as the CPU's naive loops, in the same order, but the compilers may
// fuse a multiply and an add into one FMA on one side and not the other: ~1e-7 relative per
// term. FP16: inputs rounded to f16 before both sides compute, f32 sums, the output rounded
// to f16 (2^-11 = 4.9e-4 relative) and, for dW and db, the f16 gradient it is added into.
constexpr Tol kFp32Tol{1e-5, 1e-4};
constexpr Tol kFp16Tol{1e-2, 1e-2};

mf::KernelOptions naive_options() {
  mf::KernelOptions k;
  k.rung = KernelRung::kNaive;
  return k;
}

Tensor to_host(const Tensor& t) {
  mf::gpu_synchronize();
  return t.to(Device::kCpu).to(DType::kF32);
}

Tensor on_gpu(const Tensor& t, DType dtype) { return t.to(dtype).to(Device::kGpu); }

// The layer's forward and backward on the GPU at `dtype`, and its gradients, to the host.
struct Run {
  Tensor y, dx, dw, db;
};
Run run_on_gpu(mf::Layer& layer, const Tensor& x, const Tensor& dy, DType dtype) {
  layer.to(Device::kGpu);
  layer.set_compute_dtype(dtype);
  Run r;
  r.y = to_host(layer.forward(on_gpu(x, dtype)));
  const Tensor& dx = layer.backward(on_gpu(dy, dtype));
  if (dx.defined()) r.dx = to_host(dx);
  r.dw = to_host(layer.parameters()[0]->grad);
  r.db = to_host(layer.parameters()[1]->grad);
  return r;
}

void check_conv(DType dtype, std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c, std::int64_t filters,
                bool relu, bool input_grad, std::uint64_t seed) {
  const bool half = dtype == DType::kF16;
  SCOPED_TRACE(std::string("naive Conv2D ") + mf::dtype_name(dtype) + " N=" + std::to_string(n) + " C=" +
               std::to_string(c) + " K=" + std::to_string(filters));
  mf::Rng rng(seed);
  mf::Conv2D conv(c, filters, 3, relu ? Activation::kRelu : Activation::kNone, rng);
  conv.set_kernel_options(naive_options());
  conv.set_needs_input_grad(input_grad);
  conv.bias().value.copy_from(mf::testing::uniform({filters}, -0.3f, 0.3f, rng));
  Tensor x = mf::testing::uniform({n, h, w, c}, -1, 1, rng);
  Tensor dy = mf::testing::uniform({n, h - 2, w - 2, filters}, -1, 1, rng);
  if (half)
    for (Tensor* t : {&conv.weight().value, &conv.bias().value, &x, &dy}) mf::testing::round_to_half(*t);
  const auto y_ref = mf::testing::conv2d_forward_ref(x, conv.weight().value, conv.bias().value, relu);
  const auto g_ref = mf::testing::conv2d_backward_ref(x, conv.weight().value, conv.bias().value, relu, dy);
  // The CPU's naive loops on the same inputs: the GPU's threads sum what they sum.
  const Tensor y_cpu = conv.forward(x).clone();
  conv.backward(dy);
  const Tensor dw_cpu = conv.weight().grad.clone();
  for (mf::Parameter* p : conv.parameters()) p->grad.fill_zero();

  const Run g = run_on_gpu(conv, x, dy, dtype);
  const std::int64_t terms = n * (h - 2) * (w - 2);
  const Tol tol = half ? kFp16Tol : kFp32Tol;
  const Tol grad_tol = half ? kFp16Tol : mf::testing::fp32_reduction_tol(terms);
  EXPECT_TRUE(all_close(g.y, y_ref, tol));
  EXPECT_TRUE(all_close(g.y, y_cpu, tol)) << "against the CPU's naive loops";
  EXPECT_TRUE(all_close(g.dw, g_ref.dw, grad_tol));
  EXPECT_TRUE(all_close(g.dw, dw_cpu, grad_tol)) << "against the CPU's naive loops";
  EXPECT_TRUE(all_close(g.db, g_ref.db, grad_tol));
  ASSERT_EQ(g.dx.defined(), input_grad);
  if (input_grad) {
    EXPECT_TRUE(all_close(g.dx, g_ref.dx, tol));
  }
  EXPECT_NE(conv.gpu_config().find("naive"), std::string::npos) << conv.gpu_config();
}

TEST(LadderGpu, NaiveConv2dMatchesTheReference) {
  MF_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kF32, DType::kF16}) {
    check_conv(dtype, 2, 28, 28, 1, 32, true, false, 1);   // the model's first layer
    check_conv(dtype, 2, 13, 13, 32, 64, true, true, 2);  // its second
    check_conv(dtype, 3, 7, 9, 3, 5, false, true, 3);     // odd sizes, linear
  }
}

void check_dense(DType dtype, std::int64_t n, std::int64_t in, std::int64_t units, bool relu, std::uint64_t seed) {
  const bool half = dtype == DType::kF16;
  SCOPED_TRACE(std::string("naive Dense ") + mf::dtype_name(dtype) + " " + std::to_string(in) + "->" +
               std::to_string(units));
  mf::Rng rng(seed);
  mf::Dense dense(in, units, relu ? Activation::kRelu : Activation::kNone, rng);
  dense.set_kernel_options(naive_options());
  dense.bias().value.copy_from(mf::testing::uniform({units}, -0.3f, 0.3f, rng));
  Tensor x = mf::testing::uniform({n, in}, -1, 1, rng), dy = mf::testing::uniform({n, units}, -1, 1, rng);
  if (half)
    for (Tensor* t : {&dense.weight().value, &dense.bias().value, &x, &dy}) mf::testing::round_to_half(*t);
  const auto y_ref = mf::testing::dense_forward_ref(x, dense.weight().value, dense.bias().value, relu);
  const auto g_ref = mf::testing::dense_backward_ref(x, dense.weight().value, dense.bias().value, relu, dy);
  const Run g = run_on_gpu(dense, x, dy, dtype);
  const Tol tol = half ? kFp16Tol : Tol{1e-5 * std::sqrt(static_cast<double>(in)), 1e-4};
  EXPECT_TRUE(all_close(g.y, y_ref, tol));
  EXPECT_TRUE(all_close(g.dx, g_ref.dx, half ? kFp16Tol : kFp32Tol));
  EXPECT_TRUE(all_close(g.dw, g_ref.dw, half ? kFp16Tol : mf::testing::fp32_reduction_tol(n)));
  EXPECT_TRUE(all_close(g.db, g_ref.db, half ? kFp16Tol : mf::testing::fp32_reduction_tol(n)));
}

TEST(LadderGpu, NaiveDenseMatchesTheReference) {
  MF_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kF32, DType::kF16}) {
    check_dense(dtype, 5, 1600, 64, true, 11);
    check_dense(dtype, 5, 64, 10, false, 12);
    check_dense(dtype, 3, 7, 13, true, 13);
  }
}

// The tuned rung is the CPU's: on the GPU it is refused in one line before anything runs.
TEST(LadderGpu, RungTheGpuLacksIsAOneLineError) {
  MF_SKIP_WITHOUT_GPU();
  mf::Rng rng(5);
  mf::Dense dense(4, 3, Activation::kNone, rng);
  mf::KernelOptions k;
  k.rung = KernelRung::kTuned;
  dense.set_kernel_options(k);
  dense.to(Device::kGpu);
  try {
    dense.forward(Tensor::zeros({2, 4}).to(Device::kGpu));
    FAIL() << "the tuned rung ran on the GPU";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_NE(m.find("tuned"), std::string::npos) << m;
  }
}

// One model from one seed trained on the GPU's naive rung, on its library rung (FP32, no
// TF32, deterministic cuDNN algorithms) and on the CPU's naive loops: each learns, and the
// per-epoch losses agree within 1e-3 relative. 128 images, 3 epochs of 4 steps: short, since
// the CUDA emulation runs the naive kernels' threads one by one.
TEST(LadderGpu, NaiveTrainsToTheLibrarysLosses) {
  MF_SKIP_WITHOUT_GPU();
  const mf::data::Dataset train = mf::testing::synthetic(128, 17);
  std::vector<mf::History> h;
  const struct {
    KernelRung rung;
    Device device;
  } runs[] = {{KernelRung::kNaive, Device::kGpu}, {KernelRung::kLibrary, Device::kGpu}, {KernelRung::kNaive, Device::kCpu}};
  for (const auto& run : runs) {
    SCOPED_TRACE(std::string(mf::rung_name(run.rung)) + (run.device == Device::kGpu ? " GPU" : " CPU"));
    mf::Rng rng(18);
    mf::Sequential m = mf::Sequential::mnist_cnn(rng);
    mf::KernelOptions k;
    k.rung = run.rung;
    k.fma_math_only = true;
    k.deterministic = true;
    k.find = false;
    m.set_kernel_options(k);
    m.to(run.device);
    m.compile(std::make_unique<mf::Adam>());
    mf::FitOptions o;
    o.epochs = 3;
    o.batch_size = 32;  // 4 steps an epoch
    o.seed = 19;
    h.push_back(m.fit(train, nullptr, o));
    ASSERT_EQ(h.back().epochs.size(), 3u);
    EXPECT_LT(h.back().epochs[2].loss, 0.8 * h.back().epochs[0].loss);  // 2.25 -> 1.65 here
  }
  for (std::size_t r = 1; r < h.size(); ++r)
    for (std::size_t e = 0; e < 3; ++e)
      EXPECT_NEAR(h[r].epochs[e].loss, h[0].epochs[e].loss, 1e-3 * h[0].epochs[e].loss) << "run " << r << " epoch " << e;
}

// The fused rung's step (train/fused_step.h) trains the model as the library rung does:
// per-epoch losses within 1e-3 relative in FP32 (both sum the same products in f32, in other
// orders), and in FP16 it learns. Its statistics, weights and Adam state come out of 9
// kernels instead of about 28; two runs give the same bits (no atomics).
// `progress_on_second`: the second run reports its progress after every step, which makes
// the GPU run each step on its own instead of 16 to a graph launch (train/gpu_steps.cu).
std::vector<mf::History> train_rungs(const std::vector<KernelRung>& rungs, DType dtype, bool graph, int images,
                                     int epochs, int batch, std::vector<std::vector<float>>* weights = nullptr,
                                     bool progress_on_second = false, bool exact_fp32 = true) {
  const mf::data::Dataset train = mf::testing::synthetic(images, 27);
  std::vector<mf::History> h;
  for (KernelRung rung : rungs) {
    const bool progress = progress_on_second && h.size() == 1;
    SCOPED_TRACE(mf::rung_name(rung));
    mf::Rng rng(28);
    mf::Sequential m = mf::Sequential::mnist_cnn(rng);
    mf::KernelOptions k;
    k.rung = rung;
    k.fma_math_only = exact_fp32;
    k.deterministic = true;
    k.find = false;
    m.set_kernel_options(k);
    m.to(Device::kGpu);
    if (dtype == DType::kF16) m.set_compute_dtype(DType::kF16);
    m.compile(std::make_unique<mf::Adam>());
    mf::FitOptions o;
    o.epochs = epochs;
    o.batch_size = batch;
    o.seed = 29;
    o.use_graph = graph;
    mf::FitCallbacks calls;
    int reports = 0;
    if (progress) {
      o.progress_interval_s = 0;
      calls.on_progress = [&](const mf::Progress&) { ++reports; };
    }
    h.push_back(m.fit(train, nullptr, o, calls));
    if (progress) {
      EXPECT_EQ(reports, epochs * ((images + batch - 1) / batch));
    }
    if (weights) {
      weights->emplace_back();
      for (mf::Parameter* p : m.parameters())
        for (float v : p->value.to(Device::kCpu).to_vector()) weights->back().push_back(v);
    }
  }
  return h;
}

TEST(LadderGpu, FusedTrainsToTheLibrarysLossesFp32) {
  MF_SKIP_WITHOUT_GPU();
  const auto h = train_rungs({KernelRung::kLibrary, KernelRung::kFused}, DType::kF32, true, 150, 3, 32);  // 4 steps + 22 images
  ASSERT_EQ(h[1].epochs.size(), 3u);
  EXPECT_LT(h[1].epochs[2].loss, 0.8 * h[1].epochs[0].loss);
  for (std::size_t e = 0; e < 3; ++e) {
    EXPECT_NEAR(h[1].epochs[e].loss, h[0].epochs[e].loss, 1e-3 * h[0].epochs[e].loss) << "epoch " << e;
    EXPECT_NEAR(h[1].epochs[e].accuracy, h[0].epochs[e].accuracy, 2.0 / 150) << "epoch " << e;
  }
}

// Over 200 steps of batch 8 (2 epochs of 800 images) the two rungs still agree in FP32:
// per-epoch losses within 1 % and accuracies within a point.
TEST(LadderGpu, FusedFollowsTheLibraryOverHundredsOfSteps) {
  MF_SKIP_WITHOUT_GPU();
  const auto h = train_rungs({KernelRung::kLibrary, KernelRung::kFused}, DType::kF32, true, 800, 2, 8);
  ASSERT_EQ(h[1].epochs.size(), 2u);
  EXPECT_EQ(h[1].epochs[0].steps, 100);
  EXPECT_LT(h[1].epochs[1].loss, 0.8 * h[1].epochs[0].loss);
  for (std::size_t e = 0; e < 2; ++e) {
    EXPECT_NEAR(h[1].epochs[e].loss, h[0].epochs[e].loss, 1e-2 * h[0].epochs[e].loss) << "epoch " << e;
    EXPECT_NEAR(h[1].epochs[e].accuracy, h[0].epochs[e].accuracy, 0.01) << "epoch " << e;
  }
}

TEST(LadderGpu, FusedLearnsFp16AndGivesTheSameBitsTwice) {
  MF_SKIP_WITHOUT_GPU();
  // 280 images of batch 16: 17 full steps an epoch (a graph of 16 steps and one of 1) and a
  // partial batch of 8; the second run steps one by one (it reports progress at every step).
  std::vector<std::vector<float>> w;
  const auto h = train_rungs({KernelRung::kFused, KernelRung::kFused}, DType::kF16, true, 280, 2, 16, &w, true);
  EXPECT_LT(h[0].epochs[1].loss, 0.9 * h[0].epochs[0].loss);
  EXPECT_EQ(h[0].epochs[1].loss, h[1].epochs[1].loss);
  EXPECT_EQ(w[0], w[1]);
}

// Without fma_math_only (train_mnist's setting) the fused step runs conv2's forward on
// Tensor Cores, TF32 in FP32 and half in FP16 (fused_conv_tc.cu), and still learns what the
// library rung does: 96 images, 2 epochs of 6 steps of 16, per-epoch losses within 2 %
// relative of the library rung's (TF32 rounds each product's inputs to 11 bits; the library
// rung's emulated cuDNN computes its TF32 exactly). The weights differ from the fused step's
// with exact arithmetic, so the Tensor Cores did run (FusedGpu.Conv2OnTensorCores* test the
// kernel itself, its same bits at every launch included).
TEST(LadderGpu, FusedOnTensorCoresTrainsAsTheLibraryDoes) {
  MF_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kF32, DType::kF16}) {
    SCOPED_TRACE(dtype == DType::kF16 ? "f16" : "f32");
    std::vector<std::vector<float>> w, w_exact;
    const auto h = train_rungs({KernelRung::kLibrary, KernelRung::kFused}, dtype, true, 96, 2, 16, &w, false, false);
    train_rungs({KernelRung::kFused}, dtype, true, 96, 2, 16, &w_exact, false, true);
    EXPECT_LT(h[1].epochs[1].loss, 0.9 * h[1].epochs[0].loss);
    for (std::size_t e = 0; e < 2; ++e)
      EXPECT_NEAR(h[1].epochs[e].loss, h[0].epochs[e].loss, 2e-2 * h[0].epochs[e].loss) << "epoch " << e;
    EXPECT_NE(w[1], w_exact[0]);
  }
}

// The fused step reads the batch from the resident data set: another pipeline is refused in
// one line, and so is a model it does not implement.
TEST(LadderGpu, FusedRefusesOtherPipelinesAndModels) {
  MF_SKIP_WITHOUT_GPU();
  mf::KernelOptions k;
  k.rung = KernelRung::kFused;
  const mf::data::Dataset train = mf::testing::synthetic(40, 30);
  {
    mf::Rng rng(31);
    mf::Sequential m = mf::Sequential::mnist_cnn(rng);
    m.set_kernel_options(k);
    m.to(Device::kGpu);
    m.compile(std::make_unique<mf::Adam>());
    mf::FitOptions o;
    o.epochs = 1;
    o.pipeline = mf::Pipeline::kPrefetch;
    try {
      m.fit(train, nullptr, o);
      FAIL() << "the fused step ran on the prefetch pipeline";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("use --pipeline resident"), std::string::npos) << e.what();
    }
  }
  mf::Rng rng(32);
  mf::Sequential m;
  m.add(std::make_unique<mf::Flatten>());
  m.add(std::make_unique<mf::Dense>(784, 10, Activation::kNone, rng));
  m.set_input_shape(mf::Shape{28, 28, 1});
  m.set_kernel_options(k);
  m.to(Device::kGpu);
  m.compile(std::make_unique<mf::Adam>());
  try {
    m.fit(train, nullptr, mf::FitOptions{});
    FAIL() << "the fused step ran a model of two layers";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("runs the article's model only"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
}

}  // namespace
