// test_fused_gpu.cpp: the fused step's kernels (kernels/gpu/fused.h) against the naive
// double-precision references of test_util, FP32 and FP16, for the model's head and odd
// ones, whole and partial batches; their sums must give the same bits at every launch.
// Skipped without a GPU; test/emulator runs them on the CUDA emulation as
// Emulated.FusedGpu.* (`ctest -R Fused`).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/gpu/fused.h"
#include "runtime/gpu_runtime.h"
#include "tensor/rng.h"
#include "tensor/tensor.h"
#include "test/test_util.h"

namespace mf {
namespace {

using testing::all_close;
using testing::Tol;

// FP32: sums of up to 1600 products of f32 values, in another order than the references'
// double sums: ~1e-6 relative; a missing or doubled term (one sample of 64 in a weight
// gradient) is ~1e-2 relative or more. FP16: inputs rounded to f16 on both sides, the
// per-sample values (a1, dz1, dlogits) and the outputs stored in f16 (2^-11 relative each).
constexpr Tol kFp32Tol{1e-6, 1e-3};
constexpr Tol kFp16Tol{1e-4, 3e-2};

Tensor host(const std::vector<double>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape);
  for (std::size_t i = 0; i < v.size(); ++i) t.data<float>()[i] = static_cast<float>(v[i]);
  return t;
}

Tensor dev(const Tensor& t, DType dtype) { return t.to(dtype).to(Device::kGpu); }

Tensor back(const Tensor& t) {
  gpu_synchronize();
  return t.to(Device::kCpu).to(DType::kF32);
}

struct Head {
  Tensor x, w1, b1, w2, b2, labels;
};

Head random_head(const FusedHeadSizes& g, bool half, Rng& rng) {
  Head h;
  h.x = testing::uniform({g.n, g.in}, -1, 1, rng);
  const float l1 = std::sqrt(6.0f / static_cast<float>(g.in + g.hidden)), l2 = std::sqrt(6.0f / (g.hidden + g.classes));
  h.w1 = testing::uniform({g.in, g.hidden}, -l1, l1, rng);
  h.b1 = testing::uniform({g.hidden}, -0.1f, 0.1f, rng);
  h.w2 = testing::uniform({g.hidden, g.classes}, -l2, l2, rng);
  h.b2 = testing::uniform({g.classes}, -0.1f, 0.1f, rng);
  h.labels = testing::random_labels(g.n, static_cast<int>(g.classes), rng);
  if (half)
    for (Tensor* t : {&h.x, &h.w1, &h.b1, &h.w2, &h.b2}) testing::round_to_half(*t);
  return h;
}

// What launch_fused_head computed, on the host in f32.
struct HeadRun {
  Tensor dx, dw1, db1, dw2, db2;
  std::vector<float> stats;
};

// The gradients start at `start` everywhere, so that accumulating (+=) is tested.
HeadRun run_head(const FusedHeadSizes& g, const Head& h, bool half, float start, const float* loss_scale) {
  const DType dt = half ? DType::kF16 : DType::kF32;
  const auto filled = [&](const Shape& s) {
    Tensor t = Tensor::empty(s);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = start;
    return dev(t, dt);
  };
  const Tensor x = dev(h.x, dt), w1 = dev(h.w1, dt), b1 = dev(h.b1, dt), w2 = dev(h.w2, dt), b2 = dev(h.b2, dt);
  const Tensor labels = h.labels.to(Device::kGpu);
  Tensor dx = Tensor::zeros({g.n, g.in}, dt, Device::kGpu);
  Tensor dw1 = filled({g.in, g.hidden}), db1 = filled({g.hidden}), dw2 = filled({g.hidden, g.classes}),
         db2 = filled({g.classes});
  Tensor stats = Tensor::zeros({3}, DType::kF32, Device::kGpu);
  Tensor scale;
  if (loss_scale) {
    Tensor s = Tensor::empty({1});
    s.data<float>()[0] = *loss_scale;
    scale = s.to(Device::kGpu);
  }
  const std::int64_t bytes = static_cast<std::int64_t>(fused_head_scratch_bytes(g, half));
  Tensor scratch = Tensor::zeros({bytes}, DType::kU8, Device::kGpu);
  launch_fused_head(g, x.raw(), w1.raw(), b1.raw(), w2.raw(), b2.raw(), labels.data<std::int32_t>(),
                    1.0f / static_cast<float>(g.n), loss_scale ? scale.data<float>() : nullptr,
                    fused_head_scratch(scratch.raw(), g, half), dx.raw(), dw1.raw(), db1.raw(), dw2.raw(), db2.raw(),
                    stats.data<float>(), half, compute_stream());
  HeadRun r{back(dx), back(dw1), back(db1), back(dw2), back(db2), back(stats).to_vector()};
  return r;
}

// ref * k + start, element by element.
std::vector<double> scaled(const std::vector<double>& ref, double k, double start) {
  std::vector<double> v(ref);
  for (double& e : v) e = e * k + start;
  return v;
}

void check_head(const FusedHeadSizes& g, bool half, std::uint64_t seed, float loss_scale = 0.0f) {
  SCOPED_TRACE(std::string(half ? "f16" : "f32") + " head n=" + std::to_string(g.n) + " " + std::to_string(g.in) +
               "->" + std::to_string(g.hidden) + "->" + std::to_string(g.classes) +
               (loss_scale > 0 ? " loss scale " + std::to_string(loss_scale) : ""));
  Rng rng(seed);
  const Head h = random_head(g, half, rng);
  // The references: dense (ReLU), dense_1, the mean loss, then back through both layers.
  const Tensor zero1 = Tensor::zeros({g.hidden}), zero2 = Tensor::zeros({g.classes});
  const Tensor a1 = host(testing::dense_forward_ref(h.x, h.w1, h.b1, true), {g.n, g.hidden});
  const Tensor logits = host(testing::dense_forward_ref(a1, h.w2, h.b2, false), {g.n, g.classes});
  const testing::XentRef xent = testing::softmax_xent_ref(logits, h.labels);
  const Tensor dlogits = host(xent.dlogits, {g.n, g.classes});
  const testing::DenseGrads g2 = testing::dense_backward_ref(a1, h.w2, h.b2, false, dlogits);
  const testing::DenseGrads g1 =
      testing::dense_backward_ref(h.x, h.w1, h.b1, true, host(g2.dx, {g.n, g.hidden}));

  // FP32 starts the gradients at 0.25 to see them accumulate; FP16 at 0, since f16 values
  // near 0.25 carry 1e-4 of rounding, as much as a small gradient added to them.
  const float start = half ? 0.0f : 0.25f;
  const double k = loss_scale > 0 ? loss_scale : 1.0;
  const HeadRun r = run_head(g, h, half, start, loss_scale > 0 ? &loss_scale : nullptr);
  const Tol tol = half ? kFp16Tol : kFp32Tol;
  const Tol grad_tol{tol.atol * k, tol.rtol};
  EXPECT_TRUE(all_close(r.dx, scaled(g1.dx, k, 0), grad_tol)) << "dx";
  EXPECT_TRUE(all_close(r.dw1, scaled(g1.dw, k, start), grad_tol)) << "dW1";
  EXPECT_TRUE(all_close(r.db1, scaled(g1.db, k, start), grad_tol)) << "db1";
  EXPECT_TRUE(all_close(r.dw2, scaled(g2.dw, k, start), grad_tol)) << "dW2";
  EXPECT_TRUE(all_close(r.db2, scaled(g2.db, k, start), grad_tol)) << "db2";
  ASSERT_EQ(r.stats.size(), 3u);
  EXPECT_NEAR(r.stats[0], xent.loss_sum, (half ? 1e-2 : 1e-5) * xent.loss_sum) << "loss sum";
  EXPECT_NEAR(r.stats[1], static_cast<double>(xent.correct), half ? 1.0 : 0.0) << "correct";  // a near-tie may flip in f16
  EXPECT_EQ(r.stats[2], static_cast<float>(g.n));
}

// The model's head (1600 -> 64 -> 10) at one sample, an odd batch, the article's 64 and a
// partial last batch; a head with more units than a block has threads; a tiny odd one.
TEST(FusedGpu, HeadMatchesTheReference) {
  MF_SKIP_WITHOUT_GPU();
  for (bool half : {false, true}) {
    for (std::int64_t n : {1, 5, 64, 67}) check_head({n, 1600, 64, 10}, half, 10 + n);
    check_head({9, 40, 200, 32}, half, 2);
    check_head({3, 7, 13, 3}, half, 3);
  }
}

// dlogits carry the dynamic loss scale read on the device, and so does every gradient.
TEST(FusedGpu, HeadGradientsCarryTheLossScale) {
  MF_SKIP_WITHOUT_GPU();
  check_head({16, 1600, 64, 10}, false, 4, 8.0f);
  check_head({16, 1600, 64, 10}, true, 5, 1024.0f);
}

// Every sum has one thread and a fixed order: two launches give the same bits, whatever
// order the blocks run in (the emulation shuffles them).
TEST(FusedGpu, HeadGivesTheSameBitsAtEveryLaunch) {
  MF_SKIP_WITHOUT_GPU();
  const FusedHeadSizes g{67, 1600, 64, 10};
  Rng rng(6);
  const Head h = random_head(g, false, rng);
  const HeadRun a = run_head(g, h, false, 0.0f, nullptr), b = run_head(g, h, false, 0.0f, nullptr);
  for (const auto& [x, y] : {std::pair{&a.dx, &b.dx}, {&a.dw1, &b.dw1}, {&a.db1, &b.db1}, {&a.dw2, &b.dw2}})
    EXPECT_EQ(std::memcmp(x->raw(), y->raw(), static_cast<std::size_t>(x->numel()) * 4), 0);
  EXPECT_EQ(a.stats, b.stats);
}

TEST(FusedGpu, HeadTooLargeIsRefused) {
  MF_SKIP_WITHOUT_GPU();
  const FusedHeadSizes g{2, 8, kFusedHeadMaxHidden + 1, 10};
  try {
    launch_fused_head(g, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0.5f, nullptr, {}, nullptr, nullptr,
                      nullptr, nullptr, nullptr, nullptr, false, compute_stream());
    FAIL() << "a head of " << g.hidden << " units was launched";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("at most 256 hidden units"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mf
