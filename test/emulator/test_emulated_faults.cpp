// test_emulated_faults.cpp: how the GPU training loop meets a refusal from CUDA that a real
// GPU gives too rarely to test there. Runs only on the CPU emulation of CUDA, which can be
// told to refuse (streams.h).
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

std::vector<double> trained_weights(bool use_graph, const mf::data::Dataset& train, std::string* info) {
  mf::Rng rng(3);
  Sequential m = Sequential::mnist_cnn(rng);
  m.to(mf::Device::kGpu);
  m.compile(std::make_unique<mf::Adam>());
  mf::FitOptions o;
  o.epochs = 1;
  o.use_graph = use_graph;
  m.fit(train, nullptr, o);
  *info = m.gpu_training_info();
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

}  // namespace
