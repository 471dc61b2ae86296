// test_optim.cpp: Adam and SGD on the CPU against updates worked out in double, parameter
// packing, and the dynamic loss scale's host model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "layers/layer.h"
#include "optim/adam.h"
#include "optim/loss_scaler.h"
#include "optim/param_pack.h"
#include "optim/sgd.h"
#include "test/test_util.h"

namespace {

using mf::DType;
using mf::Parameter;
using mf::Shape;
using mf::Tensor;

Parameter make_param(const std::string& name, const Shape& shape, const std::vector<float>& values) {
  Parameter p;
  p.name = name;
  p.value = Tensor::from_vector(shape, values);
  p.grad = Tensor::zeros(shape);
  return p;
}

void set_grad(Parameter& p, const std::vector<float>& g) {
  ASSERT_EQ(static_cast<std::int64_t>(g.size()), p.grad.numel());
  std::copy(g.begin(), g.end(), p.grad.data<float>());
}

// The optimizers update in float (state and weights), the expected values are in double:
// each step rounds m, v, w and the update once or twice, ~1e-7 relative; over 3 steps
// relative 1e-6 is ~10x that.
::testing::AssertionResult near_rel(const std::vector<float>& got, const std::vector<double>& want, double rtol = 1e-6) {
  return mf::testing::all_close(std::vector<double>(got.begin(), got.end()), want, mf::testing::Tol{1e-12, rtol});
}

// Keras's Adam (optim/adam.h), in double: lr_t = lr sqrt(1 - b2^t) / (1 - b1^t),
// m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, w -= lr_t m / (sqrt(v) + eps).
struct AdamRef {
  double lr, b1, b2, eps;
  std::vector<double> w, m, v;
  int t = 0;
  void step(const std::vector<double>& g) {
    ++t;
    const double lr_t = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
    for (std::size_t i = 0; i < w.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
    }
  }
};

TEST(AdamCpu, ThreeStepsWorkedOutByHand) {
  // Keras's defaults; w = (1, -2, 0.5), gradients g1, g2, g3 below.
  //
  // Step 1: lr_1 = 1e-3 * sqrt(0.001) / 0.1 = 3.16227766e-4. With m = 0.1 g, v = 0.001 g^2,
  // the update is lr_1 * 0.1 g / (sqrt(0.001) |g| + 1e-7) = 1e-3 * sign(g) (1 - ~1e-7 / (0.0316 |g|)):
  // every element moves by ~lr against the sign of its gradient, whatever its size.
  //   w1 = (1 - 0.001, -2 + 0.001, 0.5 - 0.001)  to within 3e-9 (the eps term)
  // Steps 2 and 3 are the same formula with t = 2, 3; their numbers come from AdamRef.
  Parameter p = make_param("kernel", {3}, {1.0f, -2.0f, 0.5f});
  mf::Adam adam;
  EXPECT_EQ(adam.config().lr, 1e-3f);
  EXPECT_EQ(adam.config().beta1, 0.9f);
  EXPECT_EQ(adam.config().beta2, 0.999f);
  EXPECT_EQ(adam.config().eps, 1e-7f);
  adam.attach({&p});
  EXPECT_EQ(adam.iterations(), 0);
  // the reference starts from the float values of the hyper-parameters the optimizer has
  AdamRef ref{1e-3f, 0.9f, 0.999f, 1e-7f, {1.0, -2.0, 0.5}, {0, 0, 0}, {0, 0, 0}};
  const std::vector<std::vector<float>> grads = {{0.5f, -0.25f, 2.0f}, {0.1f, -0.3f, -1.0f}, {-0.2f, 0.05f, 0.0f}};

  set_grad(p, grads[0]);
  adam.step();
  ref.step({grads[0].begin(), grads[0].end()});
  // the hand-computed first step
  EXPECT_NEAR(p.value.data<float>()[0], 0.999, 1e-6);
  EXPECT_NEAR(p.value.data<float>()[1], -1.999, 1e-6);
  EXPECT_NEAR(p.value.data<float>()[2], 0.499, 1e-6);
  EXPECT_TRUE(near_rel(p.value.to_vector(), ref.w));
  EXPECT_EQ(adam.iterations(), 1);
  for (float g : p.grad.to_vector()) EXPECT_EQ(g, 0.0f) << "step() zeroes the gradients";

  double w2_after_step2 = 0;
  for (int s = 1; s < 3; ++s) {
    if (s == 2) w2_after_step2 = p.value.data<float>()[2];
    set_grad(p, grads[s]);
    adam.step();
    ref.step({grads[s].begin(), grads[s].end()});
    EXPECT_TRUE(near_rel(p.value.to_vector(), ref.w)) << "step " << s + 1;
    EXPECT_EQ(adam.iterations(), s + 1);
    for (float g : p.grad.to_vector()) EXPECT_EQ(g, 0.0f);
  }
  // the state tensors hold m and v (padded to the pack's alignment)
  const auto state = adam.state();
  ASSERT_GE(state.size(), 3u);
  EXPECT_EQ(state[0].first, "adam.m");
  EXPECT_EQ(state[1].first, "adam.v");
  EXPECT_EQ(state[2].first, "adam.step");
  const std::vector<float> m = state[0].second.to_vector(), v = state[1].second.to_vector();
  EXPECT_TRUE(near_rel({m.begin(), m.begin() + 3}, ref.m));
  EXPECT_TRUE(near_rel({v.begin(), v.begin() + 3}, ref.v));
  EXPECT_EQ(state[2].second.to_vector(), std::vector<float>{3});
  // the third gradient of element 2 is zero, yet it still moves at step 3 (its m decays,
  // not vanishes); the loop above checked the amount against the reference
  EXPECT_GT(std::fabs(p.value.data<float>()[2] - w2_after_step2), 1e-4);
}

// With eps comparable to sqrt(v), Keras's "epsilon hat" form differs from the paper's
// m_hat / (sqrt(v_hat) + eps): this pins the form adam.h documents.
TEST(AdamCpu, EpsilonHatFormWhenEpsMatters) {
  Parameter p = make_param("bias", {3}, {0.0f, 0.0f, 0.0f});
  mf::AdamConfig c;
  c.lr = 0.1f;
  c.eps = 1e-3f;
  mf::Adam adam(c);
  adam.attach({&p});
  AdamRef ref{0.1f, 0.9f, 0.999f, 1e-3f, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}};
  for (int s = 0; s < 3; ++s) {
    const std::vector<float> g = {1e-3f, -2e-3f, 5e-4f};  // sqrt(v) ~ 3e-5 .. 1e-4 << eps
    set_grad(p, g);
    adam.step();
    ref.step({g.begin(), g.end()});
  }
  EXPECT_TRUE(near_rel(p.value.to_vector(), ref.w));
  // the paper's form would give a different answer: make sure the test can tell them apart
  std::vector<double> paper{0, 0, 0}, m{0, 0, 0}, v{0, 0, 0};
  for (int t = 1; t <= 3; ++t) {
    const double g[3] = {1e-3, -2e-3, 5e-4};
    for (int i = 0; i < 3; ++i) {
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i];
      paper[i] -= 0.1 * (m[i] / (1 - std::pow(0.9, t))) / (std::sqrt(v[i] / (1 - std::pow(0.999, t))) + 1e-3);
    }
  }
  EXPECT_FALSE(near_rel(p.value.to_vector(), paper, 1e-2)) << "the two forms should differ by more than 1% here";
}

TEST(AdamCpu, LearningRateChangeTakesEffectOnTheNextStep) {
  Parameter p = make_param("kernel", {3}, {1.0f, 2.0f, 3.0f});
  mf::Adam adam;
  adam.attach({&p});
  AdamRef ref{1e-3f, 0.9f, 0.999f, 1e-7f, {1, 2, 3}, {0, 0, 0}, {0, 0, 0}};
  const std::vector<float> g = {0.3f, -0.6f, 0.9f};
  set_grad(p, g);
  adam.step();
  ref.step({g.begin(), g.end()});
  adam.set_learning_rate(0.05f);
  EXPECT_EQ(adam.learning_rate(), 0.05f);
  ref.lr = 0.05f;
  set_grad(p, g);
  adam.step();
  ref.step({g.begin(), g.end()});
  EXPECT_TRUE(near_rel(p.value.to_vector(), ref.w));
  // the second step moved ~50x further than the first
  EXPECT_NEAR(1.0 - p.value.data<float>()[0], 0.001 + 0.05, 2e-3);
}

TEST(AdamCpu, SeveralParametersAndGapsStayZero) {
  Parameter a = make_param("kernel", {2, 3}, {1, 2, 3, 4, 5, 6});
  Parameter b = make_param("bias", {3}, {0.5f, -0.5f, 0});
  mf::Adam adam;
  adam.attach({&a, &b});
  for (int s = 0; s < 4; ++s) {
    set_grad(a, {1, -1, 1, -1, 1, -1});
    set_grad(b, {0.1f, 0.2f, 0.3f});
    adam.step();
  }
  // every element with a constant gradient moves by lr each step (m / sqrt(v) = sign g)
  const std::vector<float> av = a.value.to_vector();
  EXPECT_NEAR(av[0], 1 - 4e-3, 1e-6);
  EXPECT_NEAR(av[1], 2 + 4e-3, 1e-6);
  EXPECT_NEAR(b.value.data<float>()[2], -4e-3, 1e-6);
  // the gaps of the flat buffers (between the parameters' 64-element slots) stay zero, in m
  // and v alike
  const auto state = adam.state();
  for (int k = 0; k < 2; ++k) {
    const Tensor& mv = state[static_cast<std::size_t>(k)].second;
    for (std::int64_t i = 6; i < 64; ++i) ASSERT_EQ(mv.data<float>()[i], 0.0f) << state[k].first << " " << i;
  }
}

TEST(AdamCpu, RejectsBadConfigAndStepBeforeAttach) {
  auto cfg = [](float lr, float b1, float b2, float eps) {
    mf::AdamConfig c;
    c.lr = lr, c.beta1 = b1, c.beta2 = b2, c.eps = eps;
    return c;
  };
  EXPECT_THROW(mf::Adam(cfg(0, 0.9f, 0.999f, 1e-7f)), std::invalid_argument);
  EXPECT_THROW(mf::Adam(cfg(-1, 0.9f, 0.999f, 1e-7f)), std::invalid_argument);
  EXPECT_THROW(mf::Adam(cfg(NAN, 0.9f, 0.999f, 1e-7f)), std::invalid_argument);
  EXPECT_THROW(mf::Adam(cfg(1e-3f, 1.0f, 0.999f, 1e-7f)), std::invalid_argument);
  EXPECT_THROW(mf::Adam(cfg(1e-3f, 0.9f, 1.0f, 1e-7f)), std::invalid_argument);
  EXPECT_THROW(mf::Adam(cfg(1e-3f, 0.9f, 0.999f, 0)), std::invalid_argument);
  // The loss scaler's settings (before, a NaN scale skipped every FP16 step and an
  // interval of 0 doubled the scale at every clean step, until every other step overflowed)
  auto scaler = [](float initial, float min, float max, std::int32_t interval) {
    mf::LossScalerConfig c;
    c.initial_scale = initial, c.min_scale = min, c.max_scale = max, c.growth_interval = interval;
    return c;
  };
  for (const mf::LossScalerConfig& bad :
       {scaler(NAN, 1, 2, 10), scaler(INFINITY, 1, INFINITY, 10), scaler(0, 0, 2, 10), scaler(1, -1, 2, 10),
        scaler(4, 1, 2, 10), scaler(1, 2, 4, 10), scaler(2, 4, 1, 10), scaler(2, 1, 4, 0), scaler(2, 1, 4, -5)}) {
    try {
      mf::Adam a({}, bad);
      ADD_FAILURE() << "accepted initial " << bad.initial_scale << ", min " << bad.min_scale << ", max "
                    << bad.max_scale << ", interval " << bad.growth_interval;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("loss scaler"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(mf::Adam({}, scaler(1, 1, 1, 1)));
  mf::Adam adam;
  EXPECT_THROW(adam.step(), std::logic_error);
  EXPECT_EQ(adam.iterations(), 0);
  EXPECT_THROW(adam.attach({}), std::invalid_argument);
  EXPECT_EQ(adam.name(), "Adam");
  EXPECT_NE(adam.describe().find("lr=0.001"), std::string::npos) << adam.describe();
  // FP32 on the CPU: no loss scaling
  EXPECT_EQ(adam.device_loss_scale(), nullptr);
  EXPECT_EQ(adam.loss_scale(), 1.0);
  EXPECT_EQ(adam.take_skipped_steps(), 0);
}

// A learning rate must be a finite number above zero, in the constructor and in
// set_learning_rate() alike: -1 trained by gradient ascent (the loss climbed to 1e9 with no
// error), 0 trained nothing, and an infinite rate or epsilon made every weight NaN or inf.
// A refused value leaves the rate as it was.
TEST(Optimizers, LearningRateAndEpsilonMustBeFiniteAndPositive) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const float bad : {-1.0f, 0.0f, -0.0f, inf, -inf, nan}) {
    SCOPED_TRACE(std::to_string(bad));
    mf::AdamConfig c;
    c.lr = bad;
    EXPECT_THROW(mf::Adam{c}, std::invalid_argument);
    c.lr = 1e-3f;
    c.eps = bad;
    EXPECT_THROW(mf::Adam{c}, std::invalid_argument);
    EXPECT_THROW(mf::SGD{bad}, std::invalid_argument);
    mf::Adam adam;
    mf::SGD sgd(0.1f);
    for (mf::Optimizer* opt : std::vector<mf::Optimizer*>{&adam, &sgd}) {
      const float before = opt->learning_rate();
      try {
        opt->set_learning_rate(bad);
        ADD_FAILURE() << opt->name() << " took the learning rate";
      } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find(opt->name() + ": learning rate must be finite and > 0"),
                  std::string::npos)
            << e.what();
      }
      EXPECT_EQ(opt->learning_rate(), before) << opt->name();
    }
  }
  // train_mnist's smallest --lr is 1e-8, its largest 10: both valid
  mf::Adam adam;
  mf::SGD sgd(0.1f);
  for (mf::Optimizer* opt : std::vector<mf::Optimizer*>{&adam, &sgd}) {
    for (const float lr : {1e-8f, 10.0f}) {
      opt->set_learning_rate(lr);
      EXPECT_EQ(opt->learning_rate(), lr) << opt->name();
    }
  }
  mf::AdamConfig c;
  c.lr = 1e-8f;
  c.eps = 1e-12f;
  EXPECT_NO_THROW(mf::Adam{c});
}

// ---- SGD ------------------------------------------------------------------------------------

TEST(SgdCpu, PlainStepsWorkedOutByHand) {
  Parameter p = make_param("kernel", {3}, {1.0f, -2.0f, 0.5f});
  mf::SGD sgd(0.1f);
  sgd.attach({&p});
  // w -= 0.1 g
  set_grad(p, {1.0f, -2.0f, 0.0f});
  sgd.step();
  EXPECT_TRUE(near_rel(p.value.to_vector(), {0.9, -1.8, 0.5}));
  set_grad(p, {0.5f, 0.5f, -4.0f});
  sgd.step();
  EXPECT_TRUE(near_rel(p.value.to_vector(), {0.85, -1.85, 0.9}));
  for (float g : p.grad.to_vector()) EXPECT_EQ(g, 0.0f);
  EXPECT_EQ(sgd.iterations(), 2);
  sgd.set_learning_rate(1.0f);
  EXPECT_EQ(sgd.learning_rate(), 1.0f);
  set_grad(p, {0.05f, 0, 0});
  sgd.step();
  EXPECT_TRUE(near_rel(p.value.to_vector(), {0.8, -1.85, 0.9}));
  EXPECT_EQ(sgd.iterations(), 3);
}

// Sets an attached optimizer's step count as a checkpoint would (its state's "step" tensor).
static void set_step_count(mf::Optimizer& opt, std::int32_t count) {
  for (auto& [name, t] : opt.state())
    if (name.find("step") != std::string::npos) t.data<std::int32_t>()[0] = count;
}

// The step count is an i32 on the optimizer's device; read as a float it came back rounded
// past 2^24 updates (16,777,219 read as 16,777,220), and went so into checkpoints.
TEST(Optimizers, IterationsAreExactPast2To24) {
  Parameter p = make_param("kernel", {1}, {1.0f});
  mf::Adam adam;
  mf::SGD sgd(0.1f);
  for (mf::Optimizer* opt : std::vector<mf::Optimizer*>{&adam, &sgd}) {
    SCOPED_TRACE(opt->name());
    opt->attach({&p});
    set_step_count(*opt, 16777219);
    EXPECT_EQ(opt->iterations(), 16777219);
  }
}

// The step count is an int32 (on the device too): at 2^31 - 1 it stays, and the update goes
// on with a bias correction of 1. It used to overflow there (undefined; in practice a count
// of -2^31, whose bias correction is NaN, so every weight became NaN).
TEST(Optimizers, StepCountStopsAtInt32MaxAndUpdatesStayFinite) {
  constexpr std::int32_t kMax = std::numeric_limits<std::int32_t>::max();
  Parameter p = make_param("kernel", {2}, {1.0f, -1.0f});
  mf::Adam adam;
  mf::SGD sgd(0.1f);
  for (mf::Optimizer* opt : std::vector<mf::Optimizer*>{&adam, &sgd}) {
    SCOPED_TRACE(opt->name());
    opt->attach({&p});
    set_step_count(*opt, kMax - 1);
    // The first step from zero moments (Adam: m = 0.1 g, v = 0.001 g^2, bias correction 1)
    const std::vector<float> w0 = p.value.to_vector();
    set_grad(p, {1.0f, -1.0f});
    opt->step();
    EXPECT_EQ(opt->iterations(), kMax);
    const double move = opt == &adam ? 1e-3 * 0.1 / (std::sqrt(0.001) + 1e-7) : 0.1;
    EXPECT_TRUE(near_rel(p.value.to_vector(), {w0[0] - move, w0[1] + move}, 1e-5));
    set_grad(p, {1.0f, -1.0f});
    opt->step();
    EXPECT_EQ(opt->iterations(), kMax);
    for (float w : p.value.to_vector()) EXPECT_TRUE(std::isfinite(w)) << w;
  }
}

TEST(SgdCpu, MomentumStepsWorkedOutByHand) {
  // Keras: velocity = 0.9 velocity - 0.1 g; w += velocity. With g = 1 three times:
  // v = -0.1, -0.19, -0.271; w = 1 - 0.1 - 0.19 - 0.271 = 0.439.
  // With g = (2, -1, 0.5): v1 = -0.2, w = 0.8; v2 = -0.18 + 0.1 = -0.08, w = 0.72;
  // v3 = -0.072 - 0.05 = -0.122, w = 0.598.
  Parameter p = make_param("kernel", {2}, {1.0f, 1.0f});
  mf::SGD sgd(0.1f, 0.9f);
  sgd.attach({&p});
  const double want0[3] = {0.9, 0.71, 0.439}, want1[3] = {0.8, 0.72, 0.598};
  const float g1[3] = {2.0f, -1.0f, 0.5f};
  for (int s = 0; s < 3; ++s) {
    set_grad(p, {1.0f, g1[s]});
    sgd.step();
    EXPECT_TRUE(near_rel(p.value.to_vector(), {want0[s], want1[s]})) << "step " << s + 1;
  }
  const auto state = sgd.state();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "sgd.velocity");
  EXPECT_TRUE(near_rel({state[0].second.data<float>()[0], state[0].second.data<float>()[1]}, {-0.271, -0.122}));
  EXPECT_EQ(state[1].second.to_vector(), std::vector<float>{3});
}

TEST(SgdCpu, RejectsBadSettings) {
  EXPECT_THROW(mf::SGD(0.0f), std::invalid_argument);
  EXPECT_THROW(mf::SGD(-0.1f), std::invalid_argument);
  EXPECT_THROW(mf::SGD(0.1f, 1.0f), std::invalid_argument);
  EXPECT_THROW(mf::SGD(0.1f, -0.5f), std::invalid_argument);
  mf::SGD sgd(0.1f);
  EXPECT_THROW(sgd.step(), std::logic_error);
  EXPECT_EQ(sgd.iterations(), 0);
  EXPECT_EQ(sgd.name(), "SGD");
  // What train_mnist prints on its "Training on ..." line.
  EXPECT_EQ(sgd.describe(), "SGD(lr=0.1, momentum=0)");
  EXPECT_EQ(mf::SGD(0.05f, 0.9f).describe(), "SGD(lr=0.05, momentum=0.9)");
}

// SGD has no mixed precision; it refuses such parameters before packing them, so that a
// refused compile leaves them in the buffers of the optimizer the model already had (after
// packing, that one would update buffers the model no longer reads).
TEST(SgdCpu, RefusesMixedPrecisionBeforeTakingTheParameters) {
  Parameter p = make_param("kernel", {3}, {1.0f, 2.0f, 3.0f});
  p.half = p.value.to(DType::kF16);
  const void* const value = p.value.raw();
  const void* const grad = p.grad.raw();
  mf::SGD sgd(0.1f);
  EXPECT_THROW(sgd.attach({&p}), std::invalid_argument);
  EXPECT_EQ(p.value.raw(), value);
  EXPECT_EQ(p.grad.raw(), grad);
}

// ---- ParamPack ------------------------------------------------------------------------------

TEST(ParamPack, ParametersBecomeAlignedViewsOfOneBuffer) {
  // sizes 3, 64, 65, 1, 130 -> slots of 64, 64, 128, 64, 192 elements
  const std::vector<std::int64_t> sizes = {3, 64, 65, 1, 130};
  std::vector<Parameter> params;
  std::vector<std::vector<float>> values, grads;
  mf::Rng rng(5);
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    std::vector<float> v(static_cast<std::size_t>(sizes[k])), g(v.size());
    for (auto& x : v) x = rng.uniform(-1, 1);
    for (auto& x : g) x = rng.uniform(-1, 1);
    const Shape shape = k == 2 ? Shape{5, 13} : Shape{sizes[k]};
    params.push_back(make_param("p" + std::to_string(k), shape, v));
    std::copy(g.begin(), g.end(), params.back().grad.data<float>());
    values.push_back(v);
    grads.push_back(g);
  }
  std::vector<Parameter*> ptrs;
  for (auto& p : params) ptrs.push_back(&p);
  mf::ParamPack pack(ptrs);
  EXPECT_EQ(pack.total(), 64 + 64 + 128 + 64 + 192);
  EXPECT_FALSE(pack.mixed());
  EXPECT_FALSE(pack.halves().defined());
  EXPECT_EQ(pack.device(), mf::Device::kCpu);
  const char* vbase = static_cast<const char*>(pack.values().raw());
  const char* gbase = static_cast<const char*>(pack.grads().raw());
  // the host buffer itself is 64-byte aligned (tensor.h); parameter starts are 256-byte
  // multiples from it (absolute 256-byte alignment is what the device allocator gives)
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(vbase) % 64, 0u);
  const std::int64_t offsets[] = {0, 64, 128, 256, 320};
  std::vector<bool> used(static_cast<std::size_t>(pack.total()), false);
  for (std::size_t k = 0; k < params.size(); ++k) {
    SCOPED_TRACE(params[k].name);
    const char* vp = static_cast<const char*>(params[k].value.raw());
    const char* gp = static_cast<const char*>(params[k].grad.raw());
    EXPECT_EQ(vp - vbase, offsets[k] * 4);
    EXPECT_EQ(gp - gbase, offsets[k] * 4);
    EXPECT_EQ((vp - vbase) % 256, 0);
    EXPECT_EQ(params[k].value.to_vector(), values[k]) << "values are preserved";
    EXPECT_EQ(params[k].grad.to_vector(), grads[k]) << "gradients are preserved";
    EXPECT_EQ(params[k].value.shape(), k == 2 ? Shape({5, 13}) : Shape({sizes[k]})) << "shapes are kept";
    for (std::int64_t i = 0; i < sizes[k]; ++i) used[static_cast<std::size_t>(offsets[k] + i)] = true;
  }
  // writing through a parameter writes the flat buffer
  params[1].value.data<float>()[5] = 123.0f;
  EXPECT_EQ(pack.values().data<float>()[64 + 5], 123.0f);
  // the gaps are zero, in values and gradients
  for (std::int64_t i = 0; i < pack.total(); ++i)
    if (!used[static_cast<std::size_t>(i)]) {
      ASSERT_EQ(pack.values().data<float>()[i], 0.0f) << "gap " << i;
      ASSERT_EQ(pack.grads().data<float>()[i], 0.0f) << "gap " << i;
    }
}

TEST(ParamPack, RejectsEmptyAndMixedParameterSets) {
  EXPECT_THROW(mf::ParamPack(std::vector<Parameter*>{}), std::invalid_argument);
  Parameter a = make_param("kernel", {2}, {1, 2});
  Parameter b = make_param("bias", {2}, {1, 2});
  b.grad = Tensor::zeros({2}, DType::kF16);  // another gradient precision
  EXPECT_THROW(mf::ParamPack({&a, &b}), std::invalid_argument);
}

// ---- loss scaling ---------------------------------------------------------------------------

TEST(LossScalerModel, InfHalvesAndSkips) {
  mf::LossScalerModel s;
  EXPECT_EQ(s.scale, 65536.0f);
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.clean_steps, 1);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale, 32768.0f);
  EXPECT_EQ(s.skipped, 1);
  EXPECT_EQ(s.clean_steps, 0) << "an overflow restarts the run of clean steps";
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale, 16384.0f);
  EXPECT_EQ(s.skipped, 2);
}

TEST(LossScalerModel, GrowsAfterGrowthIntervalCleanSteps) {
  mf::LossScalerConfig c;
  c.initial_scale = 8.0f;
  c.growth_interval = 3;
  mf::LossScalerModel s(c);
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale, 8.0f);
  EXPECT_TRUE(s.update(false));  // the 3rd clean step in a row
  EXPECT_EQ(s.scale, 16.0f);
  EXPECT_EQ(s.clean_steps, 0);
  // an overflow in the middle of a run resets the count
  s.update(false);
  s.update(false);
  s.update(true);
  EXPECT_EQ(s.scale, 8.0f);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale, 8.0f);
  s.update(false);
  EXPECT_EQ(s.scale, 16.0f);
  EXPECT_EQ(s.skipped, 1);
  // the default interval is 2000
  mf::LossScalerModel d;
  for (int i = 0; i < 1999; ++i) d.update(false);
  EXPECT_EQ(d.scale, 65536.0f);
  d.update(false);
  EXPECT_EQ(d.scale, 131072.0f);
}

TEST(LossScalerModel, ClampsAtMinAndMax) {
  mf::LossScalerConfig c;
  c.initial_scale = 4.0f;
  c.growth_interval = 1;
  c.min_scale = 1.0f;
  c.max_scale = 16.0f;
  mf::LossScalerModel s(c);
  for (int i = 0; i < 10; ++i) s.update(false);
  EXPECT_EQ(s.scale, 16.0f);
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale, 1.0f);
  EXPECT_EQ(s.skipped, 10);
  // the defaults: 2^-14 .. 2^24
  mf::LossScalerModel d;
  for (int i = 0; i < 100; ++i) d.update(true);
  EXPECT_EQ(d.scale, std::ldexp(1.0f, -14));
  mf::LossScalerConfig g;
  g.growth_interval = 1;
  mf::LossScalerModel up(g);
  for (int i = 0; i < 100; ++i) up.update(false);
  EXPECT_EQ(up.scale, std::ldexp(1.0f, 24));
}

}  // namespace
