// test_layers_gpu.cpp: every layer's GPU path against its CPU path on the same weights and
// inputs: forward, input gradient, and parameter gradients (which must accumulate), in FP32
// and in FP16; device tensors' copies between views; the layers' and the loss's checks. Each layer is built on the CPU, run there, then moved with to(kGpu) and run
// again. Skipped where there is no GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/gpu_runtime.h"
#include "layers/conv2d.h"
#include "kernels/kernel_options.h"
#include "layers/dense.h"
#include "layers/maxpool2d.h"
#include "train/sequential.h"
#include "layers/softmax_xent.h"
#include "tensor/half.h"
#include "tensor/rng.h"
#include "test/test_util.h"

namespace {

using mf::Activation;
using mf::Device;
using mf::DType;
using mf::Shape;
using mf::Tensor;
using mf::testing::all_close;
using mf::testing::nmse;
using mf::testing::Tol;
using mf::testing::uniform;

// ---- tolerances ----------------------------------------------------------------------------
// FP32 (FMA math only, so no TF32): the GPU sums the same float products as the CPU in another
// order. Forward outputs and input gradients are sums of k*k*C (conv, up to 288) or `in`
// (dense, up to 1600) products of size <= 1 with |sum| ~ 1: ordinary summation differs by
// ~1e-6. cuDNN may also time an FFT or Winograd algorithm fastest, whose error is ~1e-6 of the
// largest value rather than of each term, so the conv absolute part is 5e-5.
constexpr Tol kFp32DenseTol{1e-5, 1e-4};
constexpr Tol kFp32ConvTol{5e-5, 1e-4};
// Weight and bias gradients reduce over N*OH*OW output pixels (up to 2*26*26 = 1352 terms):
// test_util's fp32_reduction_tol, as in the CPU tests.
constexpr double kFp32Nmse = 1e-10;  // relative RMS error 1e-5 (STYLE.md's FP32 default)

// FP16: inputs, weights, biases and dy are exact half values on both sides, and products of
// two halves are exact in f32, which both accumulate in. What differs is rounding results to
// f16 (2^-11 = 4.9e-4 relative each time): cuDNN's or cuBLAS's output, then bias + ReLU,
// and for gradients the f16 sum into the accumulated gradient. Two or three such roundings
// of values up to ~20 (weight gradients) stay well inside 1e-2 + 1e-2 |ref|; a wrong term
// (~0.3) does not.
constexpr Tol kFp16Tol{1e-2, 1e-2};
constexpr double kFp16Nmse = 1e-5;

// Where the reference pre-activation is this close to ReLU's kink, dy is set to zero, so that
// the GPU's rounding (1e-6 in FP32, ~1e-3 of |z| in FP16) cannot flip the ReLU mask there and
// route a gradient the CPU did not (STYLE.md: keep inputs off ReLU's 0).
constexpr float kFp32Kink = 1e-4f, kFp16Kink = 0.02f;

// The layers' options in these tests: FMA-only math (cuDNN and cuBLAS would otherwise be
// free to use TF32 for FP32) and cuDNN's timing search, the production setting.
mf::KernelOptions fp32_options(bool find = true) {
  mf::KernelOptions k;
  k.fma_math_only = true;
  k.find = find;
  return k;
}

// Device results to the host. Tensor::to() copies on the compute stream, after the layers'
// work, and waits for it; the explicit synchronise only makes the order plain to read.
Tensor to_host(const Tensor& t) {
  mf::gpu_stream_synchronize(mf::compute_stream());
  return t.to(Device::kCpu);
}
Tensor to_gpu(const Tensor& host_f32, DType dtype) {
  return (dtype == DType::kF16 ? host_f32.to(DType::kF16) : host_f32).to(Device::kGpu);
}
using mf::testing::round_to_half;
std::vector<double> times(const Tensor& t, double k) {
  std::vector<double> v = mf::testing::to_double(t);
  for (double& e : v) e *= k;
  return v;
}
// dy with zeros where the pre-activation z is within `kink` of zero.
void keep_off_kink(Tensor& dy, const Tensor& z, float kink) {
  float* d = dy.data<float>();
  const float* zp = z.data<float>();
  for (std::int64_t i = 0; i < dy.numel(); ++i)
    if (std::fabs(zp[i]) < kink) d[i] = 0.0f;
}

struct Tols {
  Tol out, dx, grad;
  double nmse;
};

// The CPU results a GPU layer is compared with.
struct Reference {
  Tensor y, dx, dw, db;
};

void expect_grads(mf::Parameter& w, mf::Parameter& b, const Reference& ref, const Tols& tol, double factor,
                  const std::string& what) {
  SCOPED_TRACE(what);
  const Tensor dw = to_host(w.grad), db = to_host(b.grad);
  const Tol grad2{tol.grad.atol * factor, tol.grad.rtol};
  EXPECT_TRUE(all_close(dw, times(ref.dw, factor), grad2));
  EXPECT_LE(nmse(dw, times(ref.dw, factor)), tol.nmse);
  EXPECT_TRUE(all_close(db, times(ref.db, factor), grad2));
  EXPECT_LE(nmse(db, times(ref.db, factor)), tol.nmse);
}

// ---- Conv2D --------------------------------------------------------------------------------

struct ConvCase {
  std::int64_t n, h, w, c, filters;
  bool relu;
};

void check_conv(const ConvCase& cc, DType dtype, std::uint64_t seed) {
  const bool half = dtype == DType::kF16;
  SCOPED_TRACE(std::string("Conv2D ") + mf::dtype_name(dtype) + " N=" + std::to_string(cc.n) + " " +
               std::to_string(cc.h) + "x" + std::to_string(cc.w) + " C=" + std::to_string(cc.c) +
               " K=" + std::to_string(cc.filters) + (cc.relu ? " relu" : " linear"));
  constexpr std::int64_t k = 3;
  mf::Rng rng(seed);
  mf::Conv2D conv(cc.c, cc.filters, k, cc.relu ? Activation::kRelu : Activation::kNone, rng);
  conv.set_kernel_options(fp32_options());
  conv.bias().value.copy_from(uniform({cc.filters}, -0.3f, 0.3f, rng));  // a bias to add (and cut below)
  Tensor x = uniform({cc.n, cc.h, cc.w, cc.c}, -1, 1, rng);
  Tensor dy = uniform({cc.n, cc.h - k + 1, cc.w - k + 1, cc.filters}, -1, 1, rng);
  if (half)  // FP16 compares against the CPU on the very values the GPU sees
    for (Tensor* t : {&conv.weight().value, &conv.bias().value, &x, &dy}) round_to_half(*t);
  if (cc.relu) {
    mf::Conv2D linear(cc.c, cc.filters, k, Activation::kNone, rng);
    linear.weight().value.copy_from(conv.weight().value);
    linear.bias().value.copy_from(conv.bias().value);
    keep_off_kink(dy, linear.forward(x), half ? kFp16Kink : kFp32Kink);
  }
  const std::int64_t terms = cc.n * dy.dim(1) * dy.dim(2);
  const Tols tol = half ? Tols{kFp16Tol, kFp16Tol, kFp16Tol, kFp16Nmse}
                        : Tols{kFp32ConvTol, kFp32ConvTol, mf::testing::fp32_reduction_tol(terms), kFp32Nmse};

  Reference ref;
  ref.y = conv.forward(x).clone();
  ref.dx = conv.backward(dy).clone();
  ref.dw = conv.weight().grad.clone();
  ref.db = conv.bias().grad.clone();
  conv.weight().grad.fill_zero();
  conv.bias().grad.fill_zero();

  conv.to(Device::kGpu);
  if (half) conv.set_compute_dtype(DType::kF16);
  // One input channel is the model's first layer, which never computes dx; in FP16 it is
  // tested as the model uses it (cuDNN need not offer an FP16 NHWC data-gradient algorithm
  // for one channel). The FP32 cases check that pass for one channel too.
  const bool with_dx = !(half && cc.c == 1);
  if (!with_dx) conv.set_needs_input_grad(false);
  const Tensor xg = to_gpu(x, dtype), dyg = to_gpu(dy, dtype);
  const Tensor y = to_host(conv.forward(xg));
  EXPECT_EQ(y.dtype(), dtype);
  EXPECT_TRUE(all_close(y, ref.y, tol.out)) << conv.gpu_config();
  const auto check_dx = [&](const Tensor& dx) {
    if (with_dx) EXPECT_TRUE(all_close(to_host(dx), ref.dx, tol.dx));
    else EXPECT_FALSE(dx.defined());
  };
  const Tensor dx1 = conv.backward(dyg);
  SCOPED_TRACE(conv.gpu_config());  // a failure below names the algorithms cuDNN ran
  check_dx(dx1);
  expect_grads(conv.weight(), conv.bias(), ref, tol, 1.0, "after one backward");
  // A second backward of the same forward: dx is overwritten, the gradients accumulate.
  check_dx(conv.backward(dyg));
  expect_grads(conv.weight(), conv.bias(), ref, tol, 2.0, "after two backwards (accumulated)");
  const std::string config = conv.gpu_config();
  EXPECT_NE(config.find("fwd"), std::string::npos) << config;
  EXPECT_NE(config.find("bwd-filter"), std::string::npos) << config;
  EXPECT_EQ(config.find("bwd-data") != std::string::npos, with_dx) << config;
  EXPECT_NE(config.find(mf::dtype_name(dtype)), std::string::npos) << config;
}

TEST(LayerGpu, Conv2dFp32OneChannelOddSize) {
  MF_SKIP_WITHOUT_GPU();
  check_conv({4, 13, 11, 1, 8, true}, DType::kF32, 1);
}
TEST(LayerGpu, Conv2dFp32ManyChannelsOddSizeLinear) {
  MF_SKIP_WITHOUT_GPU();
  check_conv({3, 13, 11, 32, 16, false}, DType::kF32, 2);
}
TEST(LayerGpu, Conv2dFp32ModelShapes) {
  MF_SKIP_WITHOUT_GPU();
  check_conv({2, 28, 28, 1, 32, true}, DType::kF32, 3);
  check_conv({3, 13, 13, 32, 64, true}, DType::kF32, 4);
}
TEST(LayerGpu, Conv2dFp16OneChannelOddSize) {
  MF_SKIP_WITHOUT_GPU();
  check_conv({4, 13, 11, 1, 8, true}, DType::kF16, 5);
}
TEST(LayerGpu, Conv2dFp16ManyChannelsOddSizeLinear) {
  MF_SKIP_WITHOUT_GPU();
  check_conv({3, 13, 11, 32, 16, false}, DType::kF16, 6);
}
TEST(LayerGpu, Conv2dFp16ModelShapes) {
  MF_SKIP_WITHOUT_GPU();
  check_conv({2, 28, 28, 1, 32, true}, DType::kF16, 7);
  check_conv({3, 13, 13, 32, 64, true}, DType::kF16, 8);
}

TEST(LayerGpu, Conv2dHeuristicAlgorithmsFp32) {  // KernelOptions::find = false: cudnnGet*_v7
  MF_SKIP_WITHOUT_GPU();
  mf::Rng rng(9);
  mf::Conv2D conv(32, 16, 3, Activation::kNone, rng);
  conv.set_kernel_options(fp32_options(/*find=*/false));
  const Tensor x = uniform({3, 13, 11, 32}, -1, 1, rng);
  const Tensor y_ref = conv.forward(x).clone();
  conv.to(Device::kGpu);
  EXPECT_TRUE(all_close(to_host(conv.forward(x.to(Device::kGpu))), y_ref, kFp32ConvTol));
  EXPECT_NE(conv.gpu_config().find("heuristic"), std::string::npos) << conv.gpu_config();
}

TEST(LayerGpu, Conv2dWithoutInputGradientFp32) {  // the model's first layer: no dx, no bwd-data
  MF_SKIP_WITHOUT_GPU();
  mf::Rng rng(10);
  mf::Conv2D conv(1, 32, 3, Activation::kNone, rng);
  conv.set_kernel_options(fp32_options());
  conv.set_needs_input_grad(false);
  const Tensor x = uniform({2, 28, 28, 1}, 0, 1, rng), dy = uniform({2, 26, 26, 32}, -1, 1, rng);
  conv.forward(x);
  EXPECT_FALSE(conv.backward(dy).defined());
  Reference ref;
  ref.dw = conv.weight().grad.clone();
  ref.db = conv.bias().grad.clone();
  conv.weight().grad.fill_zero();
  conv.bias().grad.fill_zero();
  conv.to(Device::kGpu);
  conv.forward(x.to(Device::kGpu));
  EXPECT_FALSE(conv.backward(dy.to(Device::kGpu)).defined());
  expect_grads(conv.weight(), conv.bias(), ref, {kFp32ConvTol, kFp32ConvTol, mf::testing::fp32_reduction_tol(2 * 26 * 26), kFp32Nmse},
               1.0, "no input gradient");
  EXPECT_EQ(conv.gpu_config().find("bwd-data"), std::string::npos) << conv.gpu_config();
}

TEST(LayerGpu, Conv2dEachBatchSizeGetsItsOwnAlgorithmsFp32) {  // the partial last batch
  MF_SKIP_WITHOUT_GPU();
  mf::Rng rng(11);
  mf::Conv2D conv(8, 16, 3, Activation::kRelu, rng);
  conv.set_kernel_options(fp32_options());
  const Tensor x4 = uniform({4, 12, 12, 8}, -1, 1, rng), x3 = uniform({3, 12, 12, 8}, -1, 1, rng);
  const Tensor y4 = conv.forward(x4).clone(), y3 = conv.forward(x3).clone();
  conv.to(Device::kGpu);
  EXPECT_TRUE(all_close(to_host(conv.forward(x4.to(Device::kGpu))), y4, kFp32ConvTol));
  EXPECT_TRUE(all_close(to_host(conv.forward(x3.to(Device::kGpu))), y3, kFp32ConvTol));
  EXPECT_TRUE(all_close(to_host(conv.forward(x4.to(Device::kGpu))), y4, kFp32ConvTol));  // the first plan again
  EXPECT_NE(conv.gpu_config().find("other shapes"), std::string::npos) << conv.gpu_config();
}

// ---- MaxPool2D -----------------------------------------------------------------------------
// Selection moves values without arithmetic, so GPU and CPU agree exactly (both take the
// first position on ties, which f16 inputs make more likely), in both precisions.

void check_maxpool(std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c, DType dtype, std::uint64_t seed) {
  SCOPED_TRACE(std::string("MaxPool2D ") + mf::dtype_name(dtype) + " " + std::to_string(n) + "x" +
               std::to_string(h) + "x" + std::to_string(w) + "x" + std::to_string(c));
  mf::Rng rng(seed);
  mf::MaxPool2D pool;
  Tensor x = uniform({n, h, w, c}, -1, 1, rng);
  Tensor dy = uniform({n, h / 2, w / 2, c}, -1, 1, rng);
  if (dtype == DType::kF16) {
    round_to_half(x);
    round_to_half(dy);
  }
  const Tensor y_ref = pool.forward(x).clone();
  const Tensor dx_ref = pool.backward(dy).clone();
  pool.to(Device::kGpu);
  if (dtype == DType::kF16) pool.set_compute_dtype(DType::kF16);
  const Tensor dyg = to_gpu(dy, dtype);
  EXPECT_TRUE(all_close(to_host(pool.forward(to_gpu(x, dtype))), y_ref, Tol{0, 0}));
  EXPECT_TRUE(all_close(to_host(pool.backward(dyg)), dx_ref, Tol{0, 0}));  // zero on a dropped odd row/column
}

TEST(LayerGpu, MaxPoolOddSizesExact) {
  MF_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kF32, DType::kF16}) {
    check_maxpool(3, 13, 11, 8, dt, 20);
    check_maxpool(2, 7, 9, 1, dt, 21);
    check_maxpool(1, 2, 3, 5, dt, 22);
  }
}
TEST(LayerGpu, MaxPoolModelShapesExact) {
  MF_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kF32, DType::kF16}) {
    check_maxpool(4, 26, 26, 32, dt, 23);
    check_maxpool(4, 11, 11, 64, dt, 24);
  }
}

// NaN wins its window on the GPU as on the CPU (the first NaN, whatever its place), in both
// precisions, with channel counts the kernel takes as whole vectors (48; 12 in FP32) and
// one at a time (11; 12 in FP16).
TEST(LayerGpu, MaxPoolNanWinsItsWindowAsOnTheCpu) {
  MF_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kF32, DType::kF16})
    for (const std::int64_t c : {48, 12, 11}) {
      SCOPED_TRACE(std::string(mf::dtype_name(dt)) + ", " + std::to_string(c) + " channels");
      const Tensor x = mf::testing::maxpool_nan_windows(c);
      const Tensor dy = mf::testing::window_gradients(c);
      mf::MaxPool2D pool;
      pool.to(Device::kGpu);
      if (dt == DType::kF16) pool.set_compute_dtype(DType::kF16);
      EXPECT_TRUE(mf::testing::same_or_both_nan(to_host(pool.forward(to_gpu(x, dt))), mf::testing::maxpool_forward_ref(x)));
      EXPECT_TRUE(all_close(to_host(pool.backward(to_gpu(dy, dt))), mf::testing::maxpool_backward_ref(x, dy), Tol{0, 0}));
    }
}

TEST(LayerGpu, MaxPoolInferenceLeavesTheTrainingBuffersAloneFp32) {
  MF_SKIP_WITHOUT_GPU();
  mf::Rng rng(25);
  mf::MaxPool2D pool;
  const Tensor x = uniform({2, 6, 6, 4}, -1, 1, rng), big = uniform({9, 6, 6, 4}, -1, 1, rng);
  const Tensor dy = uniform({2, 3, 3, 4}, -1, 1, rng);
  const Tensor y_ref = pool.forward(x).clone(), dx_ref = pool.backward(dy).clone();
  pool.set_training(false);
  const Tensor big_ref = pool.forward(big).clone();
  pool.set_training(true);
  pool.to(Device::kGpu);
  const Tensor xg = x.to(Device::kGpu), dyg = dy.to(Device::kGpu), bigg = big.to(Device::kGpu);
  EXPECT_TRUE(all_close(to_host(pool.forward(xg)), y_ref, Tol{0, 0}));
  EXPECT_TRUE(all_close(to_host(pool.backward(dyg)), dx_ref, Tol{0, 0}));
  pool.set_training(false);  // a larger inference batch in between (a validation pass)
  EXPECT_TRUE(all_close(to_host(pool.forward(bigg)), big_ref, Tol{0, 0}));
  pool.set_training(true);
  EXPECT_TRUE(all_close(to_host(pool.forward(xg)), y_ref, Tol{0, 0}));
  EXPECT_TRUE(all_close(to_host(pool.backward(dyg)), dx_ref, Tol{0, 0}));
}

// ---- ReLU's non-finite cases -----------------------------------------------------------------

// ReLU passes NaN on and maps -inf to 0 on the GPU as on the CPU (LayerCpu.ReluPassesNan...),
// in FP32 and FP16: filters whose bias is NaN, +inf and -inf (all three exact in f16) give
// NaN, inf and 0 at every pixel, in both convolutions and the hidden dense layer of the model.
TEST(LayerGpu, ReluPassesNanAsOnTheCpu) {
  MF_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kF32, DType::kF16}) {
    SCOPED_TRACE(mf::dtype_name(dt));
    mf::Rng rng(82);
    std::vector<std::pair<std::unique_ptr<mf::Layer>, Tensor>> cases;  // layer, its input
    cases.emplace_back(std::make_unique<mf::Conv2D>(1, 32, 3, Activation::kRelu, rng),
                       uniform({3, 28, 28, 1}, 0, 1, rng));
    cases.emplace_back(std::make_unique<mf::Conv2D>(32, 64, 3, Activation::kRelu, rng),
                       uniform({3, 13, 13, 32}, 0, 1, rng));
    cases.emplace_back(std::make_unique<mf::Dense>(1600, 64, Activation::kRelu, rng), uniform({3, 1600}, 0, 1, rng));
    for (auto& [layer, x] : cases) {
      SCOPED_TRACE(layer->type());
      mf::testing::set_nonfinite_biases(layer->parameters()[1]->value);  // (kernel, bias)
      layer->set_kernel_options(fp32_options());
      layer->to(Device::kGpu);
      if (dt == DType::kF16) layer->set_compute_dtype(DType::kF16);
      EXPECT_TRUE(mf::testing::relu_of_nonfinite_biases(to_host(layer->forward(to_gpu(x, dt)))));
    }
  }
}

// ---- Dense ---------------------------------------------------------------------------------

void check_dense(std::int64_t n, std::int64_t in, std::int64_t units, bool relu, DType dtype, std::uint64_t seed) {
  const bool half = dtype == DType::kF16;
  SCOPED_TRACE(std::string("Dense ") + mf::dtype_name(dtype) + " N=" + std::to_string(n) + " " + std::to_string(in) +
               "->" + std::to_string(units) + (relu ? " relu" : " linear"));
  mf::Rng rng(seed);
  mf::Dense dense(in, units, relu ? Activation::kRelu : Activation::kNone, rng);
  dense.set_kernel_options(fp32_options());  // fma_math_only also selects CUBLAS_COMPUTE_32F_PEDANTIC
  dense.bias().value.copy_from(uniform({units}, -0.3f, 0.3f, rng));
  Tensor x = uniform({n, in}, -1, 1, rng), dy = uniform({n, units}, -1, 1, rng);
  if (half)
    for (Tensor* t : {&dense.weight().value, &dense.bias().value, &x, &dy}) round_to_half(*t);
  if (relu) {
    mf::Dense linear(in, units, Activation::kNone, rng);
    linear.weight().value.copy_from(dense.weight().value);
    linear.bias().value.copy_from(dense.bias().value);
    keep_off_kink(dy, linear.forward(x), half ? kFp16Kink : kFp32Kink);
  }
  // dW reduces over only n rows: the forward's tolerance covers it.
  const Tols tol = half ? Tols{kFp16Tol, kFp16Tol, kFp16Tol, kFp16Nmse}
                        : Tols{kFp32DenseTol, kFp32DenseTol, kFp32DenseTol, kFp32Nmse};
  Reference ref;
  ref.y = dense.forward(x).clone();
  ref.dx = dense.backward(dy).clone();
  ref.dw = dense.weight().grad.clone();
  ref.db = dense.bias().grad.clone();
  dense.weight().grad.fill_zero();
  dense.bias().grad.fill_zero();

  dense.to(Device::kGpu);
  if (half) dense.set_compute_dtype(DType::kF16);
  const Tensor xg = to_gpu(x, dtype), dyg = to_gpu(dy, dtype);
  const Tensor y = to_host(dense.forward(xg));
  EXPECT_EQ(y.dtype(), dtype);
  EXPECT_TRUE(all_close(y, ref.y, tol.out));
  EXPECT_TRUE(all_close(to_host(dense.backward(dyg)), ref.dx, tol.dx));
  expect_grads(dense.weight(), dense.bias(), ref, tol, 1.0, "after one backward");
  EXPECT_TRUE(all_close(to_host(dense.backward(dyg)), ref.dx, tol.dx));
  expect_grads(dense.weight(), dense.bias(), ref, tol, 2.0, "after two backwards (accumulated)");
  EXPECT_NE(dense.gpu_config().find("cuBLAS"), std::string::npos) << dense.gpu_config();
}

TEST(LayerGpu, DenseFp32) {
  MF_SKIP_WITHOUT_GPU();
  check_dense(7, 50, 16, true, DType::kF32, 30);
  check_dense(5, 1600, 64, true, DType::kF32, 31);  // the model's shapes
  check_dense(9, 64, 10, false, DType::kF32, 32);
  check_dense(1, 3, 5, false, DType::kF32, 33);
}
TEST(LayerGpu, DenseFp16) {
  MF_SKIP_WITHOUT_GPU();
  check_dense(7, 50, 16, true, DType::kF16, 34);
  check_dense(5, 1600, 64, true, DType::kF16, 35);
  check_dense(9, 64, 10, false, DType::kF16, 36);
  check_dense(1, 3, 5, false, DType::kF16, 37);
}

TEST(LayerGpu, DenseWithoutInputGradientFp32) {
  MF_SKIP_WITHOUT_GPU();
  mf::Rng rng(38);
  mf::Dense dense(20, 8, Activation::kNone, rng);
  dense.set_needs_input_grad(false);
  dense.to(Device::kGpu);
  dense.forward(uniform({4, 20}, -1, 1, rng).to(Device::kGpu));
  EXPECT_FALSE(dense.backward(uniform({4, 8}, -1, 1, rng).to(Device::kGpu)).defined());
}

// A batch of 0 samples gives empty results on the GPU as on the CPU (test_layers_cpu's
// EmptyBatchGivesEmptyResultsAndNoGradient), in FP32 and FP16; cuDNN refused the
// convolution's tensor descriptors with a cryptic CUDNN_STATUS_BAD_PARAM.
TEST(LayerGpu, EmptyBatchGivesEmptyResultsAndNoGradient) {
  MF_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kF32, DType::kF16}) {
    mf::Rng rng(39);
    std::vector<std::unique_ptr<mf::Layer>> layers;
    layers.push_back(std::make_unique<mf::Conv2D>(3, 8, 3, Activation::kRelu, rng));
    layers.push_back(std::make_unique<mf::MaxPool2D>());
    layers.push_back(std::make_unique<mf::Dense>(7, 10, Activation::kRelu, rng));
    const Shape inputs[] = {Shape{0, 6, 6, 3}, Shape{0, 6, 6, 3}, Shape{0, 7}};
    for (std::size_t i = 0; i < layers.size(); ++i) {
      mf::Layer& layer = *layers[i];
      SCOPED_TRACE(layer.type() + " " + mf::dtype_name(dtype));
      layer.set_kernel_options(fp32_options());
      layer.to(Device::kGpu);
      layer.set_compute_dtype(dtype);
      const Tensor& y = layer.forward(Tensor::zeros(inputs[i], dtype, Device::kGpu));
      EXPECT_EQ(y.shape(), layer.output_shape(inputs[i]));
      const Tensor& dx = layer.backward(Tensor::zeros(y.shape(), dtype, Device::kGpu));
      EXPECT_EQ(dx.shape(), inputs[i]);
      for (mf::Parameter* p : layer.parameters())
        for (float g : to_host(p->grad).to_vector()) ASSERT_EQ(g, 0.0f) << p->name;
    }
  }
}

// A layer or model computing in FP16 cannot move to the CPU, whose path is f32 only: its
// f16 gradients went along, and a fit there failed at the first backward with "tensor holds
// f16, accessed as f32".
TEST(LayerGpu, Fp16LayersAndModelsStayOnTheGpu) {
  MF_SKIP_WITHOUT_GPU();
  mf::Rng rng(40);
  mf::Dense dense(4, 2, Activation::kNone, rng);
  dense.to(Device::kGpu);
  dense.set_compute_dtype(DType::kF16);
  EXPECT_THROW(dense.to(Device::kCpu), std::invalid_argument);
  EXPECT_EQ(dense.device(), Device::kGpu);
  mf::Sequential m = mf::Sequential::mnist_cnn(rng, 12, 12);
  m.to(Device::kGpu);
  m.set_compute_dtype(DType::kF16);
  try {
    m.to(Device::kCpu);
    ADD_FAILURE() << "an FP16 model moved to the CPU";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("set_compute_dtype(f32) first"), std::string::npos) << e.what();
  }
  EXPECT_EQ(m.device(), Device::kGpu);
  m.set_compute_dtype(DType::kF32);
  m.to(Device::kCpu);  // in FP32 it may
  EXPECT_EQ(m.layers()[0]->device(), Device::kCpu);
  EXPECT_EQ(m.parameters()[0]->grad.dtype(), DType::kF32);
}

// Overlapping views of one device buffer copy as memmove would: a device copy has memcpy's
// contract (overlap is undefined; the emulation refuses it), and copy_from passed such views
// straight to cudaMemcpyAsync. A copy onto itself changes nothing.
TEST(TensorGpu, CopyBetweenOverlappingViewsIsAMove) {
  MF_SKIP_WITHOUT_GPU();
  const Tensor host = Tensor::from_vector({5, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor t = host.to(Device::kGpu);
  t.slice(1, 5).copy_from(t.slice(0, 4));  // one row down
  EXPECT_EQ(to_host(t).to_vector(), std::vector<float>({0, 1, 0, 1, 2, 3, 4, 5, 6, 7}));
  t.slice(0, 4).copy_from(t.slice(1, 5));  // and back up
  EXPECT_EQ(to_host(t).to_vector(), std::vector<float>({0, 1, 2, 3, 4, 5, 6, 7, 6, 7}));
  t.copy_from(t);
  EXPECT_EQ(to_host(t).to_vector(), std::vector<float>({0, 1, 2, 3, 4, 5, 6, 7, 6, 7}));
}

// Logits the loss cannot read are refused, naming them: the kernel read u8 or i32 logits as
// f32, past their end, into a loss of garbage with no error (the CPU refused them already).
TEST(LayerGpu, SoftmaxXentRefusesLogitsThatAreNotFloats) {
  MF_SKIP_WITHOUT_GPU();
  const Tensor labels = Tensor::zeros({2}, DType::kI32, Device::kGpu);
  Tensor stats = Tensor::zeros({mf::kNumStats}, DType::kF32, Device::kGpu);
  for (DType bad : {DType::kU8, DType::kI32}) {
    try {
      mf::softmax_xent(Tensor::zeros({2, 10}, bad, Device::kGpu), labels, stats, nullptr);
      ADD_FAILURE() << mf::dtype_name(bad) << " logits accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(mf::dtype_name(bad)) + " (2, 10) on gpu"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_NO_THROW(mf::softmax_xent(Tensor::zeros({2, 10}, DType::kF16, Device::kGpu), labels, stats, nullptr));
}

// A gradient written over the logits raced in the kernel (lanes overwrite a row while lane 0
// reads its label's logit); it is refused as on the CPU. Disjoint rows of one buffer work.
TEST(LayerGpu, SoftmaxXentRefusesAGradientOverItsLogits) {
  MF_SKIP_WITHOUT_GPU();
  const Tensor labels = mf::testing::labels_of({0, 1}).to(Device::kGpu);
  Tensor stats = Tensor::zeros({mf::kNumStats}, DType::kF32, Device::kGpu);
  Tensor both = Tensor::zeros({4, 2}, DType::kF32, Device::kGpu);
  Tensor same = both.slice(0, 2);
  EXPECT_THROW(mf::softmax_xent(both.slice(0, 2), labels, stats, &same), std::invalid_argument);
  Tensor shifted = both.slice(1, 3);
  EXPECT_THROW(mf::softmax_xent(both.slice(0, 2), labels, stats, &shifted), std::invalid_argument);
  Tensor below = both.slice(2, 4);
  mf::softmax_xent(both.slice(0, 2), labels, stats, &below);
  EXPECT_EQ(to_host(both).to_vector(), std::vector<float>({0, 0, 0, 0, -0.25f, 0.25f, 0.25f, -0.25f}));
}

}  // namespace
