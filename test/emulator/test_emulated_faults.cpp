// test_emulated_faults.cpp: how the GPU training loop meets a refusal from CUDA that a real
// GPU gives too rarely to test there, and the faults the emulation itself reports where a GPU
// would go wrong silently. Runs only on the CPU emulation of CUDA, which can be told to
// refuse (streams.h).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "data/mnist.h"
#include "train/sequential.h"
#include "optim/adam.h"
#include "tensor/rng.h"
#include "test/emulator/streams.h"
#include "test/test_util.h"

namespace {

using mf::Sequential;

mf::data::Dataset noise_images(std::int64_t count, std::uint64_t seed) {
  mf::data::Dataset d;
  d.count = count, d.rows = 28, d.cols = 28;
  d.images.resize(static_cast<std::size_t>(count * 28 * 28));
  d.labels.resize(static_cast<std::size_t>(count));
  mf::Rng rng(seed);
  for (auto& p : d.images) p = static_cast<std::uint8_t>(rng.below(256));
  for (auto& l : d.labels) l = static_cast<std::uint8_t>(rng.below(10));
  return d;
}

// One epoch from seed 3, the convolutions choosing among cuDNN's deterministic algorithms
// only when `deterministic` (the emulated cuDNN's fastest backward-filter algorithm sums
// per-image partials in a varying order, as the real ALGO_0 and ALGO_3 do with atomics).
std::vector<double> trained_weights(bool use_graph, const mf::data::Dataset& train, std::string* info,
                                    bool deterministic = true) {
  mf::KernelOptions options;
  options.deterministic = deterministic;
  mf::Rng rng(3);
  Sequential m = Sequential::mnist_cnn(rng);
  m.set_kernel_options(options);
  m.to(mf::Device::kGpu);
  m.compile(std::make_unique<mf::Adam>());
  mf::FitOptions o;
  o.epochs = 1;
  o.use_graph = use_graph;
  m.fit(train, nullptr, o);
  *info = m.gpu_training_info();
  for (const auto& layer : m.layers()) *info += "\n" + layer->gpu_config();
  std::vector<double> w;
  for (mf::Parameter* p : m.parameters())
    for (float v : p->value.to_vector()) w.push_back(v);
  return w;
}

// 200 images: three steps of 64 and one of 8. The second step of 64 is captured; its graph
// is refused at cudaGraphInstantiate, after the capture itself went well. CUDA leaves that
// error behind for the next cudaGetLastError, which is the launch check of the first kernel
// of the eager step that replaces it: the fallback must clear it, or that launch reports a
// refusal that has already been handled.
TEST(EmulatedFaults, RefusedGraphFallsBackToEagerSteps) {
  const mf::data::Dataset train = noise_images(200, 1);
  std::string eager_info, fallback_info;
  const std::vector<double> eager = trained_weights(false, train, &eager_info);
  mf::emulator::fail_next_graph_instantiate();
  std::vector<double> fallback;
  ASSERT_NO_THROW(fallback = trained_weights(true, train, &fallback_info));
  EXPECT_NE(fallback_info.find("CUDA graph capture failed"), std::string::npos) << fallback_info;
  EXPECT_NE(fallback_info.find("4 eager steps"), std::string::npos) << fallback_info;
  // The same steps in the same order: the same weights, to the last bit.
  EXPECT_EQ(fallback, eager);
}

// --deterministic: without it the emulated cuDNN picks its fastest backward-filter
// algorithm, whose sum over the batch starts at a different image at every call, so two
// runs of one seed part in the low bits; with it, the same bits, and the plan says so.
TEST(EmulatedFaults, OnlyDeterministicAlgorithmsGiveTheSameBitsAtEveryRun) {
  const mf::data::Dataset train = noise_images(200, 2);
  std::string info_a, info_b;
  const std::vector<double> fast_a = trained_weights(false, train, &info_a, false);
  const std::vector<double> fast_b = trained_weights(false, train, &info_b, false);
  EXPECT_EQ(info_a.find("deterministic"), std::string::npos) << info_a;
  EXPECT_NE(info_a.find("bwd-filter ALGO_3"), std::string::npos) << info_a;
  EXPECT_NE(fast_a, fast_b) << "the non-deterministic algorithm gave the same bits twice";
  const std::vector<double> det_a = trained_weights(false, train, &info_a, true);
  const std::vector<double> det_b = trained_weights(false, train, &info_b, true);
  EXPECT_NE(info_a.find(", deterministic"), std::string::npos) << info_a;
  EXPECT_EQ(info_a.find("bwd-filter ALGO_3"), std::string::npos) << info_a;
  EXPECT_EQ(det_a, det_b);
}

// cuDNN may offer no f16 algorithm for a convolution: its documentation promises Tensor
// Cores for f16 only with channel counts that are multiples of 8, and the first layer has
// one input channel. MF_EMULATED_CUDNN_F16_CHANNELS=8 makes the emulated cuDNN refuse
// those (fake_cudnn.cpp, refused_half): conv2d (1 -> 32 channels) must then run its
// convolutions in f32 with one line saying so, conv2d_1 (32 -> 64) stays f16, and FP16
// training goes on, its graphs included, to the losses it reaches when nothing is refused.
TEST(EmulatedFaults, Fp16ConvolutionsWithoutAnF16AlgorithmRunInF32) {
  const mf::data::Dataset train = noise_images(136, 4);  // two steps of 64, one of 8
  const auto run = [&](bool refuse, std::string* info, std::string* err) {
    if (refuse) ::setenv("MF_EMULATED_CUDNN_F16_CHANNELS", "8", 1);
    mf::Rng rng(5);
    Sequential m = Sequential::mnist_cnn(rng);
    m.to(mf::Device::kGpu);
    m.set_compute_dtype(mf::DType::kF16);
    m.compile(std::make_unique<mf::Adam>());
    mf::FitOptions o;
    o.epochs = 2;
    o.use_graph = true;
    ::testing::internal::CaptureStderr();
    mf::History h;
    try {
      h = m.fit(train, nullptr, o);
    } catch (...) {
      *err = ::testing::internal::GetCapturedStderr();
      ::unsetenv("MF_EMULATED_CUDNN_F16_CHANNELS");
      throw;
    }
    *err = ::testing::internal::GetCapturedStderr();
    ::unsetenv("MF_EMULATED_CUDNN_F16_CHANNELS");
    *info = m.gpu_training_info();
    for (const auto& layer : m.layers()) *info += "\n" + layer->gpu_config();
    return h;
  };
  std::string info, err, plain_info, plain_err;
  mf::History refused, plain;
  ASSERT_NO_THROW(refused = run(true, &info, &err)) << err;
  ASSERT_NO_THROW(plain = run(false, &plain_info, &plain_err)) << plain_err;
  const std::string note = "microflow: note: cuDNN offers no f16 forward algorithm for Conv2D 'conv2d', input f16 (64, 28, 28, 1)";
  EXPECT_NE(err.find(note), std::string::npos) << err;
  EXPECT_EQ(err.find("microflow: note:"), err.rfind("microflow: note:")) << "one line, not one per call:\n" << err;
  EXPECT_EQ(plain_err.find("microflow: note:"), std::string::npos) << plain_err;
  // conv2d: forward and filter gradient in f32 (it computes no input gradient); conv2d_1 f16.
  const std::size_t first = info.find("cuDNN NHWC f16: fwd "), second = info.find("cuDNN NHWC f16: fwd ", first + 1);
  ASSERT_NE(second, std::string::npos) << info;
  const std::string conv1 = info.substr(first, info.find('\n', first) - first);
  const std::string conv2 = info.substr(second, info.find('\n', second) - second);
  EXPECT_NE(conv1.find(") [f32: no f16 algorithm], bwd-filter "), std::string::npos) << conv1;
  EXPECT_EQ(conv1.find("bwd-data"), std::string::npos) << conv1;
  EXPECT_NE(conv1.find("[f32: no f16 algorithm]", conv1.find("bwd-filter ")), std::string::npos) << conv1;
  EXPECT_EQ(conv2.find("f32: no f16"), std::string::npos) << conv2;
  EXPECT_EQ(plain_info.find("f32: no f16"), std::string::npos) << plain_info;
  EXPECT_NE(info.find(" replays"), std::string::npos) << info;
  EXPECT_EQ(info.find(" 0 replays"), std::string::npos) << "the steps ran as graphs:\n" << info;
  ASSERT_EQ(refused.epochs.size(), 2u);
  for (std::size_t e = 0; e < 2; ++e) {
    SCOPED_TRACE("epoch " + std::to_string(e + 1));
    // The first layer's convolutions in f32 instead of f16: the same training, rounded
    // differently (f16 keeps 11 bits); 1 % is far above that, far below a broken gradient.
    EXPECT_TRUE(std::isfinite(refused.epochs[e].loss));
    EXPECT_NEAR(refused.epochs[e].loss, plain.epochs[e].loss, 1e-2 * plain.epochs[e].loss);
    EXPECT_EQ(refused.epochs[e].skipped_steps, plain.epochs[e].skipped_steps);
  }
}

// A GEMM operand that runs past its allocation (a leading dimension or a size too large,
// operands swapped) or lies in host memory: cuBLAS does not check, and on a GPU its kernel
// reads or writes there anyway (another tensor's data, garbage, or a fault). The emulation
// refuses the call, so a layer that gets a leading dimension wrong fails in the emulated
// tests too; it read and wrote past the buffer there and returned success.
TEST(EmulatedFaults, GemmOperandsMustLieInsideTheirDeviceAllocations) {
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  // C (4 x 2) = A (4 x 3) B (3 x 2), column-major f32.
  void *a = nullptr, *b = nullptr, *c = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 12 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, 6 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&c, 8 * sizeof(float)), cudaSuccess);
  std::vector<float> host(16, 0.0f);
  const float one = 1.0f, zero = 0.0f;
  const auto gemm = [&](const void* pa, int lda, const void* pb, int ldb, void* pc) {
    return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 2, 3, &one, pa, CUDA_R_32F, lda, pb, CUDA_R_32F, ldb, &zero,
                        pc, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  EXPECT_EQ(gemm(a, 4, b, 3, c), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(gemm(a, 5, b, 3, c), CUBLAS_STATUS_EXECUTION_FAILED) << "A read as 14 floats of 12";
  EXPECT_EQ(gemm(a, 4, b, 4, c), CUBLAS_STATUS_EXECUTION_FAILED) << "B read as 7 floats of 6";
  EXPECT_EQ(gemm(a, 4, host.data(), 3, c), CUBLAS_STATUS_EXECUTION_FAILED) << "B in host memory";
  EXPECT_EQ(gemm(a, 4, b, 3, host.data()), CUBLAS_STATUS_EXECUTION_FAILED) << "C in host memory";
  EXPECT_EQ(host, std::vector<float>(16, 0.0f)) << "a refused GEMM writes nothing";
  EXPECT_EQ(cudaFree(a), cudaSuccess);
  EXPECT_EQ(cudaFree(b), cudaSuccess);
  EXPECT_EQ(cudaFree(c), cudaSuccess);
  EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
}

// The same for cuDNN: a convolution whose tensor descriptor describes more than its buffer
// holds, or whose buffer is host memory, is refused rather than computed past the buffer.
TEST(EmulatedFaults, ConvolutionOperandsMustLieInsideTheirDeviceAllocations) {
  cudnnHandle_t h = nullptr;
  ASSERT_EQ(cudnnCreate(&h), CUDNN_STATUS_SUCCESS);
  cudnnTensorDescriptor_t xd = nullptr, yd = nullptr;
  cudnnFilterDescriptor_t wd = nullptr;
  cudnnConvolutionDescriptor_t cd = nullptr;
  ASSERT_EQ(cudnnCreateTensorDescriptor(&xd), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnCreateTensorDescriptor(&yd), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnCreateFilterDescriptor(&wd), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnCreateConvolutionDescriptor(&cd), CUDNN_STATUS_SUCCESS);
  // x (2, 5, 5, 1) NHWC, w (1, 1, 3, 3), y (2, 3, 3, 1): 50, 9 and 18 floats.
  ASSERT_EQ(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 2, 1, 5, 5), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 2, 1, 3, 3), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, 1, 1, 3, 3), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetConvolution2dDescriptor(cd, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            CUDNN_STATUS_SUCCESS);
  void *x = nullptr, *one_image = nullptr, *w = nullptr, *y = nullptr;
  ASSERT_EQ(cudaMalloc(&x, 50 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&one_image, 25 * sizeof(float)), cudaSuccess);  // half of what xd describes
  ASSERT_EQ(cudaMalloc(&w, 9 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&y, 18 * sizeof(float)), cudaSuccess);
  std::vector<float> host_w(9, 0.0f);
  const float one = 1.0f, zero = 0.0f;
  // IMPLICIT_GEMM: no workspace.
  const auto forward = [&](const void* px, const void* pw, void* py) {
    return cudnnConvolutionForward(h, &one, xd, px, wd, pw, cd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0,
                                   &zero, yd, py);
  };
  EXPECT_EQ(forward(x, w, y), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(forward(one_image, w, y), CUDNN_STATUS_EXECUTION_FAILED) << "x of 50 floats in a buffer of 25";
  EXPECT_EQ(forward(x, host_w.data(), y), CUDNN_STATUS_EXECUTION_FAILED) << "w in host memory";
  EXPECT_EQ(cudnnConvolutionBackwardFilter(h, &one, xd, x, yd, y, cd, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, nullptr, 0,
                                           &one, wd, host_w.data()),
            CUDNN_STATUS_EXECUTION_FAILED)
      << "dw in host memory";
  EXPECT_EQ(host_w, std::vector<float>(9, 0.0f)) << "a refused convolution writes nothing";
  for (void* p : {x, one_image, w, y}) EXPECT_EQ(cudaFree(p), cudaSuccess);
  cudnnDestroyConvolutionDescriptor(cd);
  cudnnDestroyFilterDescriptor(wd);
  cudnnDestroyTensorDescriptor(yd);
  cudnnDestroyTensorDescriptor(xd);
  EXPECT_EQ(cudnnDestroy(h), CUDNN_STATUS_SUCCESS);
}

}  // namespace
