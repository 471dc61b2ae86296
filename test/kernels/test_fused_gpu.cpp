// test_fused_gpu.cpp: the fused step's kernels (kernels/gpu/fused.h) against the naive
// double-precision references of test_util, FP32 and FP16, for the model's head and odd
// ones, whole and partial batches; their sums must give the same bits at every launch.
// Skipped without a GPU; test/emulator runs them on the CUDA emulation as
// Emulated.FusedGpu.* (`ctest -R Fused`).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
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

// ---- the convolutions ----

template <class T>
Tensor device_bytes(const std::vector<T>& v) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(v.size() * sizeof(T))}, DType::kU8);
  std::memcpy(t.raw(), v.data(), v.size() * sizeof(T));
  return t.to(Device::kGpu);
}

// The input of a convolution: for the first (from_dataset), a data set of random u8 images
// and labels, the batch taken through a permutation from row `offset` on, as the resident
// pipeline reads it; otherwise activations. x is the batch as the kernel sees it (host f32).
struct ConvInput {
  bool from_dataset;
  std::vector<std::uint8_t> images, labels;
  std::vector<std::int32_t> perm;
  std::int64_t offset = 2;
  Tensor x;
};

ConvInput conv_input(const FusedConvSizes& g, bool from_dataset, bool half, Rng& rng) {
  ConvInput d;
  d.from_dataset = from_dataset;
  if (!from_dataset) {
    d.x = testing::uniform({g.n, g.h, g.w, g.c}, -1, 1, rng);
    if (half) testing::round_to_half(d.x);
    return d;
  }
  const std::int64_t count = g.n + 3, size = g.h * g.w * g.c;
  d.images.resize(static_cast<std::size_t>(count * size));
  for (auto& p : d.images) p = rng.uniform01() < 0.3 ? 0 : static_cast<std::uint8_t>(rng.below(256));
  d.labels.resize(static_cast<std::size_t>(count));
  for (auto& l : d.labels) l = static_cast<std::uint8_t>(rng.below(10));
  d.perm.resize(static_cast<std::size_t>(count));
  std::iota(d.perm.begin(), d.perm.end(), 0);
  for (std::size_t i = d.perm.size() - 1; i > 0; --i) std::swap(d.perm[i], d.perm[rng.below(i + 1)]);
  d.x = Tensor::empty({g.n, g.h, g.w, g.c});
  for (std::int64_t s = 0; s < g.n; ++s)
    for (std::int64_t i = 0; i < size; ++i)
      d.x.data<float>()[s * size + i] = static_cast<float>(d.images[d.perm[d.offset + s] * size + i]) / 255.0f;
  return d;
}

struct ConvRun {
  Tensor pooled, dw, db, dx;
  std::vector<std::uint8_t> winners;
  std::vector<std::int32_t> labels;
  bool one_launch_same_bits = true;  // launch_fused_conv_backward matched the two launches
};

std::vector<std::uint8_t> bytes_of(const Tensor& device_u8, std::int64_t count) {
  const Tensor h = device_u8.to(Device::kCpu);
  const auto* p = static_cast<const std::uint8_t*>(h.raw());
  return std::vector<std::uint8_t>(p, p + count);
}

ConvRun run_conv(const FusedConvSizes& g, const ConvInput& d, const Tensor& w, const Tensor& b, const Tensor& dpool,
                 bool half, bool tensor_cores = false) {
  const DType dt = half ? DType::kF16 : DType::kF32;
  const std::int64_t ph = (g.h - 2) / 2, pw = (g.w - 2) / 2, outputs = g.n * ph * pw * g.filters;
  const Tensor wd = dev(w, dt), bd = dev(b, dt), dpd = dev(dpool, dt);
  Tensor pooled = Tensor::zeros({g.n, ph, pw, g.filters}, dt, Device::kGpu);
  Tensor winners = Tensor::zeros({outputs}, DType::kU8, Device::kGpu);
  Tensor dw = Tensor::zeros(w.shape(), dt, Device::kGpu), db = Tensor::zeros(b.shape(), dt, Device::kGpu);
  Tensor scratch = Tensor::zeros({static_cast<std::int64_t>(fused_conv_scratch_bytes(g))}, DType::kU8, Device::kGpu);
  auto* win = static_cast<std::uint8_t*>(winners.raw());
  auto* partials = static_cast<float*>(scratch.raw());
  ConvRun r;
  if (d.from_dataset) {
    const Tensor images = device_bytes(d.images), labels = device_bytes(d.labels), perm = device_bytes(d.perm);
    const Tensor offset = device_bytes(std::vector<std::int64_t>{d.offset});
    const FusedBatch batch{static_cast<const std::uint8_t*>(images.raw()), static_cast<const std::uint8_t*>(labels.raw()),
                           static_cast<const std::int32_t*>(perm.raw()), static_cast<const std::int64_t*>(offset.raw())};
    Tensor labels_out = Tensor::zeros({g.n}, DType::kI32, Device::kGpu);
    launch_fused_conv1_forward(g, batch, wd.raw(), bd.raw(), pooled.raw(), win, labels_out.data<std::int32_t>(), half,
                               compute_stream());
    launch_fused_conv1_wgrad_partials(g, batch, dpd.raw(), pooled.raw(), win, partials, half, compute_stream());
    const Tensor lab = labels_out.to(Device::kCpu);
    r.labels.assign(lab.data<std::int32_t>(), lab.data<std::int32_t>() + g.n);
  } else {
    const Tensor x = dev(d.x, dt);
    Tensor dx = Tensor::zeros(d.x.shape(), dt, Device::kGpu);
    launch_fused_conv_forward(g, x.raw(), wd.raw(), bd.raw(), pooled.raw(), win, half, tensor_cores, compute_stream());
    launch_fused_conv_wgrad_partials(g, x.raw(), dpd.raw(), pooled.raw(), win, partials, half, compute_stream());
    launch_fused_conv_dgrad(g, dpd.raw(), pooled.raw(), win, wd.raw(), dx.raw(), half, compute_stream());
    r.dx = back(dx);
    // What the step runs: both backward passes in one launch, the same bits as the two.
    Tensor dx_both = Tensor::zeros(d.x.shape(), dt, Device::kGpu);
    Tensor scratch_both = Tensor::zeros(scratch.shape(), DType::kU8, Device::kGpu);
    launch_fused_conv_backward(g, x.raw(), dpd.raw(), pooled.raw(), win, wd.raw(), dx_both.raw(),
                               static_cast<float*>(scratch_both.raw()), half, compute_stream());
    const Tensor dx_one = back(dx_both);
    r.one_launch_same_bits =
        std::memcmp(dx_one.raw(), r.dx.raw(), static_cast<std::size_t>(r.dx.numel()) * sizeof(float)) == 0 &&
        bytes_of(scratch_both, scratch.numel()) == bytes_of(scratch, scratch.numel());
  }
  const FusedWgradSum sum{g, partials, dw.raw(), db.raw()};
  launch_fused_conv_wgrad_sums(&sum, 1, nullptr, 0, nullptr, half, compute_stream());
  r.pooled = back(pooled);
  r.dw = back(dw);
  r.db = back(db);
  r.winners = bytes_of(winners, outputs);
  return r;
}

double rounded(double v, bool half) {
  const float f = static_cast<float>(v);
  return half ? static_cast<double>(round_to_half(f)) : f;
}

void check_conv(const FusedConvSizes& g, bool from_dataset, bool half, std::uint64_t seed, bool tensor_cores = false) {
  SCOPED_TRACE(std::string(half ? "f16" : "f32") + (from_dataset ? " conv1 (u8 data set)" : " conv (activations)") +
               (tensor_cores ? " on Tensor Cores" : "") +
               " n=" + std::to_string(g.n) + " " + std::to_string(g.h) + "x" + std::to_string(g.w) + "x" +
               std::to_string(g.c) + " K=" + std::to_string(g.filters));
  Rng rng(seed);
  const ConvInput d = conv_input(g, from_dataset, half, rng);
  Tensor w = testing::uniform({g.filters, 3, 3, g.c}, -0.5f, 0.5f, rng), b = testing::uniform({g.filters}, -0.3f, 0.3f, rng);
  const std::int64_t oh = g.h - 2, ow = g.w - 2, ph = oh / 2, pw = ow / 2;
  Tensor dpool = testing::uniform({g.n, ph, pw, g.filters}, -1, 1, rng);
  if (half) {
    for (Tensor* t : {&w, &b, &dpool}) testing::round_to_half(*t);
  }
  const ConvRun r = run_conv(g, d, w, b, dpool, half, tensor_cores);

  // Forward: the reference convolution with ReLU, rounded as the kernel stores it, pooled
  // here. Where two window outputs are within the tolerance of each other either may win:
  // the winner must hold the window's maximum to within it.
  const std::vector<double> conv = testing::conv2d_forward_ref(d.x, w, b, true);
  // TF32 keeps 10 of f32's 23 mantissa bits: each product's two inputs are rounded to within
  // 2^-11 relative, errors of either sign, so an output's error is about
  // 2^-11 * sqrt(2 * sum (x w)^2): ~2e-3 at c = 48 (432 products, |x w| <= 0.5).
  const Tol tol = half ? Tol{1e-3, 1e-2} : tensor_cores ? Tol{1e-2, 1e-2} : Tol{1e-5, 1e-4};
  std::vector<double> want(static_cast<std::size_t>(r.pooled.numel()));
  int wrong_winners = 0;
  Tensor dconv = Tensor::zeros({g.n, oh, ow, g.filters});  // dpool taken back to the conv's output
  for (std::int64_t s = 0; s < g.n; ++s)
    for (std::int64_t py = 0; py < ph; ++py)
      for (std::int64_t px = 0; px < pw; ++px)
        for (std::int64_t f = 0; f < g.filters; ++f) {
          const std::int64_t e = ((s * ph + py) * pw + px) * g.filters + f;
          std::int64_t at[4];
          double v[4];
          for (int q = 0; q < 4; ++q) {
            at[q] = ((s * oh + 2 * py + q / 2) * ow + 2 * px + q % 2) * g.filters + f;
            v[q] = rounded(conv[static_cast<std::size_t>(at[q])], half);
          }
          const double best = *std::max_element(v, v + 4);
          const int won = r.winners[static_cast<std::size_t>(e)];
          want[static_cast<std::size_t>(e)] = best;
          wrong_winners += won > 3 || std::abs(v[won] - best) > tol.atol + tol.rtol * std::abs(best);
          // Back through the kernel's own winner and ReLU (pooled > 0).
          if (won <= 3 && r.pooled.data<float>()[e] > 0.0f) dconv.data<float>()[at[won]] = dpool.data<float>()[e];
        }
  EXPECT_TRUE(all_close(r.pooled, want, tol)) << "pooled";
  EXPECT_EQ(wrong_winners, 0) << "winners not holding their window's maximum";
  for (std::size_t s = 0; s < r.labels.size(); ++s)
    EXPECT_EQ(r.labels[s], d.labels[static_cast<std::size_t>(d.perm[d.offset + static_cast<std::int64_t>(s)])]) << s;

  const testing::ConvGrads ref = testing::conv2d_backward_ref(d.x, w, b, false, dconv);
  const Tol grad_tol = half ? Tol{2e-2, 1e-2} : testing::fp32_reduction_tol(g.n * ph * pw);
  EXPECT_TRUE(all_close(r.dw, ref.dw, grad_tol)) << "dW";
  EXPECT_TRUE(all_close(r.db, ref.db, grad_tol)) << "db";
  if (!from_dataset) {
    EXPECT_TRUE(all_close(r.dx, ref.dx, half ? Tol{1e-2, 1e-2} : Tol{1e-5, 1e-4})) << "dx";
    EXPECT_TRUE(r.one_launch_same_bits) << "launch_fused_conv_backward against the dgrad and wgrad launches";
  }
}

// The model's first layer on MNIST-sized images (a batch of 9: three chunks of the weight
// gradient, the last one partial), colour images of odd sizes (the pooling drops a row and
// a column), the smallest image.
TEST(FusedGpu, Conv1MatchesTheReference) {
  MF_SKIP_WITHOUT_GPU();
  for (bool half : {false, true}) {
    check_conv({9, 28, 28, 1, 32}, true, half, 21);
    check_conv({3, 9, 8, 3, 8}, true, half, 22);
    check_conv({2, 4, 4, 2, 5}, true, half, 23);
  }
}

// The model's second layer (13x13x32 -> 11x11x64, pooled to 5x5: the last row and column
// are dropped), and odd sizes: fewer filters than a tile of 32, and more channels and
// filters than the forward holds at once (two chunks of channels, the last one partial;
// two tiles of filters, the last one partial), also with more pooled positions than the
// grid has warps, so that each warp takes several in turn and reloads every chunk of weights
// for each (64 positions: 4 rounds on the emulation's 8 SMs; a GPU with more SMs gives each
// warp fewer). The backward passes run as two launches and as the step's one
// (launch_fused_conv_backward), which must give the same bits.
TEST(FusedGpu, Conv2MatchesTheReference) {
  MF_SKIP_WITHOUT_GPU();
  for (bool half : {false, true}) {
    check_conv({5, 13, 13, 32, 64}, false, half, 31);
    check_conv({3, 8, 9, 5, 7}, false, half, 32);
    check_conv({2, 7, 6, 41, 37}, false, half, 33);
    check_conv({8, 19, 19, 41, 33}, false, half, 34);
  }
}

// Conv2's forward on Tensor Cores (fused_conv_tc.cu: TF32 in f32, half in f16): the
// model's layer (125 windows, the last tile of 16 rows holding one), more channels than a
// stage holds (48: a stage of 32 and one of 16), three groups of 32 filters, odd image
// sizes. The backward passes use its winners, so they are checked through it too. Sizes it
// does not take (channels not a multiple of its k step, filters not of 32) run on CUDA cores.
TEST(FusedGpu, Conv2OnTensorCoresMatchesTheReference) {
  MF_SKIP_WITHOUT_GPU();
  const FusedConvSizes model{5, 13, 13, 32, 64};
  for (bool half : {false, true}) {
    check_conv(model, false, half, 35, true);
    check_conv({3, 9, 10, 48, 32}, false, half, 36, true);
    check_conv({2, 6, 7, 16, 96}, false, half, 37, true);
    check_conv({3, 8, 9, 5, 7}, false, half, 32, true);  // CUDA cores
  }
  EXPECT_TRUE(fused_conv_takes_tensor_cores(model, nullptr, false));
  EXPECT_TRUE(fused_conv_takes_tensor_cores({2, 6, 7, 16, 96}, nullptr, true));
  EXPECT_FALSE(fused_conv_takes_tensor_cores({2, 6, 7, 8, 96}, nullptr, true));  // 8 channels: half's k is 16
  EXPECT_FALSE(fused_conv_takes_tensor_cores({2, 6, 7, 16, 48}, nullptr, false));
  const float* misaligned = reinterpret_cast<const float*>(std::uintptr_t{16});
  EXPECT_FALSE(fused_conv_takes_tensor_cores(model, misaligned, false));
}

// The same inputs on Tensor Cores give the same bits at every launch.
TEST(FusedGpu, Conv2OnTensorCoresGivesTheSameBitsAtEveryLaunch) {
  MF_SKIP_WITHOUT_GPU();
  const FusedConvSizes g{9, 13, 13, 32, 64};
  for (bool half : {false, true}) {
    SCOPED_TRACE(half ? "f16" : "f32");
    Rng rng(25);
    const ConvInput d = conv_input(g, false, half, rng);
    Tensor w = testing::uniform({g.filters, 3, 3, g.c}, -0.5f, 0.5f, rng);
    Tensor b = testing::uniform({g.filters}, -0.3f, 0.3f, rng);
    Tensor dpool = testing::uniform({g.n, 5, 5, g.filters}, -1, 1, rng);
    if (half) {
      for (Tensor* t : {&w, &b, &dpool}) testing::round_to_half(*t);
    }
    const ConvRun a = run_conv(g, d, w, b, dpool, half, true), c = run_conv(g, d, w, b, dpool, half, true);
    EXPECT_EQ(a.pooled.to_vector(), c.pooled.to_vector());
    EXPECT_EQ(a.winners, c.winners);
  }
}

TEST(FusedGpu, ConvolutionsGiveTheSameBitsAtEveryLaunch) {
  MF_SKIP_WITHOUT_GPU();
  for (bool from_dataset : {true, false}) {
    const FusedConvSizes g = from_dataset ? FusedConvSizes{13, 28, 28, 1, 32} : FusedConvSizes{9, 13, 13, 32, 64};
    Rng rng(24);
    const ConvInput d = conv_input(g, from_dataset, false, rng);
    const Tensor w = testing::uniform({g.filters, 3, 3, g.c}, -0.5f, 0.5f, rng);
    const Tensor b = testing::uniform({g.filters}, -0.3f, 0.3f, rng);
    const Tensor dpool = testing::uniform({g.n, (g.h - 2) / 2, (g.w - 2) / 2, g.filters}, -1, 1, rng);
    const ConvRun a = run_conv(g, d, w, b, dpool, false), c = run_conv(g, d, w, b, dpool, false);
    EXPECT_EQ(a.pooled.to_vector(), c.pooled.to_vector());
    EXPECT_EQ(a.winners, c.winners);
    EXPECT_EQ(a.dw.to_vector(), c.dw.to_vector());
    EXPECT_EQ(a.db.to_vector(), c.db.to_vector());
    if (!from_dataset) {
      EXPECT_EQ(a.dx.to_vector(), c.dx.to_vector());
    }
  }
}

// The weight gradients' second pass for the step's two convolutions in one launch: each
// parameter gets its layer's partial sums added in chunk order, in f32, onto what its
// gradient held (the host repeats that order, so the bits must match exactly, also in f16,
// rounded once at the end), the batch cursor moves on by the batch, and the optimizer's
// update count by one, stopping at 2^31 - 1 as launch_finish_step's does.
TEST(FusedGpu, WeightGradientSumsOfBothLayersInOneLaunch) {
  MF_SKIP_WITHOUT_GPU();
  for (bool half : {false, true}) {
    SCOPED_TRACE(half ? "f16" : "f32");
    const DType dt = half ? DType::kF16 : DType::kF32;
    const FusedConvSizes g[2] = {{9, 13, 13, 32, 64}, {9, 28, 28, 1, 32}};  // conv2 (3 chunks), conv1
    Rng rng(41);
    std::vector<Tensor> partials, dw, db, dw0, db0;
    FusedWgradSum sums[2];
    for (int l = 0; l < 2; ++l) {
      const std::int64_t params = g[l].filters * 9 * g[l].c + g[l].filters, chunks = (g[l].n + 3) / 4;
      ASSERT_EQ(fused_conv_scratch_bytes(g[l]), static_cast<std::size_t>(chunks * params) * sizeof(float));
      partials.push_back(testing::uniform({chunks, params}, -1, 1, rng));
      dw0.push_back(testing::uniform({g[l].filters, 3, 3, g[l].c}, -1, 1, rng));
      db0.push_back(testing::uniform({g[l].filters}, -1, 1, rng));
      if (half) {
        testing::round_to_half(dw0.back());
        testing::round_to_half(db0.back());
      }
    }
    std::vector<Tensor> partials_dev;
    for (int l = 0; l < 2; ++l) {
      partials_dev.push_back(dev(partials[l], DType::kF32));
      dw.push_back(dev(dw0[l], dt));
      db.push_back(dev(db0[l], dt));
      sums[l] = {g[l], partials_dev[l].data<float>(), dw[l].raw(), db[l].raw()};
    }
    Tensor cursor = device_bytes(std::vector<std::int64_t>{128});
    constexpr std::int32_t kMax = std::numeric_limits<std::int32_t>::max();
    Tensor count = device_bytes(std::vector<std::int32_t>{41}), top = device_bytes(std::vector<std::int32_t>{kMax});
    launch_fused_conv_wgrad_sums(sums, 2, static_cast<std::int64_t*>(cursor.raw()), 9,
                                 static_cast<std::int32_t*>(count.raw()), half, compute_stream());
    launch_fused_conv_wgrad_sums(nullptr, 0, nullptr, 0, static_cast<std::int32_t*>(top.raw()), half, compute_stream());
    for (int l = 0; l < 2; ++l) {
      SCOPED_TRACE("layer " + std::to_string(l));
      const std::int64_t n_w = dw0[l].numel(), params = partials[l].dim(1);
      const Tensor got_w = back(dw[l]), got_b = back(db[l]);
      std::int64_t wrong = 0;
      for (std::int64_t p = 0; p < params; ++p) {
        float acc = 0.0f;
        for (std::int64_t ch = 0; ch < partials[l].dim(0); ++ch) acc += partials[l].data<float>()[ch * params + p];
        const float start = p < n_w ? dw0[l].data<float>()[p] : db0[l].data<float>()[p - n_w];
        const float want = half ? round_to_half(start + acc) : start + acc;
        const float got = p < n_w ? got_w.data<float>()[p] : got_b.data<float>()[p - n_w];
        if (got != want && wrong++ < 3) ADD_FAILURE() << "parameter " << p << ": " << got << ", want " << want;
      }
      EXPECT_EQ(wrong, 0);
    }
    const Tensor c = cursor.to(Device::kCpu);
    std::int64_t moved = 0;
    std::memcpy(&moved, c.raw(), sizeof(moved));
    EXPECT_EQ(moved, 128 + 9);
    for (const auto& [t, want] : {std::pair{&count, 42}, {&top, kMax}}) {
      const Tensor h = t->to(Device::kCpu);
      std::int32_t got = 0;
      std::memcpy(&got, h.raw(), sizeof(got));
      EXPECT_EQ(got, want) << "update count";
    }
  }
  try {
    launch_fused_conv_wgrad_sums(nullptr, 3, nullptr, 0, nullptr, false, compute_stream());
    FAIL() << "three layers were summed in a launch made for two";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("3 layers in one launch (at most 2)"), std::string::npos) << e.what();
  }
}

TEST(FusedGpu, ConvolutionTooSmallIsRefused) {
  MF_SKIP_WITHOUT_GPU();
  try {
    launch_fused_conv_forward({1, 3, 5, 1, 4}, nullptr, nullptr, nullptr, nullptr, nullptr, false, false, compute_stream());
    FAIL() << "a 3x5 input was convolved";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("3x5x1 leave no 2x2 pooling window"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mf
