// test_gradcheck.cpp: the layers' analytic gradients, and the whole model's, against central
// finite differences of the loss.
//
// The layers compute in float, so this is Caffe's float recipe from STYLE.md: h = 1e-2 and a
// threshold of 1e-3 * max(1, |g|, |g_fd|) (here: 1e-3 + 1e-3 * max(|g|, |g_fd|)). The loss
// is accumulated in double from the float outputs, and the step is the float-rounded
// (x + h) - (x - h), not 2h.
//
// ReLU and max-pooling are piecewise linear: away from a kink the central difference is
// exact but for rounding, and across one its error is exactly s2 / (2h), where
// s2 = L(x+h) - 2 L(x) + L(x-h) (slope change times how far past the kink the step went).
// Inputs come from spaced() where that keeps values off ties; where a kink cannot be ruled
// out (a weight feeds dozens of ReLUs) coordinates whose s2 says a kink was crossed are
// skipped, and each test bounds how many may be. The skip test looks only at the loss, never
// at the analytic gradient, so it cannot hide a wrong gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "layers/conv2d.h"
#include "layers/dense.h"
#include "layers/flatten.h"
#include "layers/maxpool2d.h"
#include "train/sequential.h"
#include "layers/softmax_xent.h"
#include "runtime/parallel.h"
#include "tensor/rng.h"
#include "test/test_util.h"

namespace {

using mf::Activation;
using mf::Shape;
using mf::Tensor;
using mf::testing::all_close;
using mf::testing::uniform;

struct Slot {
  float* p;
  double analytic;
  std::string what;
};

// |g - g_fd| <= atol + rtol * max(|g|, |g_fd|); a slot whose crossed-kink error s2 / step
// exceeds kink_limit is skipped (kink_limit 0: never skip).
struct FdOptions {
  float h;
  double atol, rtol, kink_limit;
};
// Caffe's float recipe for one layer: h = 1e-2, threshold 1e-3 * max(1, |g|, |g_fd|)
// (~ atol 1e-3 + rtol 1e-3). A crossed kink may use a quarter of that. Over the layer tests
// below the largest error is 5% of the bound (Conv2D with ReLU), most are under 1%.
constexpr FdOptions kLayerFd{1e-2f, 1e-3, 1e-3, 2.5e-4};

struct CheckStats {
  int checked = 0, skipped = 0, failed = 0;
  double worst = 0;  // largest |g - g_fd| / (atol + rtol * max(|g|, |g_fd|)) among checked slots
};

CheckStats gradcheck(const std::vector<Slot>& slots, const std::function<double()>& loss, const FdOptions& o) {
  CheckStats st;
  const double l0 = loss();
  for (const Slot& s : slots) {
    const float x0 = *s.p;
    const float xp = x0 + o.h, xm = x0 - o.h;
    *s.p = xp;
    const double lp = loss();
    *s.p = xm;
    const double lm = loss();
    *s.p = x0;
    const double step = static_cast<double>(xp) - static_cast<double>(xm);
    const double fd = (lp - lm) / step;
    if (o.kink_limit > 0 && std::fabs(lp - 2 * l0 + lm) / step > o.kink_limit) {
      ++st.skipped;
      continue;
    }
    ++st.checked;
    const double allowed = o.atol + o.rtol * std::max(std::fabs(fd), std::fabs(s.analytic));
    const double ratio = std::fabs(fd - s.analytic) / allowed;
    st.worst = std::max(st.worst, ratio);
    if (ratio > 1) {
      ++st.failed;
      if (st.failed <= 5)
        ADD_FAILURE() << s.what << ": analytic " << s.analytic << ", finite difference " << fd << " (error "
                      << std::fabs(fd - s.analytic) << ", allowed " << allowed << ")";
    }
  }
  return st;
}

// The layers run on one thread here: hundreds of tiny forwards, where waking a second
// thread costs more than the work (the thread counts are covered in test_layers_cpu).
class Gradcheck : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = mf::num_threads();
    mf::set_num_threads(1);
  }
  void TearDown() override { mf::set_num_threads(saved_); }

 private:
  int saved_ = 1;
};

// sum(y * r) in double: its gradient wrt y is r.
double dot(const Tensor& y, const Tensor& r) {
  const float* a = y.data<float>();
  const float* b = r.data<float>();
  double s = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

void add_slots(std::vector<Slot>& slots, Tensor& values, const Tensor& grads, const std::string& name) {
  const std::vector<float> g = grads.to_vector();
  for (std::int64_t i = 0; i < values.numel(); ++i)
    slots.push_back({values.data<float>() + i, g[static_cast<std::size_t>(i)], name + "[" + std::to_string(i) + "]"});
}

// Checks d/dx, and d/dw, d/db when the layer has them, of sum(layer(x) * r).
CheckStats check_layer(mf::Layer& layer, Tensor x, std::uint64_t seed) {
  mf::Rng rng(seed);
  const Tensor r = uniform(layer.output_shape(x.shape()), -1, 1, rng);
  layer.forward(x);
  const Tensor dx = layer.backward(r).clone();
  std::vector<Slot> slots;
  add_slots(slots, x, dx, "dx");
  for (mf::Parameter* p : layer.parameters()) add_slots(slots, p->value, p->grad, p->name);
  return gradcheck(slots, [&] { return dot(layer.forward(x), r); }, kLayerFd);
}

TEST_F(Gradcheck, Conv2dLinear) {
  mf::Rng rng(1);
  mf::Conv2D conv(3, 4, 3, Activation::kNone, rng);
  conv.bias().value.copy_from(uniform({4}, -0.5f, 0.5f, rng));
  const CheckStats st = check_layer(conv, uniform({2, 6, 7, 3}, -1, 1, rng), 2);
  EXPECT_EQ(st.skipped, 0) << "a linear layer has no kinks";
  EXPECT_EQ(st.checked, 2 * 6 * 7 * 3 + 4 * 3 * 3 * 3 + 4);
  EXPECT_EQ(st.failed, 0) << "worst " << st.worst;
}

TEST_F(Gradcheck, Conv2dRelu) {
  mf::Rng rng(3);
  mf::Conv2D conv(3, 4, 3, Activation::kRelu, rng);
  // A spaced input (no two values closer than 0.008). Each weight still feeds 40 ReLUs, so
  // some steps cross a kink: 18 of 364 coordinates are skipped with this seed.
  conv.bias().value.copy_from(uniform({4}, -0.5f, 0.5f, rng));
  const CheckStats st = check_layer(conv, mf::testing::spaced({2, 6, 7, 3}, 0.008f, rng), 4);
  const int total = 2 * 6 * 7 * 3 + 4 * 3 * 3 * 3 + 4;
  EXPECT_EQ(st.checked + st.skipped, total);
  EXPECT_LE(st.skipped, total / 10) << "too many kinks: the check would say little";
  EXPECT_EQ(st.failed, 0) << "worst " << st.worst;
}

TEST_F(Gradcheck, MaxPool) {
  mf::Rng rng(5);
  mf::MaxPool2D pool;
  // neighbours at least 0.05 apart > 2h: a step never changes a window's winner
  const CheckStats st = check_layer(pool, mf::testing::spaced({2, 5, 7, 3}, 0.05f, rng), 6);
  EXPECT_EQ(st.skipped, 0);
  EXPECT_EQ(st.checked, 2 * 5 * 7 * 3);
  EXPECT_EQ(st.failed, 0) << "worst " << st.worst;
}

TEST_F(Gradcheck, DenseLinearAndRelu) {
  for (Activation act : {Activation::kNone, Activation::kRelu}) {
    SCOPED_TRACE(act == Activation::kRelu ? "relu" : "linear");
    mf::Rng rng(7);
    mf::Dense dense(20, 7, act, rng);
    dense.bias().value.copy_from(uniform({7}, -0.5f, 0.5f, rng));
    const CheckStats st = check_layer(dense, mf::testing::spaced({3, 20}, 0.02f, rng), 8);
    const int total = 3 * 20 + 20 * 7 + 7;
    EXPECT_EQ(st.checked + st.skipped, total);
    if (act == Activation::kNone) {
      EXPECT_EQ(st.skipped, 0);
    }
    EXPECT_LE(st.skipped, total / 10);
    EXPECT_EQ(st.failed, 0) << "worst " << st.worst;
  }
}

TEST_F(Gradcheck, Flatten) {
  mf::Rng rng(9);
  mf::Flatten flat;
  const CheckStats st = check_layer(flat, uniform({2, 3, 4, 5}, -1, 1, rng), 10);
  EXPECT_EQ(st.checked, 120);
  EXPECT_EQ(st.failed, 0);
}

TEST_F(Gradcheck, SoftmaxXent) {
  mf::Rng rng(11);
  Tensor z = uniform({4, 10}, -3, 3, rng);
  const Tensor labels = mf::testing::random_labels(4, 10, rng);
  Tensor stats = Tensor::zeros({mf::kNumStats});
  Tensor dz;
  mf::softmax_xent(z, labels, stats, &dz);
  // the mean loss in double from the float logits, so that the finite difference is not
  // limited by the float the library stores the loss sum in
  auto mean_loss = [&] { return mf::testing::softmax_xent_ref(z, labels).loss_sum / 4; };
  std::vector<Slot> slots;
  add_slots(slots, z, dz, "dlogits");
  // Smooth: the central difference's error is h^2 L''' / 6 <= 2e-6 here. The gradients are
  // 0.002 .. 0.25, so rather than Caffe's floor of 1 (which would pass anything this
  // small) the bound is 1e-5 + 1e-3 relative. The largest error seen is 1% of it.
  const CheckStats st = gradcheck(slots, mean_loss, FdOptions{1e-2f, 1e-5, 1e-3, 0});
  EXPECT_EQ(st.checked, 40);
  EXPECT_EQ(st.failed, 0) << "worst " << st.worst;
}

// A model at 12x12 (the smallest size keeps the fewest ReLUs and pool windows per weight; the
// wiring is the same as at 28x28): conv 10x10x32, pool 5x5, conv 3x3x64, pool 1x1 (the odd
// row and column dropped), flatten 64, dense 64, dense 10.
mf::Sequential small_model(mf::Rng& rng, std::int64_t size) {
  mf::Sequential model = mf::Sequential::mnist_cnn(rng, size, size);
  // Biases start at zero; random ones make the checks cover their use in the forward pass.
  for (mf::Parameter* p : model.parameters())
    if (p->name == "bias") p->value.copy_from(uniform(p->value.shape(), -0.05f, 0.05f, rng));
  return model;
}

// The whole model through softmax cross-entropy, against central differences, for a sample
// of the parameters of every layer. This checks that the layers are wired together right
// (Flatten's order, the first layer's missing input gradient, the pools' dropped rows).
//
// Each first-layer weight feeds 200 ReLUs and their pool windows, so at h = 1e-2 most
// coordinates cross a kink (errors of 1e-3 .. 3e-2 were seen); h = 1e-3 crosses few, and
// the s2 test finds those (where the error was large, s2 / step matched it). On the others
// the float noise of the loss, divided by 2h, is ~1e-5: atol 1e-4. The loss is smooth
// between kinks with curvature up to ~0.05 per parameter, so s2 / step <= 5e-5 there: the
// kink limit is 1e-4. rtol 1e-3 covers the O(h^2) truncation of the smooth part. With this
// seed 0..4 of each tensor's 13 entries are skipped, and the largest error is 15% of the
// bound (conv2d_1's bias).
TEST_F(Gradcheck, WholeModelThroughSoftmaxXent) {
  mf::Rng rng(12);
  mf::Sequential model = small_model(rng, 12);
  constexpr std::int64_t kN = 2;
  const Tensor x = uniform({kN, 12, 12, 1}, 0, 1, rng);
  const Tensor labels = mf::testing::random_labels(kN, 10, rng);
  Tensor stats = Tensor::zeros({mf::kNumStats});
  Tensor dlogits;
  mf::softmax_xent(model.forward(x), labels, stats, &dlogits);
  model.backward(dlogits);

  auto mean_loss = [&] { return mf::testing::softmax_xent_ref(model.forward(x), labels).loss_sum / kN; };
  constexpr int kPerTensor = 13;
  std::vector<std::vector<Slot>> tensors;
  for (const auto& layer : model.layers())
    for (mf::Parameter* p : layer->parameters()) {
      // 12 random entries of each parameter tensor, and its largest-gradient entry
      const std::vector<float> g = p->grad.to_vector();
      std::vector<std::int64_t> idx;
      for (int i = 0; i < kPerTensor - 1; ++i) idx.push_back(static_cast<std::int64_t>(rng.below(g.size())));
      idx.push_back(std::max_element(g.begin(), g.end(), [](float a, float b) { return std::fabs(a) < std::fabs(b); }) -
                    g.begin());
      tensors.emplace_back();
      for (std::int64_t i : idx)
        tensors.back().push_back(
            {p->value.data<float>() + i, g[i], layer->name() + "." + p->name + "[" + std::to_string(i) + "]"});
    }
  ASSERT_EQ(tensors.size(), 8u);
  const FdOptions fd{1e-3f, 1e-4, 1e-3, 1e-4};
  int nonzero_checked = 0, total_checked = 0;
  for (const std::vector<Slot>& mine : tensors) {
    SCOPED_TRACE(mine.front().what);
    const CheckStats st = gradcheck(mine, mean_loss, fd);
    EXPECT_EQ(st.failed, 0) << "worst " << st.worst;
    // 0..4 of 13 are skipped with this seed; more than 6 would leave too little checked
    EXPECT_GE(st.checked, 7) << "too many kinks crossed (" << st.skipped << " of 13): the check says little";
    total_checked += st.checked;
    // the largest-gradient entry is large enough that atol does not decide it
    EXPECT_GT(std::fabs(mine.back().analytic), 1e-3);
    for (const Slot& s : mine) nonzero_checked += s.analytic != 0;
  }
  EXPECT_GE(total_checked, 90) << "of 104";
  EXPECT_GT(nonzero_checked, 60) << "most sampled gradients should be non-zero";
}

// The model's gradients for EVERY parameter against a chain of the double-precision
// references of test_util, each fed the model's own float activations (so that pool and
// ReLU decisions are the same), at 12x12 and at the real 28x28. Sequential::backward must
// route each layer's dx into the layer before; the layers themselves are checked in
// test_layers_cpu.
TEST_F(Gradcheck, WholeModelMatchesChainedReferences) {
  for (std::int64_t size : {12, 28}) {
    SCOPED_TRACE("images " + std::to_string(size) + "x" + std::to_string(size));
    mf::Rng rng(13);
    mf::Sequential model = small_model(rng, size);
    constexpr std::int64_t kN = 3;
    const Tensor x = uniform({kN, size, size, 1}, 0, 1, rng);
    const Tensor labels = mf::testing::random_labels(kN, 10, rng);
    Tensor stats = Tensor::zeros({mf::kNumStats});
    Tensor dlogits;
    mf::softmax_xent(model.forward(x), labels, stats, &dlogits);
    model.backward(dlogits);

    const auto& L = model.layers();
    std::vector<Tensor> a{x};  // a[i] = input of layer i; a[7] = logits
    for (const auto& l : L) a.push_back(l->forward(a.back()).clone());
    auto as_tensor = [](const std::vector<double>& v, const Shape& s) {
      return Tensor::from_vector(s, std::vector<float>(v.begin(), v.end()));
    };
    auto* conv0 = dynamic_cast<mf::Conv2D*>(L[0].get());
    auto* conv1 = dynamic_cast<mf::Conv2D*>(L[2].get());
    auto* dense0 = dynamic_cast<mf::Dense*>(L[5].get());
    auto* dense1 = dynamic_cast<mf::Dense*>(L[6].get());
    ASSERT_TRUE(conv0 && conv1 && dense0 && dense1);

    Tensor g = as_tensor(mf::testing::softmax_xent_ref(a[7], labels).dlogits, a[7].shape());
    const auto d1 = mf::testing::dense_backward_ref(a[6], dense1->weight().value, dense1->bias().value, false, g);
    g = as_tensor(d1.dx, a[6].shape());
    const auto d0 = mf::testing::dense_backward_ref(a[5], dense0->weight().value, dense0->bias().value, true, g);
    g = as_tensor(d0.dx, a[4].shape());  // through Flatten: the same numbers in NHWC shape
    g = as_tensor(mf::testing::maxpool_backward_ref(a[3], g), a[3].shape());
    const auto c1 = mf::testing::conv2d_backward_ref(a[2], conv1->weight().value, conv1->bias().value, true, g);
    g = as_tensor(mf::testing::maxpool_backward_ref(a[1], as_tensor(c1.dx, a[2].shape())), a[1].shape());
    const auto c0 = mf::testing::conv2d_backward_ref(a[0], conv0->weight().value, conv0->bias().value, true, g);

    // The reference chain rounds each dx to float on the way, and the model's float
    // gradients carry ~1e-6 relative error per layer: NMSE 1e-10 (relative RMS 1e-5) is
    // the STYLE.md FP32 bound; elementwise 1e-4 of the tensor's largest gradient.
    auto check = [](const char* what, const Tensor& got, const std::vector<double>& want) {
      double scale = 0;
      for (double v : want) scale = std::max(scale, std::fabs(v));
      EXPECT_GT(scale, 0.0) << what;
      EXPECT_TRUE(all_close(got, want, mf::testing::Tol{1e-4 * scale, 1e-4})) << what;
      EXPECT_LE(mf::testing::nmse(got, want), 1e-10) << what;
    };
    check("dense_1.kernel", dense1->weight().grad, d1.dw);
    check("dense_1.bias", dense1->bias().grad, d1.db);
    check("dense.kernel", dense0->weight().grad, d0.dw);
    check("dense.bias", dense0->bias().grad, d0.db);
    check("conv2d_1.kernel", conv1->weight().grad, c1.dw);
    check("conv2d_1.bias", conv1->bias().grad, c1.db);
    check("conv2d.kernel", conv0->weight().grad, c0.dw);
    check("conv2d.bias", conv0->bias().grad, c0.db);
  }
}

}  // namespace
