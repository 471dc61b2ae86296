// test_emulated_faults.cpp: how the GPU training loop meets a refusal from CUDA that a real
// GPU gives too rarely to test there, and the faults the emulation itself reports where a GPU
// would go wrong silently. Runs only on the CPU emulation of CUDA, which can be told to
// refuse (streams.h).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/mnist.h"
#include "layers/sequential.h"
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
  mf::testing::ConvOptionsScope keep;
  mf::conv_options().deterministic = deterministic;
  mf::Rng rng(3);
  Sequential m = Sequential::mnist_cnn(rng);
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
