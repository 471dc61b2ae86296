// test_ladder.cpp: the kernel ladder on the CPU (kernels/kernel_options.h). Every rung the
// CPU has (naive, library, tuned) runs every layer with arithmetic (Conv2D, Dense): its
// forward, weight and bias gradients and dx against the double-precision references of
// test_util; a rung the CPU lacks is a one-line error; and the three rungs train the model
// to the same per-epoch losses. The GPU's rungs: test_ladder_gpu.cpp.
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
#include "optim/adam.h"
#include "tensor/rng.h"
#include "test/channel_util.h"
#include "test/test_util.h"
#include "train/sequential.h"

namespace {

using mf::Activation;
using mf::KernelRung;
using mf::Shape;
using mf::Tensor;
using mf::testing::all_close;
using mf::testing::Tol;

// FP32 against double: a sum of at most a few hundred products of values <= 1 rounds to
// ~1e-6; the weight and bias gradients sum over every output pixel (fp32_reduction_tol).
constexpr Tol kFwdTol{1e-5, 1e-4};
constexpr Tol kDxTol{1e-5, 1e-4};

const KernelRung kCpuRungs[] = {KernelRung::kNaive, KernelRung::kLibrary, KernelRung::kTuned};

mf::KernelOptions at(KernelRung rung) {
  mf::KernelOptions k;
  k.rung = rung;
  return k;
}

struct ConvCase {
  std::int64_t n, h, w, c, filters, k;
  bool relu, input_grad;
};

// What cpu_config() says each rung ran: the rung's own code, not a neighbour's.
std::string expected_kernels(KernelRung rung) {
  return rung == KernelRung::kNaive ? "naive loops" : rung == KernelRung::kLibrary ? "im2col + Eigen" : "";
}

void check_conv(KernelRung rung, const ConvCase& cc, std::uint64_t seed) {
  SCOPED_TRACE(std::string("rung ") + mf::rung_name(rung) + " Conv2D N=" + std::to_string(cc.n) + " " +
               std::to_string(cc.h) + "x" + std::to_string(cc.w) + " C=" + std::to_string(cc.c) +
               " K=" + std::to_string(cc.filters) + " k=" + std::to_string(cc.k) + (cc.relu ? " relu" : " linear"));
  mf::Rng rng(seed);
  mf::Conv2D conv(cc.c, cc.filters, cc.k, cc.relu ? Activation::kRelu : Activation::kNone, rng);
  conv.set_kernel_options(at(rung));
  conv.set_needs_input_grad(cc.input_grad);
  EXPECT_EQ(conv.rung(), rung);
  conv.bias().value.copy_from(mf::testing::uniform({cc.filters}, -0.3f, 0.3f, rng));
  const Tensor x = mf::testing::uniform({cc.n, cc.h, cc.w, cc.c}, -1, 1, rng);
  const Tensor y = conv.forward(x).clone();
  EXPECT_TRUE(all_close(y, mf::testing::conv2d_forward_ref(x, conv.weight().value, conv.bias().value, cc.relu),
                        kFwdTol));
  const Tensor dy = mf::testing::uniform(y.shape(), -1, 1, rng);
  const Tensor dx = conv.backward(dy);
  const auto ref = mf::testing::conv2d_backward_ref(x, conv.weight().value, conv.bias().value, cc.relu, dy);
  ASSERT_EQ(dx.defined(), cc.input_grad);
  if (cc.input_grad) {
    EXPECT_TRUE(all_close(dx, ref.dx, kDxTol));
  }
  const Tol grad_tol = mf::testing::fp32_reduction_tol(cc.n * y.dim(1) * y.dim(2));
  EXPECT_TRUE(all_close(conv.weight().grad, ref.dw, grad_tol));
  EXPECT_TRUE(all_close(conv.bias().grad, ref.db, grad_tol));
  const std::string ran = conv.cpu_config();
  if (!expected_kernels(rung).empty()) {
    EXPECT_NE(ran.find(expected_kernels(rung)), std::string::npos) << ran;
  } else {
    EXPECT_EQ(ran.find("naive"), std::string::npos) << ran;
  }
}

// The model's two convolutions (the first needs no dx), a linear one of odd sizes whose
// filters are no multiple of the vector width, and a 5x5 kernel.
TEST(LadderCpu, Conv2dEveryRungMatchesTheReference) {
  for (KernelRung rung : kCpuRungs) {
    check_conv(rung, {2, 28, 28, 1, 32, 3, true, false}, 1);
    check_conv(rung, {3, 13, 13, 32, 64, 3, true, true}, 2);
    check_conv(rung, {2, 7, 9, 3, 5, 3, false, true}, 3);
    check_conv(rung, {2, 9, 8, 4, 16, 5, true, true}, 4);
  }
}

void check_dense(KernelRung rung, std::int64_t n, std::int64_t in, std::int64_t units, bool relu, bool input_grad,
                 std::uint64_t seed) {
  SCOPED_TRACE(std::string("rung ") + mf::rung_name(rung) + " Dense N=" + std::to_string(n) + " " +
               std::to_string(in) + "->" + std::to_string(units) + (relu ? " relu" : " linear"));
  mf::Rng rng(seed);
  mf::Dense dense(in, units, relu ? Activation::kRelu : Activation::kNone, rng);
  dense.set_kernel_options(at(rung));
  dense.set_needs_input_grad(input_grad);
  dense.bias().value.copy_from(mf::testing::uniform({units}, -0.3f, 0.3f, rng));
  const Tensor x = mf::testing::uniform({n, in}, -1, 1, rng);
  const Tensor y = dense.forward(x).clone();
  EXPECT_TRUE(all_close(y, mf::testing::dense_forward_ref(x, dense.weight().value, dense.bias().value, relu),
                        Tol{1e-5 * std::sqrt(static_cast<double>(in)), 1e-4}));
  const Tensor dy = mf::testing::uniform(y.shape(), -1, 1, rng);
  const Tensor dx = dense.backward(dy);
  const auto ref = mf::testing::dense_backward_ref(x, dense.weight().value, dense.bias().value, relu, dy);
  ASSERT_EQ(dx.defined(), input_grad);
  if (input_grad) {
    EXPECT_TRUE(all_close(dx, ref.dx, Tol{1e-5 * std::sqrt(static_cast<double>(units)), 1e-4}));
  }
  EXPECT_TRUE(all_close(dense.weight().grad, ref.dw, mf::testing::fp32_reduction_tol(n)));
  EXPECT_TRUE(all_close(dense.bias().grad, ref.db, mf::testing::fp32_reduction_tol(n)));
  const std::string ran = dense.cpu_config();
  if (rung == KernelRung::kNaive) {
    EXPECT_NE(ran.find("naive loops"), std::string::npos) << ran;
  } else if (rung == KernelRung::kLibrary) {
    EXPECT_EQ(ran, "fwd Eigen GEMM; bwd Eigen GEMM");
  } else if (units % 16 == 0 && in % 16 == 0) {
    EXPECT_EQ(ran, "fwd register tiles; bwd register tiles");
  }
}

// The model's two dense layers (1600 -> 64 with ReLU, 64 -> 10 linear) and odd sizes.
TEST(LadderCpu, DenseEveryRungMatchesTheReference) {
  for (KernelRung rung : kCpuRungs) {
    check_dense(rung, 5, 1600, 64, true, true, 11);
    check_dense(rung, 5, 64, 10, false, true, 12);
    check_dense(rung, 3, 7, 13, true, false, 13);
  }
}

TEST(LadderCpu, RungNamesAndDefaults) {
  KernelRung r = KernelRung::kDefault;
  for (const char* name : {"naive", "library", "tuned", "fused"}) {
    ASSERT_TRUE(mf::parse_rung(name, r)) << name;
    EXPECT_STREQ(mf::rung_name(r), name);
  }
  EXPECT_FALSE(mf::parse_rung("fast", r));
  EXPECT_EQ(mf::resolve_rung(KernelRung::kDefault, mf::Device::kCpu), KernelRung::kTuned);
  EXPECT_EQ(mf::resolve_rung(KernelRung::kDefault, mf::Device::kGpu), KernelRung::kLibrary);
  for (KernelRung rung : kCpuRungs) EXPECT_EQ(mf::rung_unavailable(rung, mf::Device::kCpu), "");
  EXPECT_EQ(mf::rung_unavailable(KernelRung::kNaive, mf::Device::kGpu), "");
  EXPECT_EQ(mf::rung_unavailable(KernelRung::kLibrary, mf::Device::kGpu), "");
  EXPECT_NE(mf::rung_unavailable(KernelRung::kTuned, mf::Device::kGpu), "");
  EXPECT_EQ(mf::rung_unavailable(KernelRung::kFused, mf::Device::kGpu), "");
}

// The CPU has no fused rung: the layer refuses it in one line that names itself and the
// rungs the CPU has, before it computes anything.
TEST(LadderCpu, RungTheCpuLacksIsAOneLineError) {
  mf::Rng rng(5);
  mf::Conv2D conv(1, 4, 3, Activation::kRelu, rng);
  conv.set_kernel_options(at(KernelRung::kFused));
  try {
    conv.forward(Tensor::zeros({1, 5, 5, 1}));
    FAIL() << "the fused rung ran on the CPU";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_NE(m.find("fused"), std::string::npos) << m;
    EXPECT_NE(m.find("naive, library and tuned"), std::string::npos) << m;
  }
}

// A model set to a rung runs every layer at it, and layers added later join it.
TEST(LadderCpu, ModelSetsEveryLayersRung) {
  mf::Rng rng(6);
  mf::Sequential m = mf::Sequential::mnist_cnn(rng);
  m.set_kernel_options(at(KernelRung::kNaive));
  EXPECT_EQ(m.rung(), KernelRung::kNaive);
  for (const auto& layer : m.layers()) EXPECT_EQ(layer->rung(), KernelRung::kNaive) << layer->label();
}

// The same model trained from one seed on each rung: each learns (the loss falls well below
// chance's ln 10 = 2.30), and their per-epoch losses agree within 1e-3 relative. They sum the
// same products in different orders, ~1e-7 relative in a gradient; 3 epochs of 5 Adam steps
// leave that far below 1e-3, while a rung with a wrong term would part from the others at
// the first step.
TEST(LadderCpu, EveryRungTrainsToTheSameLosses) {
  const mf::data::Dataset train = mf::testing::synthetic(320, 7);
  std::vector<mf::History> h;
  for (KernelRung rung : kCpuRungs) {
    SCOPED_TRACE(mf::rung_name(rung));
    mf::Rng rng(8);
    mf::Sequential m = mf::Sequential::mnist_cnn(rng);
    m.set_kernel_options(at(rung));
    m.compile(std::make_unique<mf::Adam>());
    mf::FitOptions o;
    o.epochs = 3;
    o.batch_size = 64;
    o.seed = 9;
    h.push_back(m.fit(train, nullptr, o));
    ASSERT_EQ(h.back().epochs.size(), 3u);
    EXPECT_LT(h.back().epochs[2].loss, 0.7 * h.back().epochs[0].loss);
    EXPECT_LT(h.back().epochs[2].loss, 1.5);
  }
  for (std::size_t r = 1; r < h.size(); ++r)
    for (std::size_t e = 0; e < 3; ++e)
      EXPECT_NEAR(h[r].epochs[e].loss, h[0].epochs[e].loss, 1e-3 * h[0].epochs[e].loss)
          << mf::rung_name(kCpuRungs[r]) << " vs naive, epoch " << e + 1;
}

}  // namespace
