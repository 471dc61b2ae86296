// test_layers_cpu.cpp: every CPU layer's forward and backward against the naive double-precision
// references of test_util.h, on several shapes, with 1 and 2 threads; gradient accumulation,
// switched-off input gradients, buffer reuse and the argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "layers/conv2d.h"
#include "kernels/cpu/conv2d_cpu_kernels.h"
#include "kernels/kernel_options.h"
#include "layers/dense.h"
#include "layers/flatten.h"
#include "layers/maxpool2d.h"
#include "layers/softmax_xent.h"
#include "runtime/parallel.h"
#include "tensor/rng.h"
#include "test/test_util.h"

namespace {

using mf::Activation;
using mf::DType;
using mf::Shape;
using mf::Tensor;
using mf::testing::all_close;
using mf::testing::labels_of;
using mf::testing::nmse;
using mf::testing::Tol;
using mf::testing::uniform;

// Forward: each output is a sum of at most a few hundred float products of size <= 1 (inputs
// in [-1, 1], Glorot weights below 0.1 for the big layers); float rounding is ~sqrt(terms) *
// 6e-8 * |sum|, ~1e-6 at worst here. The STYLE.md FP32 default; the largest error seen over
// every CPU path is 4% of this bound.
constexpr Tol kFwdTol{1e-5, 1e-4};
// Data gradients (dx) are sums of k*k*K (conv) or `units` (dense) products: the same size of
// reduction as the forward, so the same tolerance (largest error seen: 3% of it).
constexpr Tol kDxTol{1e-5, 1e-4};
// Weight gradients are reductions over the batch and every output pixel (up to 5*26*26 =
// 3380 terms), some summed in one running float per thread: test_util's fp32_reduction_tol,
// whose absolute part grows with sqrt(terms). The largest error seen over every path is 3.4%
// of that bound. The NMSE bound (relative RMS error 1e-5) is the STYLE.md FP32 default; the
// observed values are 1e-15 .. 4e-13.
constexpr double kGradNmse = 1e-10;

// Results computed with 1 and with 2 threads differ only by summation order (per-thread partial
// sums of the weight gradients, GEMM blocks that start at other images): relative 1e-6 of the
// largest value, ~10 float ulps.
::testing::AssertionResult agree(const Tensor& a, const Tensor& b) {
  const std::vector<double> va = mf::testing::to_double(a), vb = mf::testing::to_double(b);
  double scale = 0;
  for (double v : vb) scale = std::max(scale, std::fabs(v));
  return all_close(va, vb, Tol{1e-6 * scale, 1e-6});
}

std::vector<double> doubled(std::vector<double> v) {
  for (double& x : v) x *= 2;
  return v;
}

// Runs a test body with 1 and with 2 threads in the process pool; restores the pool after.
class LayerCpu : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    saved_ = mf::num_threads();
    mf::set_num_threads(GetParam());
  }
  void TearDown() override { mf::set_num_threads(saved_); }

 private:
  int saved_ = 1;
};
std::string threads_name(const ::testing::TestParamInfo<int>& info) {
  return "threads" + std::to_string(info.param);
}

// ---- the references themselves, on numbers worked out by hand ------------------------------

TEST(NaiveReference, Conv2dOnAHandComputedExample) {
  // x: one 3x3 image with 2 channels, x[i][j] = (c0, c1) = (v, -v) with v = 1..9 row-major
  std::vector<float> xv;
  for (int v = 1; v <= 9; ++v) xv.push_back(static_cast<float>(v)), xv.push_back(static_cast<float>(-v));
  const Tensor x = Tensor::from_vector({1, 3, 3, 2}, xv);
  // one 2x2 filter (K, k, k, C): tap (0,0) = (1, 0), tap (1,1) = (0, 2), the others zero,
  // so y[i][j] = x[i][j].c0 + 2 * x[i+1][j+1].c1 + b = v(i,j) - 2 v(i+1,j+1) + b
  const Tensor w = Tensor::from_vector({1, 2, 2, 2}, {1, 0, 0, 0, 0, 0, 0, 2});
  const Tensor b = Tensor::from_vector({1}, {10});
  // v(i+1,j+1) = v(i,j) + 4: y = -v - 8 + 10 = 2 - v  -> v = 1, 2, 4, 5
  EXPECT_EQ(mf::testing::conv2d_forward_ref(x, w, b, false), (std::vector<double>{1, 0, -2, -3}));
  EXPECT_EQ(mf::testing::conv2d_forward_ref(x, w, b, true), (std::vector<double>{1, 0, 0, 0}));
  // backward with dy = 1 everywhere, no ReLU: db = 4; dw(tap, c) = sum of the inputs under
  // that tap: tap (0,0) sees v = 1,2,4,5 (sum 12), tap (0,1) 2,3,5,6 (16), tap (1,0)
  // 4,5,7,8 (24), tap (1,1) 5,6,8,9 (28); channel 1 is the negative.
  const Tensor dy = Tensor::from_vector({1, 2, 2, 1}, {1, 1, 1, 1});
  const auto g = mf::testing::conv2d_backward_ref(x, w, b, false, dy);
  EXPECT_EQ(g.db, std::vector<double>{4});
  EXPECT_EQ(g.dw, (std::vector<double>{12, -12, 16, -16, 24, -24, 28, -28}));
  // dx: channel 0 gets w(0,0,c0) = 1 at each output's top-left input (v = 1,2,4,5);
  // channel 1 gets w(1,1,c1) = 2 at each bottom-right one (v = 5,6,8,9)
  std::vector<double> dx(18, 0.0);
  for (int p : {0, 1, 3, 4}) dx[p * 2] = 1;
  for (int p : {4, 5, 7, 8}) dx[p * 2 + 1] = 2;
  EXPECT_EQ(g.dx, dx);
  // with ReLU only output (0,0) (y = 1 > 0) passes the gradient; (0,1) has y = 0: blocked.
  // Its window holds v = 1, 2 / 4, 5, so dw is those inputs (channel 1 negated), and dx is
  // the filter placed at the top-left.
  const auto gr = mf::testing::conv2d_backward_ref(x, w, b, true, dy);
  EXPECT_EQ(gr.db, std::vector<double>{1});
  EXPECT_EQ(gr.dw, (std::vector<double>{1, -1, 2, -2, 4, -4, 5, -5}));
  std::vector<double> dxr(18, 0.0);
  dxr[0] = 1;          // x(0,0).c0 under tap (0,0)
  dxr[4 * 2 + 1] = 2;  // x(1,1).c1 under tap (1,1)
  EXPECT_EQ(gr.dx, dxr);
}

TEST(NaiveReference, MaxPoolDenseAndXentOnHandComputedExamples) {
  // 3x3 single-channel: the last row and column are dropped; window {1, 5, 4, 2} -> 5
  const Tensor x = Tensor::from_vector({1, 3, 3, 1}, {1, 5, 9, 4, 2, 9, 9, 9, 9});
  EXPECT_EQ(mf::testing::maxpool_forward_ref(x), std::vector<double>{5});
  const Tensor dy = Tensor::from_vector({1, 1, 1, 1}, {3});
  EXPECT_EQ(mf::testing::maxpool_backward_ref(x, dy), (std::vector<double>{0, 3, 0, 0, 0, 0, 0, 0, 0}));
  // ties: first in (row, column) order wins
  const Tensor t = Tensor::from_vector({1, 2, 2, 1}, {7, 7, 7, 7});
  EXPECT_EQ(mf::testing::maxpool_backward_ref(t, dy), (std::vector<double>{3, 0, 0, 0}));

  // dense: x (1, 2), w (2, 3) = [[1, 2, 3], [4, 5, 6]], b = (0.5, -100, 0)
  const Tensor dx_in = Tensor::from_vector({1, 2}, {1, -1});
  const Tensor w = Tensor::from_vector({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor b = Tensor::from_vector({3}, {0.5f, -100, 0});
  EXPECT_EQ(mf::testing::dense_forward_ref(dx_in, w, b, false), (std::vector<double>{-2.5, -103, -3}));
  const Tensor ddy = Tensor::from_vector({1, 3}, {1, 2, 3});
  const auto g = mf::testing::dense_backward_ref(dx_in, w, b, false, ddy);
  EXPECT_EQ(g.db, (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(g.dw, (std::vector<double>{1, 2, 3, -1, -2, -3}));
  EXPECT_EQ(g.dx, (std::vector<double>{1 + 4 + 9, 4 + 10 + 18}));
  const auto gr = mf::testing::dense_backward_ref(dx_in, w, b, true, ddy);  // every output <= 0
  EXPECT_EQ(gr.dx, (std::vector<double>{0, 0}));

  // xent: logits (0, 0) -> p = (1/2, 1/2), loss ln 2; two rows, label 0 and 1, mean gradient
  const Tensor z = Tensor::from_vector({2, 2}, {0, 0, 0, std::log(3.0f)});
  Tensor lab = Tensor::empty({2}, DType::kI32);
  lab.data<std::int32_t>()[0] = 0;
  lab.data<std::int32_t>()[1] = 1;
  const auto r = mf::testing::softmax_xent_ref(z, lab);
  // row 1: p = (1/4, 3/4), loss ln(4/3)
  EXPECT_NEAR(r.loss_sum, std::log(2.0) + std::log(4.0 / 3.0), 1e-7);
  EXPECT_EQ(r.correct, 2);  // row 0 is a tie, first index 0 = label
  EXPECT_NEAR(r.dlogits[0], (0.5 - 1) / 2, 1e-12);
  EXPECT_NEAR(r.dlogits[1], 0.5 / 2, 1e-12);
  EXPECT_NEAR(r.dlogits[2], 0.25 / 2, 1e-7);
  EXPECT_NEAR(r.dlogits[3], (0.75 - 1) / 2, 1e-7);
}

// ---- Conv2D ---------------------------------------------------------------------------------

struct ConvCase {
  std::int64_t n, h, w, c, filters, k;
  bool relu;
  bool input_grad = true;  // false: the first layer's case, no dx
  double dy_zeros = 0;     // fraction of dy's entries set to zero, as ReLU and max-pooling leave it
};

// The tuned rung's options with cpu_sparse_below = v: 2 makes the CPU backward take its
// sparse kernels wherever they apply, 0 never.
mf::KernelOptions sparse_below(double v) {
  mf::KernelOptions k;
  k.cpu_sparse_below = v;
  return k;
}

// dy with about `zeros` of its entries zero, and its last output row entirely zero (the row
// a 2x2 pooling of an odd height drops).
Tensor sparse_gradient(const Shape& shape, double zeros, mf::Rng& rng) {
  Tensor dy = uniform(shape, -1, 1, rng);
  float* p = dy.data<float>();
  for (std::int64_t i = 0; i < dy.numel(); ++i)
    if (rng.uniform01() < zeros) p[i] = 0.0f;
  const std::int64_t row = shape[2] * shape[3];
  for (std::int64_t n = 0; n < shape[0]; ++n)
    std::fill(p + ((n + 1) * shape[1] - 1) * row, p + (n + 1) * shape[1] * row, 0.0f);
  return dy;
}

void check_conv(const ConvCase& cc, std::uint64_t seed, const mf::KernelOptions& options = {}) {
  SCOPED_TRACE("Conv2D N=" + std::to_string(cc.n) + " " + std::to_string(cc.h) + "x" + std::to_string(cc.w) +
               " C=" + std::to_string(cc.c) + " K=" + std::to_string(cc.filters) + " k=" + std::to_string(cc.k) +
               (cc.relu ? " relu" : " linear") + (cc.input_grad ? "" : " no dx") +
               " dy zeros=" + std::to_string(cc.dy_zeros) +
               " sparse below=" + std::to_string(options.cpu_sparse_below) +
               " threads=" + std::to_string(mf::num_threads()));
  mf::Rng rng(seed);
  mf::Conv2D conv(cc.c, cc.filters, cc.k, cc.relu ? Activation::kRelu : Activation::kNone, rng);
  conv.set_kernel_options(options);
  conv.set_needs_input_grad(cc.input_grad);
  // a non-zero bias, so that adding it (and ReLU cutting below it) is tested
  conv.bias().value.copy_from(uniform({cc.filters}, -0.3f, 0.3f, rng));
  const Tensor& w = conv.weight().value;
  const Tensor& b = conv.bias().value;
  const Tensor x = uniform({cc.n, cc.h, cc.w, cc.c}, -1, 1, rng);
  const Tensor y = conv.forward(x).clone();
  ASSERT_EQ(y.shape(), Shape({cc.n, cc.h - cc.k + 1, cc.w - cc.k + 1, cc.filters}));
  EXPECT_TRUE(all_close(y, mf::testing::conv2d_forward_ref(x, w, b, cc.relu), kFwdTol));
  if (cc.relu) {  // the ReLU path must actually have cut something (else it is untested)
    int zeros = 0;
    for (float v : y.to_vector()) zeros += v == 0.0f;
    EXPECT_GT(zeros, 0);
    EXPECT_LT(zeros, y.numel());
  }

  const Tensor dy = cc.dy_zeros > 0 ? sparse_gradient(y.shape(), cc.dy_zeros, rng) : uniform(y.shape(), -1, 1, rng);
  const Tensor dx = conv.backward(dy);
  const auto ref = mf::testing::conv2d_backward_ref(x, w, b, cc.relu, dy);
  if (cc.input_grad) {
    ASSERT_TRUE(dx.defined());
    EXPECT_EQ(dx.shape(), x.shape());
    EXPECT_TRUE(all_close(dx, ref.dx, kDxTol));
  } else {
    EXPECT_FALSE(dx.defined());
  }
  const std::int64_t terms = cc.n * y.dim(1) * y.dim(2);
  EXPECT_TRUE(all_close(conv.weight().grad, ref.dw, mf::testing::fp32_reduction_tol(terms)));
  EXPECT_LE(nmse(conv.weight().grad, ref.dw), kGradNmse);
  EXPECT_TRUE(all_close(conv.bias().grad, ref.db, mf::testing::fp32_reduction_tol(terms)));
  EXPECT_LE(nmse(conv.bias().grad, ref.db), kGradNmse);

  // Every path accumulates: a second backward doubles the parameter gradients (within the
  // same bound, doubled) and writes the same dx.
  const Tensor dx1 = dx.defined() ? dx.clone() : Tensor();
  const Tensor& dx2 = conv.backward(dy);
  if (cc.input_grad) {
    EXPECT_EQ(dx2.to_vector(), dx1.to_vector());
  }
  const Tol twice_tol{2 * mf::testing::fp32_reduction_tol(terms).atol, 1e-4};
  EXPECT_TRUE(all_close(conv.weight().grad, doubled(ref.dw), twice_tol)) << "second backward";
  EXPECT_TRUE(all_close(conv.bias().grad, doubled(ref.db), twice_tol)) << "second backward";
}

TEST_P(LayerCpu, Conv2dFirstLayerShape28x28) {
  check_conv({1, 28, 28, 1, 32, 3, true}, 1);
  check_conv({5, 28, 28, 1, 32, 3, true}, 2);  // 5 images: does not divide by 2 threads
}
TEST_P(LayerCpu, Conv2dSecondLayerShape13x13) {
  check_conv({3, 13, 13, 32, 64, 3, true}, 3);
  check_conv({2, 13, 13, 32, 64, 3, false}, 4);
}
TEST_P(LayerCpu, Conv2dOddSizes) {
  check_conv({5, 7, 9, 3, 5, 3, true}, 5);
  check_conv({5, 7, 9, 3, 5, 3, false}, 6);
  check_conv({1, 7, 9, 3, 5, 3, false}, 7);
  check_conv({3, 6, 5, 2, 3, 5, true}, 8);   // kernel 5 on a 6x5 input: one output column
  check_conv({2, 3, 3, 4, 7, 3, false}, 9);  // kernel as big as the input: 1x1 output
}
TEST_P(LayerCpu, Conv2dKernel1) {
  check_conv({2, 5, 6, 4, 6, 1, false}, 10);
  check_conv({3, 5, 6, 4, 6, 1, true}, 11);
}
// The CPU convolution has several code paths, chosen by kk*C (inputs per output) and K
// (filters): a direct loop for kkC <= 32 (specialised for a 3x3 kernel on 1 channel with
// K = 32, for K = 32, for K = 64, and general), implicit GEMM tiles for K a multiple of 16
// (16, 32 or 64 filters per tile; data-gradient tiles of 16, 32 or 64 inputs, needing k*C a
// multiple of 16), a first-layer weight gradient (3x3, 1 channel, K = 32) without dx, and an
// im2col + Eigen GEMM fallback. Each of these is run here at least once.
TEST_P(LayerCpu, Conv2dEveryCpuPath) {
  check_conv({5, 28, 28, 1, 32, 3, true, false}, 13);   // the model's first layer: direct 3x3x1, no dx
  check_conv({3, 12, 11, 1, 32, 3, false, false}, 14);  // the same, linear, odd size
  check_conv({3, 9, 8, 3, 32, 3, true}, 15);            // direct, K = 32, kkC = 27
  check_conv({2, 7, 7, 2, 64, 3, false}, 16);           // direct, K = 64, kkC = 18
  check_conv({2, 6, 9, 1, 100, 3, true}, 17);           // direct, general K
  check_conv({1, 5, 4, 1, 1024, 3, true}, 24);          // direct, the largest K it takes
  check_conv({2, 8, 9, 16, 16, 3, true}, 18);           // implicit, 16-filter tiles; dgrad run 48 (16-wide)
  check_conv({2, 9, 9, 8, 48, 5, true}, 19);            // implicit forward (48 = 3 x 16), Eigen backward (k*C = 40)
  check_conv({2, 9, 9, 8, 48, 5, true, false}, 20);     // implicit weight gradient without dx
  check_conv({3, 6, 7, 64, 32, 3, true}, 21);           // implicit, 32-filter tiles; dgrad run 192 (64-wide)
  check_conv({2, 5, 6, 4, 128, 3, false, false}, 22);   // implicit, 64-filter tiles (kkC = 36), no dx
  check_conv({2, 5, 6, 4, 128, 3, false}, 23);          // ... with dx: Eigen backward (k*C = 12)
}

// The sparse backward kernels (weight and data gradients from each pixel's nonzero dz
// entries) against the reference: the model's second layer with a gradient as sparse as
// training gives it, receptive-field rows of 48 and 96 floats (whole and partial chunks of
// vectors), a dense gradient forced through them, an all-zero gradient, and a k*C they do
// not take (40: falls back to the dense kernels). The dense kernels on the same sparse
// gradients, for comparison.
TEST_P(LayerCpu, Conv2dSparseGradients) {
  for (const double below : {2.0, 0.0}) {
    const mf::KernelOptions sparse = sparse_below(below);
    check_conv({3, 13, 13, 32, 64, 3, true, true, 0.8}, 40, sparse);   // the model's conv2d_1
    check_conv({2, 13, 13, 32, 64, 3, true, false, 0.8}, 41, sparse);  // ... without dx
    check_conv({2, 8, 9, 16, 16, 3, false, true, 0.75}, 42, sparse);   // run 48, 16 filters
    check_conv({2, 6, 7, 64, 32, 3, true, true, 0.9}, 43, sparse);     // run 192
    check_conv({3, 13, 13, 32, 64, 3, true, true, 0.0}, 44, sparse);   // dense dy
    check_conv({2, 7, 7, 16, 32, 3, false, true, 1.0}, 45, sparse);    // nothing nonzero
    check_conv({2, 9, 9, 8, 48, 5, true, true, 0.8}, 46, sparse);      // k*C = 40: not sparse
    check_conv({1, 13, 13, 32, 64, 3, true, true, 0.8}, 49, sparse);   // one image: a thread without any
  }
}

// The default threshold picks per batch: a gradient as sparse as training's takes the sparse
// kernels, a dense one the tiles, and both give the same numbers.
TEST_P(LayerCpu, Conv2dSparseAndDenseKernelsAgree) {
  Tensor dx[2], dw[2];
  for (int i = 0; i < 2; ++i) {
    mf::Rng rng(47);
    mf::Conv2D conv(32, 64, 3, Activation::kRelu, rng);
    conv.set_kernel_options(sparse_below(i == 0 ? 2.0 : 0.0));
    const Tensor x = uniform({4, 13, 13, 32}, -1, 1, rng);
    conv.forward(x);
    dx[i] = conv.backward(sparse_gradient({4, 11, 11, 64}, 0.8, rng)).clone();
    dw[i] = conv.weight().grad.clone();
  }
  EXPECT_TRUE(agree(dx[0], dx[1]));
  EXPECT_TRUE(agree(dw[0], dw[1]));
}

// Fills a stretch of the stack with ones, so that a kernel reading stale stack bytes
// (a mask spilled in 16 bits and counted in 32, as GCC 12 compiled pack_nonzeros under
// ThreadSanitizer) finds them set rather than zero.
__attribute__((noinline)) void dirty_the_stack() {
  volatile unsigned char junk[8192];
  for (auto& b : junk) b = 0xff;
}

// pack_nonzeros, the list behind the sparse gradients: its count is the number of nonzero
// entries (NaN and inf included, -0.0 not), the listed entries are those in order, and it
// writes at most kLanes slots past them. Rows of each length up to 70 (whole vectors and a
// scalar tail), with several patterns of zeros.
TEST(CpuKernels, PackNonzerosListsEachNonzeroEntryOnce) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  constexpr float kSentinel = 12345.0f;
  for (std::int64_t k = 1; k <= 70; ++k) {
    for (int pattern = 0; pattern < 5; ++pattern) {
      std::vector<float> row(static_cast<std::size_t>(k));
      for (std::int64_t o = 0; o < k; ++o) {
        const float v = 1.0f + static_cast<float>(o);
        switch (pattern) {
          case 0: row[o] = v; break;                                      // no zeros
          case 1: row[o] = 0.0f; break;                                   // all zeros
          case 2: row[o] = o % 3 == 1 ? v : (o % 2 ? -0.0f : 0.0f); break;  // a third
          case 3: row[o] = o % 5 == 0 ? nan : (o % 7 == 0 ? -inf : v); break;
          default: row[o] = o == k - 1 ? -v : 0.0f; break;                // the last only
        }
      }
      std::vector<std::int32_t> want_idx;
      for (std::int64_t o = 0; o < k; ++o)
        if (!(row[o] == 0.0f)) want_idx.push_back(static_cast<std::int32_t>(o));
      const std::size_t room = static_cast<std::size_t>(k + 2 * mf::cpu::kLanes);
      std::vector<std::int32_t> idx(room, -7);
      std::vector<float> val(room, kSentinel);
      dirty_the_stack();
      const int n = mf::cpu::pack_nonzeros(row.data(), k, idx.data(), val.data());
      SCOPED_TRACE("k=" + std::to_string(k) + " pattern " + std::to_string(pattern));
      ASSERT_EQ(n, static_cast<int>(want_idx.size()));
      for (int e = 0; e < n; ++e) {
        ASSERT_EQ(idx[e], want_idx[e]) << "entry " << e;
        const float want = row[want_idx[e]];
        if (std::isnan(want)) EXPECT_TRUE(std::isnan(val[e])) << "entry " << e;
        else EXPECT_EQ(val[e], want) << "entry " << e;
      }
      for (std::size_t i = static_cast<std::size_t>(n) + mf::cpu::kLanes; i < room; ++i) {
        ASSERT_EQ(idx[i], -7) << "written past the entries and the kLanes slots after them, at " << i;
        ASSERT_EQ(val[i], kSentinel) << "written past the entries and the kLanes slots after them, at " << i;
      }
    }
  }
}

// NaN and inf in a sparse gradient reach the weight and data gradients, as in the dense path.
TEST_P(LayerCpu, Conv2dSparseGradientKeepsNonFiniteValues) {
  mf::Rng rng(48);
  mf::Conv2D conv(32, 64, 3, Activation::kNone, rng);
  conv.set_kernel_options(sparse_below(2.0));
  conv.forward(uniform({2, 5, 5, 32}, -1, 1, rng));
  Tensor dy = Tensor::zeros({2, 3, 3, 64});
  dy.data<float>()[64 * 4 + 5] = std::numeric_limits<float>::quiet_NaN();
  const Tensor& dx = conv.backward(dy);
  int nan_dx = 0, nan_dw = 0;
  for (float v : dx.to_vector()) nan_dx += std::isnan(v);
  for (float v : conv.weight().grad.to_vector()) nan_dw += std::isnan(v);
  EXPECT_EQ(nan_dx, 9 * 32);  // the receptive field of one pixel, every channel
  EXPECT_EQ(nan_dw, 9 * 32);  // filter 5's whole row
}

// Many images per GEMM block (4x4 outputs: 32 images per 512-row block) and a batch that
// ends inside a block.
TEST_P(LayerCpu, Conv2dManySmallImagesPerBlock) { check_conv({37, 6, 6, 3, 8, 3, true}, 12); }

TEST_P(LayerCpu, Conv2dGradientsAccumulateAndDxIsOverwritten) {
  mf::Rng rng(20);
  mf::Conv2D conv(3, 5, 3, Activation::kRelu, rng);
  conv.bias().value.copy_from(uniform({5}, -0.3f, 0.3f, rng));
  const Tensor x = uniform({3, 8, 7, 3}, -1, 1, rng);
  const Tensor y = conv.forward(x).clone();
  const Tensor dy = uniform(y.shape(), -1, 1, rng);
  const Tensor dx1 = conv.backward(dy).clone();
  const Tensor dw1 = conv.weight().grad.clone(), db1 = conv.bias().grad.clone();
  const Tensor dx2 = conv.backward(dy).clone();
  EXPECT_EQ(dx2.to_vector(), dx1.to_vector()) << "dx is written, not accumulated";
  std::vector<double> twice = mf::testing::to_double(dw1);
  for (double& v : twice) v *= 2;
  // 2 * s vs (s1 + s2) + s1 + s2 in float: a few ulps
  EXPECT_TRUE(all_close(conv.weight().grad, twice, Tol{1e-6, 1e-6}));
  std::vector<double> twice_b = mf::testing::to_double(db1);
  for (double& v : twice_b) v *= 2;
  EXPECT_TRUE(all_close(conv.bias().grad, twice_b, Tol{1e-6, 1e-6}));
  // a second forward does not touch the accumulated gradients
  conv.forward(x);
  EXPECT_TRUE(all_close(conv.weight().grad, twice, Tol{1e-6, 1e-6}));
}

TEST_P(LayerCpu, Conv2dWithoutInputGradient) {
  mf::Rng rng(21);
  mf::Conv2D conv(2, 4, 3, Activation::kRelu, rng);
  conv.bias().value.copy_from(uniform({4}, -0.3f, 0.3f, rng));
  conv.set_needs_input_grad(false);
  const Tensor x = uniform({3, 9, 8, 2}, -1, 1, rng);
  const Tensor y = conv.forward(x).clone();
  const Tensor dy = uniform(y.shape(), -1, 1, rng);
  const Tensor& dx = conv.backward(dy);
  EXPECT_FALSE(dx.defined());
  const auto ref = mf::testing::conv2d_backward_ref(x, conv.weight().value, conv.bias().value, true, dy);
  EXPECT_TRUE(all_close(conv.weight().grad, ref.dw, mf::testing::fp32_reduction_tol(3 * 7 * 6)));
  EXPECT_TRUE(all_close(conv.bias().grad, ref.db, mf::testing::fp32_reduction_tol(3 * 7 * 6)));
}

// The layer keeps its output and gradient buffers; a smaller (last) batch reuses the front
// of them and must still be right, with nothing left over from the bigger batch.
TEST_P(LayerCpu, Conv2dSmallerSecondBatchReusesBuffers) {
  mf::Rng rng(22);
  mf::Conv2D conv(3, 4, 3, Activation::kNone, rng);
  const Tensor big = uniform({6, 9, 9, 3}, -1, 1, rng);
  const void* y_buffer = conv.forward(big).raw();
  const void* dx_buffer = conv.backward(uniform({6, 7, 7, 4}, -1, 1, rng)).raw();
  conv.weight().grad.fill_zero();
  conv.bias().grad.fill_zero();
  const Tensor small = uniform({2, 9, 9, 3}, -1, 1, rng);
  const Tensor& y = conv.forward(small);
  EXPECT_EQ(y.raw(), y_buffer);
  EXPECT_EQ(y.shape(), Shape({2, 7, 7, 4}));
  EXPECT_TRUE(all_close(y, mf::testing::conv2d_forward_ref(small, conv.weight().value, conv.bias().value, false),
                        kFwdTol));
  const Tensor dy = uniform({2, 7, 7, 4}, -1, 1, rng);
  const Tensor& dx = conv.backward(dy);
  EXPECT_EQ(dx.raw(), dx_buffer);
  const auto ref = mf::testing::conv2d_backward_ref(small, conv.weight().value, conv.bias().value, false, dy);
  EXPECT_TRUE(all_close(dx, ref.dx, kDxTol));
  EXPECT_TRUE(all_close(conv.weight().grad, ref.dw, mf::testing::fp32_reduction_tol(2 * 49)));
}

TEST(LayerCpuThreads, Conv2dOneAndTwoThreadsAgree) {
  const int saved = mf::num_threads();
  Tensor y[2], dx[2], dw[2], db[2];
  for (int t = 0; t < 2; ++t) {
    mf::set_num_threads(t + 1);
    mf::Rng rng(30);
    mf::Conv2D conv(32, 64, 3, Activation::kRelu, rng);
    conv.bias().value.copy_from(uniform({64}, -0.3f, 0.3f, rng));
    const Tensor x = uniform({5, 13, 13, 32}, -1, 1, rng);
    y[t] = conv.forward(x).clone();
    dx[t] = conv.backward(uniform(y[t].shape(), -1, 1, rng)).clone();
    dw[t] = conv.weight().grad.clone();
    db[t] = conv.bias().grad.clone();
  }
  mf::set_num_threads(saved);
  EXPECT_TRUE(agree(y[1], y[0]));
  EXPECT_TRUE(agree(dx[1], dx[0]));
  EXPECT_TRUE(agree(dw[1], dw[0]));
  EXPECT_TRUE(agree(db[1], db[0]));
}

// ---- MaxPool2D ------------------------------------------------------------------------------

void check_maxpool(std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c, std::uint64_t seed) {
  SCOPED_TRACE("MaxPool2D " + Shape({n, h, w, c}).str() + " threads=" + std::to_string(mf::num_threads()));
  mf::Rng rng(seed);
  mf::MaxPool2D pool;
  const Tensor x = uniform({n, h, w, c}, -1, 1, rng);
  const Tensor& y = pool.forward(x);
  ASSERT_EQ(y.shape(), Shape({n, h / 2, w / 2, c}));
  // no arithmetic: exact
  EXPECT_TRUE(all_close(y, mf::testing::maxpool_forward_ref(x), Tol{0, 0}));
  const Tensor dy = uniform(y.shape(), -1, 1, rng);
  const Tensor& dx = pool.backward(dy);
  ASSERT_EQ(dx.shape(), x.shape());
  EXPECT_TRUE(all_close(dx, mf::testing::maxpool_backward_ref(x, dy), Tol{0, 0}));
}

TEST_P(LayerCpu, MaxPoolForwardBackwardExact) {
  check_maxpool(5, 26, 26, 32, 40);  // the model's first pool
  check_maxpool(3, 11, 11, 64, 41);  // the second: odd size, last row and column dropped
  check_maxpool(2, 13, 11, 3, 42);   // odd H and W
  check_maxpool(1, 2, 2, 1, 43);
  check_maxpool(7, 3, 5, 5, 44);
}

TEST_P(LayerCpu, MaxPoolTiesGoToTheFirstPosition) {
  // Each window's four values in (row, column) order; equal maxima at various positions.
  const std::vector<std::vector<float>> windows = {
      {2, 2, 2, 2},   // all equal: position 0
      {1, 3, 3, 0},   // 1 and 2 tie: 1
      {0, 1, 5, 5},   // 2 and 3 tie: 2
      {4, 0, 0, 4},   // 0 and 3 tie: 0
      {-1, -1, -2, -1},  // negative ties: 0
      {0, 0, 0, 1},   // unique max at 3
      {-0.0f, 0.0f, -0.0f, 0.0f}};  // +0 == -0: position 0
  const std::int64_t c = static_cast<std::int64_t>(windows.size());
  const Tensor x = mf::testing::maxpool_windows(windows, c);  // one channel per window
  mf::MaxPool2D pool;
  const Tensor y = pool.forward(x).clone();
  const Tensor dy = mf::testing::window_gradients(c);
  const Tensor dx = pool.backward(dy).clone();
  const int want_pos[] = {0, 1, 2, 0, 0, 3, 0};
  for (std::int64_t ch = 0; ch < c; ++ch) {
    SCOPED_TRACE("window " + std::to_string(ch));
    EXPECT_EQ(y.data<float>()[ch], *std::max_element(windows[ch].begin(), windows[ch].end()));
    for (int p = 0; p < 4; ++p)
      EXPECT_EQ(dx.data<float>()[p * c + ch], p == want_pos[ch] ? static_cast<float>(ch + 1) : 0.0f) << "position " << p;
  }
  EXPECT_TRUE(all_close(dx, mf::testing::maxpool_backward_ref(x, dy), Tol{0, 0}));
}

// Only the winner of a window receives its gradient, whatever the gradient is: an inf or NaN
// in dy (an overflowing step) must not turn the other three positions into NaN.
TEST_P(LayerCpu, MaxPoolNonFiniteGradientGoesOnlyToTheWinner) {
  // windows won at positions 0, 1, 2 and 3 (one per channel)
  const std::vector<std::vector<float>> windows = {{5, 1, 2, 3}, {1, 5, 2, 3}, {1, 2, 5, 3}, {1, 2, 3, 5}};
  const Tensor x = mf::testing::maxpool_windows(windows, 4);
  for (float g : {INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN()}) {
    SCOPED_TRACE("dy = " + std::to_string(g));
    mf::MaxPool2D pool;
    pool.forward(x);
    const Tensor dy = Tensor::from_vector({1, 1, 1, 4}, {g, g, g, g});
    const std::vector<float> dx = pool.backward(dy).to_vector();
    for (int ch = 0; ch < 4; ++ch)
      for (int p = 0; p < 4; ++p) {
        const float v = dx[p * 4 + ch];
        if (p == ch) {
          EXPECT_TRUE(std::isnan(g) ? std::isnan(v) : v == g) << "winner, channel " << ch << ": " << v;
        } else {
          EXPECT_EQ(v, 0.0f) << "channel " << ch << ", position " << p;
        }
      }
  }
}

// A NaN in a window is its output, and its first NaN gets the gradient, in the vector lanes
// and in the leftover channels alike (37 channels: two or four whole vectors and a rest).
// The vector path dropped a NaN in some places of the window and the scalar path kept it.
TEST_P(LayerCpu, MaxPoolNanWinsItsWindowInEveryChannel) {
  for (const std::int64_t c : {37, 11}) {
    SCOPED_TRACE(std::to_string(c) + " channels");
    const Tensor x = mf::testing::maxpool_nan_windows(c);
    mf::MaxPool2D pool;
    EXPECT_TRUE(mf::testing::same_or_both_nan(pool.forward(x), mf::testing::maxpool_forward_ref(x)));
    const Tensor dy = mf::testing::window_gradients(c);
    EXPECT_TRUE(all_close(pool.backward(dy), mf::testing::maxpool_backward_ref(x, dy), Tol{0, 0}));
  }
}

TEST_P(LayerCpu, MaxPoolOddRowsGetZeroGradientAfterABiggerBatch) {
  mf::Rng rng(45);
  mf::MaxPool2D pool;
  // first an even-sized batch that sends gradient everywhere it can, filling dx's buffer
  pool.forward(uniform({4, 14, 12, 3}, -1, 1, rng));
  pool.backward(uniform({4, 7, 6, 3}, 1, 2, rng));
  const Tensor x = uniform({2, 13, 11, 3}, -1, 1, rng);  // fits in the same buffers
  pool.forward(x);
  const Tensor dy = uniform({2, 6, 5, 3}, 1, 2, rng);
  const Tensor& dx = pool.backward(dy);
  EXPECT_TRUE(all_close(dx, mf::testing::maxpool_backward_ref(x, dy), Tol{0, 0}));
}

TEST_P(LayerCpu, MaxPoolWithoutInputGradient) {
  mf::Rng rng(46);
  mf::MaxPool2D pool;
  pool.set_needs_input_grad(false);
  pool.forward(uniform({2, 4, 4, 3}, -1, 1, rng));
  EXPECT_FALSE(pool.backward(uniform({2, 2, 2, 3}, -1, 1, rng)).defined());
}

// ---- Dense ----------------------------------------------------------------------------------

void check_dense(std::int64_t n, std::int64_t in, std::int64_t units, bool relu, std::uint64_t seed) {
  SCOPED_TRACE("Dense N=" + std::to_string(n) + " " + std::to_string(in) + "->" + std::to_string(units) +
               (relu ? " relu" : " linear") + " threads=" + std::to_string(mf::num_threads()));
  mf::Rng rng(seed);
  mf::Dense dense(in, units, relu ? Activation::kRelu : Activation::kNone, rng);
  dense.bias().value.copy_from(uniform({units}, -0.3f, 0.3f, rng));
  const Tensor& w = dense.weight().value;
  const Tensor& b = dense.bias().value;
  const Tensor x = uniform({n, in}, -1, 1, rng);
  const Tensor y = dense.forward(x).clone();
  ASSERT_EQ(y.shape(), Shape({n, units}));
  EXPECT_TRUE(all_close(y, mf::testing::dense_forward_ref(x, w, b, relu), kFwdTol));
  const Tensor dy = uniform(y.shape(), -1, 1, rng);
  const Tensor& dx = dense.backward(dy);
  const auto ref = mf::testing::dense_backward_ref(x, w, b, relu, dy);
  ASSERT_TRUE(dx.defined());
  EXPECT_TRUE(all_close(dx, ref.dx, kDxTol));
  EXPECT_TRUE(all_close(dense.weight().grad, ref.dw, mf::testing::fp32_reduction_tol(n)));
  EXPECT_LE(nmse(dense.weight().grad, ref.dw), kGradNmse);
  EXPECT_TRUE(all_close(dense.bias().grad, ref.db, mf::testing::fp32_reduction_tol(n)));
  EXPECT_LE(nmse(dense.bias().grad, ref.db), kGradNmse);

  const Tensor dx1 = dx.clone();
  EXPECT_EQ(dense.backward(dy).to_vector(), dx1.to_vector());
  const Tol twice_tol{2 * mf::testing::fp32_reduction_tol(n).atol, 1e-4};
  EXPECT_TRUE(all_close(dense.weight().grad, doubled(ref.dw), twice_tol)) << "second backward";
  EXPECT_TRUE(all_close(dense.bias().grad, doubled(ref.db), twice_tol)) << "second backward";
}

TEST_P(LayerCpu, DenseModelShapes) {
  for (std::int64_t n : {1, 3, 64}) {
    check_dense(n, 1600, 64, true, 50 + n);
    check_dense(n, 64, 10, false, 60 + n);
  }
}
// Dense runs on the register tiles when its units are a multiple of the vector width (16
// floats with AVX-512, 8 without; its backward when its inputs are too), with tiles of up to
// 4 vectors (2 without AVX-512), the widest that divides the units, and on Eigen otherwise:
// each at least once, forward and backward, with and without ReLU, and the tiled forward
// with the Eigen backward (37 inputs). The 32-unit tiles of AVX-512 had no test.
TEST_P(LayerCpu, DenseEveryCpuPath) {
  for (const std::int64_t units : {64, 128, 32, 96, 16, 48, 40, 10, 25}) {
    const std::string path = units % mf::cpu::kLanes == 0 ? "register tiles" : "Eigen GEMM";
    check_dense(5, 48, units, true, 90 + units);
    check_dense(3, 37, units, false, 91 + units);
    mf::Rng rng(92);
    mf::Dense dense(48, units, Activation::kRelu, rng);
    const Tensor& y = dense.forward(uniform({2, 48}, -1, 1, rng));
    dense.backward(uniform(y.shape(), -1, 1, rng));
    EXPECT_EQ(dense.cpu_config(), "fwd " + path + "; bwd " + path) << units << " units";
  }
}
TEST_P(LayerCpu, DenseOddShapes) {
  check_dense(5, 7, 3, true, 70);
  check_dense(1, 1, 1, false, 71);
  check_dense(3, 5, 17, false, 72);  // more threads' worth of rows than samples
}

// ReLU passes NaN on, as PyTorch's and TensorFlow's do, and maps -inf to 0: filters whose
// bias is NaN, +inf and -inf give NaN, inf and 0 at every pixel, on every forward path of
// Conv2D and Dense. The register tiles used to turn NaN into 0, so that a NaN weight in the
// first three layers never reached the loss (ModelCpu.ANanWeightInAnyLayerStopsTraining).
TEST_P(LayerCpu, ReluPassesNanOnEveryForwardPath) {
  struct Case {
    std::int64_t h, w, c, filters, k;
    const char* path;
  };
  const Case cases[] = {{28, 28, 1, 32, 3, "direct"},  // the model's first layer: 3x3x1 kernel, 4 pixels at a time
                        {9, 8, 3, 32, 3, "direct"},    // K = 32
                        {7, 7, 2, 64, 3, "direct"},    // K = 64
                        {6, 9, 1, 100, 3, "direct"},   // general K
                        {13, 13, 32, 64, 3, "implicit GEMM"},  // the model's second layer
                        {9, 9, 8, 48, 5, "implicit GEMM"},     // 16-filter tiles
                        {6, 7, 4, 5, 3, "im2col + Eigen"}};    // kkC = 36, K not a multiple of 16
  for (const Case& cc : cases) {
    SCOPED_TRACE("Conv2D " + std::to_string(cc.h) + "x" + std::to_string(cc.w) + " C=" + std::to_string(cc.c) +
                 " K=" + std::to_string(cc.filters) + " k=" + std::to_string(cc.k));
    mf::Rng rng(80);
    mf::Conv2D conv(cc.c, cc.filters, cc.k, Activation::kRelu, rng);
    mf::testing::set_nonfinite_biases(conv.bias().value);
    const Tensor y = conv.forward(uniform({3, cc.h, cc.w, cc.c}, -1, 1, rng));
    EXPECT_NE(conv.cpu_config().find(cc.path), std::string::npos) << conv.cpu_config();
    EXPECT_TRUE(mf::testing::relu_of_nonfinite_biases(y));
  }
  for (const std::int64_t units : {64, 10}) {  // register tiles, Eigen
    SCOPED_TRACE("Dense " + std::to_string(units) + " units");
    mf::Rng rng(81);
    mf::Dense dense(1600, units, Activation::kRelu, rng);
    mf::testing::set_nonfinite_biases(dense.bias().value);
    EXPECT_TRUE(mf::testing::relu_of_nonfinite_biases(dense.forward(uniform({5, 1600}, -1, 1, rng))));
  }
}

// A batch of 0 samples, as PyTorch takes it: an empty output, an empty input gradient and
// no change to the parameters' gradients, on every CPU path of each layer (the Eigen
// backward of Dense divided by the batch size to size its threads' work).
TEST_P(LayerCpu, EmptyBatchGivesEmptyResultsAndNoGradient) {
  mf::Rng rng(75);
  std::vector<std::unique_ptr<mf::Layer>> layers;
  std::vector<Shape> inputs;
  for (std::int64_t units : {10, 16}) {  // Eigen, and the register tiles
    layers.push_back(std::make_unique<mf::Dense>(16, units, Activation::kRelu, rng));
    inputs.push_back(Shape{0, 16});
  }
  for (std::int64_t filters : {5, 32}) {  // im2col or direct, and implicit GEMM
    for (std::int64_t channels : {1, 3}) {
      layers.push_back(std::make_unique<mf::Conv2D>(channels, filters, 3, Activation::kRelu, rng));
      inputs.push_back(Shape{0, 6, 6, channels});
    }
  }
  layers.push_back(std::make_unique<mf::MaxPool2D>());
  inputs.push_back(Shape{0, 6, 6, 3});
  layers.push_back(std::make_unique<mf::Flatten>());
  inputs.push_back(Shape{0, 6, 6, 3});
  for (std::size_t i = 0; i < layers.size(); ++i) {
    mf::Layer& layer = *layers[i];
    SCOPED_TRACE(layer.type() + " input " + inputs[i].str());
    const Tensor y = layer.forward(Tensor::zeros(inputs[i])).clone();
    EXPECT_EQ(y.shape(), layer.output_shape(inputs[i]));
    const Tensor& dx = layer.backward(Tensor::zeros(y.shape()));
    EXPECT_EQ(dx.shape(), inputs[i]);
    for (mf::Parameter* p : layer.parameters())
      for (float g : p->grad.to_vector()) ASSERT_EQ(g, 0.0f) << p->name;
  }
}

TEST_P(LayerCpu, DenseGradientsAccumulateAndInputGradientCanBeOff) {
  mf::Rng rng(73);
  mf::Dense dense(20, 6, Activation::kRelu, rng);
  dense.bias().value.copy_from(uniform({6}, -0.3f, 0.3f, rng));
  const Tensor x = uniform({9, 20}, -1, 1, rng);
  dense.forward(x);
  const Tensor dy = uniform({9, 6}, -1, 1, rng);
  const Tensor dx1 = dense.backward(dy).clone();
  const Tensor dw1 = dense.weight().grad.clone(), db1 = dense.bias().grad.clone();
  const Tensor dx2 = dense.backward(dy).clone();
  EXPECT_EQ(dx1.to_vector(), dx2.to_vector());
  std::vector<double> twice = mf::testing::to_double(dw1), twice_b = mf::testing::to_double(db1);
  for (double& v : twice) v *= 2;
  for (double& v : twice_b) v *= 2;
  EXPECT_TRUE(all_close(dense.weight().grad, twice, Tol{1e-6, 1e-6}));
  EXPECT_TRUE(all_close(dense.bias().grad, twice_b, Tol{1e-6, 1e-6}));

  mf::Dense first(20, 6, Activation::kRelu, rng);
  first.bias().value.copy_from(uniform({6}, -0.3f, 0.3f, rng));
  first.set_needs_input_grad(false);
  first.forward(x);
  EXPECT_FALSE(first.backward(dy).defined());
  const auto ref = mf::testing::dense_backward_ref(x, first.weight().value, first.bias().value, true, dy);
  EXPECT_TRUE(all_close(first.weight().grad, ref.dw, mf::testing::fp32_reduction_tol(9)));
  EXPECT_TRUE(all_close(first.bias().grad, ref.db, mf::testing::fp32_reduction_tol(9)));
}

TEST(LayerCpuThreads, DenseOneAndTwoThreadsAgree) {
  const int saved = mf::num_threads();
  Tensor y[2], dx[2], dw[2];
  for (int t = 0; t < 2; ++t) {
    mf::set_num_threads(t + 1);
    mf::Rng rng(74);
    mf::Dense dense(1600, 64, Activation::kRelu, rng);
    const Tensor x = uniform({33, 1600}, -1, 1, rng);
    y[t] = dense.forward(x).clone();
    dx[t] = dense.backward(uniform({33, 64}, -1, 1, rng)).clone();
    dw[t] = dense.weight().grad.clone();
  }
  mf::set_num_threads(saved);
  EXPECT_TRUE(agree(y[1], y[0]));
  EXPECT_TRUE(agree(dx[1], dx[0]));
  EXPECT_TRUE(agree(dw[1], dw[0]));
}

// ---- Flatten --------------------------------------------------------------------------------

TEST_P(LayerCpu, FlattenIsAViewAndItsBackwardAReshape) {
  mf::Rng rng(80);
  mf::Flatten flat;
  const Tensor x = uniform({3, 5, 5, 4}, -1, 1, rng);
  const Tensor& y = flat.forward(x);
  EXPECT_EQ(y.shape(), Shape({3, 100}));
  EXPECT_TRUE(y.same_buffer(x)) << "Flatten must not copy";
  EXPECT_EQ(y.raw(), x.raw());
  // (h, w, c) order, as Keras flattens NHWC: element [n][i][j][c] -> [n][(i*5 + j)*4 + c]
  EXPECT_EQ(y.data<float>()[100 + (2 * 5 + 3) * 4 + 1], x.data<float>()[((1 * 5 + 2) * 5 + 3) * 4 + 1]);
  const Tensor dy = uniform({3, 100}, -1, 1, rng);
  const Tensor& dx = flat.backward(dy);
  EXPECT_EQ(dx.shape(), x.shape());
  EXPECT_TRUE(dx.same_buffer(dy)) << "Flatten's backward must not copy";
  EXPECT_EQ(dx.to_vector(), dy.to_vector());
  EXPECT_EQ(flat.num_params(), 0);
  // a slice (an offset view) flattens to a view with the same offset
  const Tensor part = x.slice(1, 3);
  EXPECT_TRUE(flat.forward(part).same_buffer(part));

  mf::Flatten first;
  first.set_needs_input_grad(false);
  first.forward(x);
  EXPECT_FALSE(first.backward(dy).defined());
  EXPECT_THROW(flat.forward(Tensor::zeros({5})), std::invalid_argument);
}

// ---- softmax cross-entropy ------------------------------------------------------------------

TEST(SoftmaxXentCpu, MatchesTheReference) {
  for (std::int64_t n : {1, 7, 64}) {
    for (float grad_scale : {1.0f, 128.0f}) {
      SCOPED_TRACE("N=" + std::to_string(n) + " grad_scale=" + std::to_string(grad_scale));
      mf::Rng rng(90 + n);
      const Tensor z = uniform({n, 10}, -4, 4, rng);
      const Tensor labels = mf::testing::random_labels(n, 10, rng);
      Tensor stats = Tensor::zeros({mf::kNumStats});
      Tensor dz;
      mf::softmax_xent(z, labels, stats, &dz, grad_scale);
      const auto ref = mf::testing::softmax_xent_ref(z, labels);
      const float* s = stats.data<float>();
      // the per-row losses are summed in double and stored as one float: float rounding
      EXPECT_NEAR(s[mf::kStatLossSum], ref.loss_sum, 1e-6 * std::fabs(ref.loss_sum));
      EXPECT_EQ(s[mf::kStatCorrect], static_cast<float>(ref.correct));
      EXPECT_EQ(s[mf::kStatCount], static_cast<float>(n));
      std::vector<double> want = ref.dlogits;
      for (double& v : want) v *= grad_scale;
      ASSERT_EQ(dz.shape(), z.shape());
      // (p - onehot) computed in double, rounded to float, times g = grad_scale / N in
      // float: two roundings, ~1e-7 relative; the absolute part covers p ~ 1e-4 entries.
      EXPECT_TRUE(all_close(dz, want, Tol{1e-7 * grad_scale / n, 1e-6}));
      // each row of (softmax - onehot) sums to zero
      for (std::int64_t i = 0; i < n; ++i) {
        double row = 0;
        for (int j = 0; j < 10; ++j) row += dz.data<float>()[i * 10 + j];
        EXPECT_NEAR(row, 0.0, 1e-6 * grad_scale / n);
      }
    }
  }
}

TEST(SoftmaxXentCpu, StatsAccumulateAndGradientIsOptional) {
  mf::Rng rng(95);
  const Tensor z = uniform({5, 10}, -2, 2, rng);
  const Tensor labels = mf::testing::random_labels(5, 10, rng);
  Tensor stats = Tensor::zeros({mf::kNumStats});
  mf::softmax_xent(z, labels, stats, nullptr);
  mf::softmax_xent(z, labels, stats, nullptr);
  const auto ref = mf::testing::softmax_xent_ref(z, labels);
  EXPECT_NEAR(stats.data<float>()[mf::kStatLossSum], 2 * ref.loss_sum, 2e-6 * ref.loss_sum);
  EXPECT_EQ(stats.data<float>()[mf::kStatCorrect], 2.0f * ref.correct);
  EXPECT_EQ(stats.data<float>()[mf::kStatCount], 10.0f);
}

// A gradient buffer given as a slice of a larger tensor is written where it is. It was
// moved to the start of its storage, so the gradient landed in the rows before it.
TEST(SoftmaxXentCpu, GradientIntoASliceStaysInTheSlice) {
  Tensor all = Tensor::zeros({3, 2});
  Tensor rows = all.slice(1, 3);
  const Tensor logits = Tensor::from_vector({2, 2}, {0.0f, 0.0f, 0.0f, 0.0f});
  Tensor labels = Tensor::zeros({2}, DType::kI32);
  Tensor stats = Tensor::zeros({mf::kNumStats});
  mf::softmax_xent(logits, labels, stats, &rows);
  EXPECT_TRUE(rows.same_buffer(all.slice(1, 3)));
  // (softmax - onehot) / N with p = 0.5 and label 0: (-0.25, 0.25) per row
  EXPECT_EQ(all.to_vector(), std::vector<float>({0.0f, 0.0f, -0.25f, 0.25f, -0.25f, 0.25f}));
}

// The gradient may not overlap what it is computed from: on the GPU that is a race (the
// kernel's lanes overwrite a row while lane 0 reads its label's logit), so both devices
// refuse it, naming what it overlaps. Disjoint views of one buffer are fine.
TEST(SoftmaxXentCpu, GradientMayNotOverlapWhatItIsComputedFrom) {
  const auto expect_refused = [](const Tensor& z, const Tensor& y, Tensor& stats, Tensor& dz, const char* what) {
    try {
      mf::softmax_xent(z, y, stats, &dz);
      ADD_FAILURE() << "a gradient over the " << what << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("overlaps the ") + what), std::string::npos) << e.what();
    }
  };
  Tensor stats = Tensor::zeros({mf::kNumStats});
  const Tensor y = labels_of({0, 1});
  Tensor z = Tensor::from_vector({2, 2}, {1, 2, 3, 4});
  Tensor same = z;
  expect_refused(z, y, stats, same, "logits");
  Tensor rows = Tensor::zeros({3, 2});
  rows.slice(0, 2).copy_from(z);
  Tensor shifted = rows.slice(1, 3);
  expect_refused(rows.slice(0, 2), y, stats, shifted, "logits");
  EXPECT_EQ(z.to_vector(), std::vector<float>({1, 2, 3, 4}));  // nothing written
  EXPECT_EQ(stats.to_vector(), std::vector<float>({0, 0, 0}));

  Tensor flat = Tensor::zeros({7});
  Tensor stats_in_flat = flat.slice(3, 6);
  Tensor dz_in_flat = flat.slice(0, 4).reshape({2, 2});
  expect_refused(z, y, stats_in_flat, dz_in_flat, "stats");

  // Disjoint rows of one buffer: the gradient lands in its own rows, the logits stay.
  Tensor both = Tensor::zeros({4, 2});
  both.slice(0, 2).copy_from(Tensor::from_vector({2, 2}, {0, 0, 0, 0}));
  Tensor below = both.slice(2, 4);
  mf::softmax_xent(both.slice(0, 2), y, stats, &below);
  EXPECT_EQ(both.to_vector(), std::vector<float>({0, 0, 0, 0, -0.25f, 0.25f, 0.25f, -0.25f}));
  EXPECT_EQ(stats.data<float>()[mf::kStatCount], 2.0f);
}

TEST(SoftmaxXentCpu, TiesPickTheFirstIndex) {
  // rows: max shared by classes 1 and 2
  const Tensor z = Tensor::from_vector({3, 4}, {1, 3, 3, 0, 1, 3, 3, 0, 5, 5, 5, 5});
  Tensor stats = Tensor::zeros({mf::kNumStats});
  mf::softmax_xent(z, labels_of({1, 2, 0}), stats, nullptr);
  EXPECT_EQ(stats.data<float>()[mf::kStatCorrect], 2.0f);  // rows 0 (label 1) and 2 (label 0)
  stats.fill_zero();
  mf::softmax_xent(z, labels_of({2, 1, 3}), stats, nullptr);
  EXPECT_EQ(stats.data<float>()[mf::kStatCorrect], 1.0f);  // only row 1
  EXPECT_NEAR(stats.data<float>()[mf::kStatLossSum], mf::testing::softmax_xent_ref(z, labels_of({2, 1, 3})).loss_sum, 1e-5);
}

TEST(SoftmaxXentCpu, NanLogitsNeverWinThePrediction) {
  // The GPU kernel's rule: the first largest logit that is not NaN, class 0 when none is.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const Tensor z = Tensor::from_vector({3, 3}, {nan, 2, 1, 1, nan, 3, nan, nan, -inf});
  Tensor stats = Tensor::zeros({mf::kNumStats});
  mf::softmax_xent(z, labels_of({1, 2, 0}), stats, nullptr);
  EXPECT_EQ(stats.data<float>()[mf::kStatCorrect], 3.0f);  // rows 0 -> 1, 1 -> 2, 2 -> 0 (none)
  EXPECT_TRUE(std::isnan(stats.data<float>()[mf::kStatLossSum]));
  stats.fill_zero();
  mf::softmax_xent(z, labels_of({0, 0, 1}), stats, nullptr);
  EXPECT_EQ(stats.data<float>()[mf::kStatCorrect], 0.0f);
}

TEST(SoftmaxXentCpu, LargeLogitsDoNotOverflow) {
  const Tensor z = Tensor::from_vector({3, 3}, {1000, 0, -1000, 1000, 0, -1000, 1000, 1000, -1000});
  Tensor stats = Tensor::zeros({mf::kNumStats});
  Tensor dz;
  mf::softmax_xent(z, labels_of({0, 1, 2}), stats, &dz);
  // row 0: p(label) = 1 - e^-1000 -> loss 0; row 1: loss 1000; row 2: ln 2 + 2000
  const double want = 0.0 + 1000.0 + (std::log(2.0) + 2000.0);
  EXPECT_NEAR(stats.data<float>()[mf::kStatLossSum], want, 1e-3);
  for (float v : dz.to_vector()) EXPECT_TRUE(std::isfinite(v));
  const std::vector<float> d = dz.to_vector();
  // row 1: p = (1, 0, 0), onehot at 1: (1, -1, 0) / 3
  EXPECT_NEAR(d[3], 1.0 / 3, 1e-7);
  EXPECT_NEAR(d[4], -1.0 / 3, 1e-7);
  EXPECT_EQ(d[5], 0.0f);
  // row 2: p = (1/2, 1/2, 0)
  EXPECT_NEAR(d[6], 0.5 / 3, 1e-7);
  EXPECT_NEAR(d[8], -1.0 / 3, 1e-7);
  const Tensor p = mf::softmax(z);
  for (float v : p.to_vector()) EXPECT_TRUE(std::isfinite(v));
  EXPECT_NEAR(p.data<float>()[6], 0.5f, 1e-7);
}

TEST(SoftmaxXentCpu, RejectsBadArguments) {
  const Tensor z = Tensor::zeros({2, 3});
  Tensor stats = Tensor::zeros({mf::kNumStats});
  for (std::int32_t bad : {-1, 3, 100}) {
    try {
      mf::softmax_xent(z, labels_of({0, bad}), stats, nullptr);
      FAIL() << "label " << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(mf::softmax_xent(z, labels_of({0}), stats, nullptr), std::invalid_argument);     // count
  EXPECT_THROW(mf::softmax_xent(z, Tensor::zeros({2}), stats, nullptr), std::invalid_argument);  // f32 labels
  EXPECT_THROW(mf::softmax_xent(Tensor::zeros({6}), labels_of({0, 1}), stats, nullptr), std::invalid_argument);
  Tensor small_stats = Tensor::zeros({2});
  EXPECT_THROW(mf::softmax_xent(z, labels_of({0, 1}), small_stats, nullptr), std::invalid_argument);
  EXPECT_THROW(mf::softmax_xent(z.to(DType::kF16), labels_of({0, 1}), stats, nullptr), std::invalid_argument);
}

TEST(SoftmaxCpu, RowsAreProbabilities) {
  mf::Rng rng(96);
  const Tensor z = uniform({6, 10}, -5, 5, rng);
  const Tensor p = mf::softmax(z);
  ASSERT_EQ(p.shape(), z.shape());
  for (int i = 0; i < 6; ++i) {
    double sum = 0, m = -1e30, zsum = 0;
    for (int j = 0; j < 10; ++j) m = std::max(m, static_cast<double>(z.data<float>()[i * 10 + j]));
    for (int j = 0; j < 10; ++j) zsum += std::exp(z.data<float>()[i * 10 + j] - m);
    for (int j = 0; j < 10; ++j) {
      const double want = std::exp(z.data<float>()[i * 10 + j] - m) / zsum;
      EXPECT_NEAR(p.data<float>()[i * 10 + j], want, 1e-7 + 1e-6 * want);
      sum += p.data<float>()[i * 10 + j];
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
}

// softmax() fills N x K values: any other rank left entries unwritten (rank 3) or read
// dimensions that are not there (rank 0 or 1, std::out_of_range); it now refuses them, and
// dtypes that are not f32 or f16, naming the tensor.
TEST(SoftmaxCpu, NeedsRankTwoFloatLogits) {
  for (const Tensor& bad : {Tensor::zeros({1, 2, 3}), Tensor::zeros({6}), Tensor::zeros(Shape{}), Tensor()}) {
    try {
      mf::softmax(bad);
      ADD_FAILURE() << bad.describe() << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("(N, classes)"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad.describe()), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(mf::softmax(Tensor::zeros({2, 3}, DType::kI32)), std::invalid_argument);
  // no classes: an empty result, nothing read
  EXPECT_EQ(mf::softmax(Tensor::zeros({4, 0})).shape(), Shape({4, 0}));
  // f16 logits (the GPU's FP16 path gives them) are widened
  const Tensor p = mf::softmax(Tensor::zeros({1, 4}).to(DType::kF16));
  EXPECT_EQ(p.to_vector(), std::vector<float>(4, 0.25f));
}

// ---- argument checks ------------------------------------------------------------------------

// Expects std::invalid_argument whose message contains every one of `parts`.
template <class F>
void expect_invalid(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << p << "' not in: " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

TEST(LayerChecks, WrongInputShapesNameBothShapes) {
  mf::Rng rng(100);
  mf::Conv2D conv(1, 32, 3, Activation::kRelu, rng);
  conv.set_name("conv2d");
  expect_invalid([&] { conv.forward(Tensor::zeros({2, 28, 28})); }, {"conv2d", "(batch, any, any, 1)", "(2, 28, 28)"});
  expect_invalid([&] { conv.forward(Tensor::zeros({2, 28, 28, 3})); }, {"(batch, any, any, 1)", "(2, 28, 28, 3)"});
  expect_invalid([&] { conv.forward(Tensor::zeros({2, 2, 28, 1})); }, {"(2, 2, 28, 1)", "3x3"});
  mf::Dense dense(1600, 64, Activation::kRelu, rng);
  expect_invalid([&] { dense.forward(Tensor::zeros({4, 1601})); }, {"(batch, 1600)", "(4, 1601)"});
  expect_invalid([&] { dense.forward(Tensor::zeros({4, 40, 40})); }, {"(batch, 1600)", "(4, 40, 40)"});
  mf::MaxPool2D pool;
  expect_invalid([&] { pool.forward(Tensor::zeros({4, 6, 6})); }, {"(4, 6, 6)"});
  expect_invalid([&] { pool.forward(Tensor::zeros({4, 1, 6, 2})); }, {"(4, 1, 6, 2)"});
  mf::Flatten flat;
  expect_invalid([&] { flat.forward(Tensor::zeros({7})); }, {"(7,)"});
  // a rejected forward changes nothing: the layer still works
  EXPECT_NO_THROW(conv.forward(Tensor::zeros({1, 5, 5, 1})));
}

TEST(LayerChecks, WrongDtypeIsRejected) {
  mf::Rng rng(101);
  mf::Conv2D conv(1, 2, 3, Activation::kRelu, rng);
  expect_invalid([&] { conv.forward(Tensor::zeros({1, 5, 5, 1}, DType::kF16)); }, {"f16", "f32"});
  expect_invalid([&] { conv.forward(Tensor::zeros({1, 5, 5, 1}, DType::kU8)); }, {"u8"});
  mf::Dense dense(4, 2, Activation::kNone, rng);
  expect_invalid([&] { dense.forward(Tensor::zeros({1, 4}, DType::kI32)); }, {"i32"});
  EXPECT_THROW(dense.forward(Tensor()), std::invalid_argument);
  dense.forward(Tensor::zeros({3, 4}));
  expect_invalid([&] { dense.backward(Tensor::zeros({3, 2}, DType::kF16)); }, {"f16 (3, 2)", "f32 (3, 2)"});
}

// FP16 compute is for a layer on the GPU: on the CPU it made f16 gradients that the CPU
// path (f32 only) failed on at its first backward ("tensor holds f16, accessed as f32").
TEST(LayerChecks, Fp16ComputeOnTheCpuIsRefused) {
  mf::Rng rng(102);
  mf::Dense dense(4, 2, Activation::kNone, rng);
  dense.set_name("dense");
  expect_invalid([&] { dense.set_compute_dtype(DType::kF16); }, {"Dense 'dense'", "FP16", "GPU only"});
  EXPECT_EQ(dense.compute_dtype(), DType::kF32);
  EXPECT_EQ(dense.weight().grad.dtype(), DType::kF32);
  EXPECT_FALSE(dense.weight().half.defined());
}

// Layers to feed their own buffers, each with an input shape: Dense (linear and ReLU) and a
// 1x1 Conv2D, whose output has their input's shape, and MaxPool2D, whose output is smaller.
std::vector<std::pair<std::unique_ptr<mf::Layer>, Shape>> own_buffer_cases(mf::Rng& rng) {
  std::vector<std::pair<std::unique_ptr<mf::Layer>, Shape>> cases;
  cases.emplace_back(std::make_unique<mf::Dense>(16, 16, Activation::kNone, rng), Shape{4, 16});
  cases.emplace_back(std::make_unique<mf::Dense>(10, 10, Activation::kRelu, rng), Shape{4, 10});
  cases.emplace_back(std::make_unique<mf::Conv2D>(4, 4, 1, Activation::kNone, rng), Shape{2, 5, 5, 4});
  cases.emplace_back(std::make_unique<mf::MaxPool2D>(), Shape{1, 8, 8, 2});
  return cases;
}

// A layer's output buffer is resized and overwritten by its next forward, so feeding a layer
// the tensor its last forward returned (or a slice of it) read the input while writing it:
// a wrong result with no error. It is refused for every layer that writes its own output;
// the answer is still right from a clone().
TEST(LayerChecks, ForwardOfTheLayersOwnOutputIsRefused) {
  mf::Rng rng(105);
  for (auto& [layer, in] : own_buffer_cases(rng)) {
    mf::Layer& l = *layer;
    SCOPED_TRACE(l.type() + " " + in.str());
    for (bool training : {false, true}) {
      l.set_training(training);
      const Tensor x = uniform(in, -1, 1, rng);
      const Tensor y1 = l.forward(x).clone();
      const std::vector<float> want = l.forward(y1).to_vector();  // the layer applied twice
      const Tensor& own = l.forward(x);
      expect_invalid([&] { l.forward(own); }, {l.type() + ": the input is this layer's own output buffer", "clone()"});
      expect_invalid([&] { l.forward(own.slice(0, 1)); }, {"own output buffer"});
      // the refused call changed nothing: the output is still the first application
      EXPECT_EQ(own.to_vector(), y1.to_vector());
      EXPECT_EQ(l.forward(own.clone()).to_vector(), want);
    }
  }
}

// The same for backward: a layer's input-gradient buffer is overwritten by its next backward,
// so a gradient living in it (the tensor the last backward returned, or a view of it, where
// the shapes allow) was read while being written. Refused, and the refused call changes
// nothing; a clone() gives the layer's backward of it.
TEST(LayerChecks, BackwardOfTheLayersOwnInputGradientIsRefused) {
  mf::Rng rng(107);
  for (auto& [layer, in] : own_buffer_cases(rng)) {
    mf::Layer& l = *layer;
    SCOPED_TRACE(l.type() + " " + in.str());
    const Tensor x = uniform(in, -1, 1, rng);
    const Shape out = l.forward(x).shape();
    const Tensor dy = uniform(out, -1, 1, rng);
    // The input gradient seen as a gradient of the output: all of it where the shapes agree,
    // its first elements (a reshaped view) for MaxPool2D, whose output is smaller.
    const Tensor& own = l.backward(dy);
    const Tensor as_dy = own.shape() == out ? own : own.reshape({own.numel()}).slice(0, out.numel()).reshape(out);
    const std::vector<float> dx1 = own.to_vector();
    const std::vector<float> want = l.backward(as_dy.clone()).to_vector();
    ASSERT_EQ(l.backward(dy).to_vector(), dx1);
    for (mf::Parameter* p : l.parameters()) p->grad.fill_zero();
    expect_invalid([&] { l.backward(as_dy); },
                   {l.type() + ": the gradient is this layer's own input-gradient buffer", "clone()"});
    EXPECT_EQ(own.to_vector(), dx1);  // the refused call wrote nothing
    for (mf::Parameter* p : l.parameters())
      for (float g : p->grad.to_vector()) ASSERT_EQ(g, 0.0f) << "the refused call accumulated gradients";
    EXPECT_EQ(l.backward(as_dy.clone()).to_vector(), want);
  }
}

// Flatten's output is a view of its input by design (it writes no buffer of its own), so its
// own output may come back in.
TEST(LayerChecks, FlattenMayTakeItsOwnOutput) {
  mf::Rng rng(106);
  mf::Flatten flat;
  const Tensor x = uniform({3, 2, 2, 5}, -1, 1, rng);
  const Tensor& y = flat.forward(x);
  const Tensor again = flat.forward(y);
  EXPECT_EQ(again.shape(), Shape({3, 20}));
  EXPECT_TRUE(again.same_buffer(x));
}

TEST(LayerChecks, BackwardNeedsATrainingForwardAndAMatchingGradient) {
  mf::Rng rng(102);
  std::vector<std::unique_ptr<mf::Layer>> layers;
  layers.push_back(std::make_unique<mf::Conv2D>(1, 2, 3, Activation::kRelu, rng));
  layers.push_back(std::make_unique<mf::MaxPool2D>());
  layers.push_back(std::make_unique<mf::Flatten>());
  layers.push_back(std::make_unique<mf::Dense>(4, 2, Activation::kRelu, rng));
  const std::vector<Shape> in = {{2, 5, 5, 1}, {2, 4, 4, 2}, {2, 2, 2, 1}, {2, 4}};
  for (std::size_t i = 0; i < layers.size(); ++i) {
    mf::Layer& l = *layers[i];
    SCOPED_TRACE(l.type());
    const Shape out = l.output_shape(in[i]);
    EXPECT_THROW(l.backward(Tensor::zeros(out)), std::logic_error) << "backward before any forward";
    l.set_training(false);  // inference: the input is not kept, so no backward
    l.forward(Tensor::zeros(in[i]));
    EXPECT_THROW(l.backward(Tensor::zeros(out)), std::logic_error) << "backward after an inference forward";
    l.set_training(true);
    l.forward(Tensor::zeros(in[i]));
    std::vector<std::int64_t> wrong = out.dims();
    wrong.back() += 1;
    expect_invalid([&] { l.backward(Tensor::zeros(Shape(wrong))); }, {Shape(wrong).str(), out.str()});
    EXPECT_THROW(l.backward(Tensor()), std::invalid_argument);
    EXPECT_NO_THROW(l.backward(Tensor::zeros(out)));
  }
}

// A layer is not copyable: a copy shared the original's output and argmax buffers, so that
// after b = a and b.forward(x2), a's output was b's and a's backward routed its gradient to
// x2's maximum.
TEST(LayerChecks, LayersAreNotCopyable) {
  EXPECT_FALSE(std::is_copy_constructible_v<mf::MaxPool2D>);
  EXPECT_FALSE(std::is_copy_assignable_v<mf::MaxPool2D>);
  EXPECT_FALSE(std::is_copy_constructible_v<mf::Flatten>);
  EXPECT_FALSE(std::is_copy_constructible_v<mf::Dense>);
  EXPECT_FALSE(std::is_copy_constructible_v<mf::Conv2D>);
}

// The checks of forward() and backward() name the layer, as its size errors do: in a model
// with two Dense layers "Dense: gradient ... does not match" did not say which.
TEST(LayerChecks, ForwardAndBackwardErrorsNameTheLayer) {
  mf::Rng rng(107);
  mf::Dense dense(4, 2, Activation::kNone, rng);
  dense.set_name("dense_1");
  expect_invalid([&] { dense.forward(Tensor()); }, {"Dense 'dense_1': forward of an undefined tensor"});
  expect_invalid([&] { dense.forward(Tensor::zeros({1, 4}, DType::kI32)); }, {"Dense 'dense_1': input is i32"});
  EXPECT_THROW(dense.backward(Tensor::zeros({1, 2})), std::logic_error);
  try {
    dense.backward(Tensor::zeros({1, 2}));
  } catch (const std::logic_error& e) {
    EXPECT_STREQ(e.what(), "Dense 'dense_1': backward() without a forward() in training mode");
  }
  dense.forward(Tensor::zeros({3, 4}));
  expect_invalid([&] { dense.backward(Tensor::zeros({3, 3})); }, {"Dense 'dense_1': gradient f32 (3, 3)"});
  mf::Dense square(2, 2, Activation::kNone, rng);
  square.set_name("dense_2");
  const Tensor& y = square.forward(Tensor::zeros({3, 2}));
  expect_invalid([&] { square.forward(y); }, {"Dense 'dense_2': the input is this layer's own output buffer"});
}

TEST(LayerChecks, ConstructorsRejectBadSizesAndCountParameters) {
  mf::Rng rng(103);
  EXPECT_THROW(mf::Conv2D(0, 4, 3, Activation::kRelu, rng), std::invalid_argument);
  EXPECT_THROW(mf::Conv2D(1, 0, 3, Activation::kRelu, rng), std::invalid_argument);
  EXPECT_THROW(mf::Conv2D(1, 4, 0, Activation::kRelu, rng), std::invalid_argument);
  EXPECT_THROW(mf::Dense(0, 4, Activation::kRelu, rng), std::invalid_argument);
  EXPECT_THROW(mf::Dense(4, 0, Activation::kRelu, rng), std::invalid_argument);
  mf::Conv2D conv(32, 64, 3, Activation::kRelu, rng);
  EXPECT_EQ(conv.num_params(), 64 * 3 * 3 * 32 + 64);
  EXPECT_EQ(conv.weight().value.shape(), Shape({64, 3, 3, 32}));  // OHWI
  EXPECT_EQ(conv.weight().name, "kernel");
  EXPECT_EQ(conv.bias().name, "bias");
  mf::Dense dense(1600, 64, Activation::kRelu, rng);
  EXPECT_EQ(dense.weight().value.shape(), Shape({1600, 64}));  // (in, units), Keras's layout
  EXPECT_EQ(dense.num_params(), 102464);
  EXPECT_EQ(mf::MaxPool2D().num_params(), 0);
}

// Glorot-uniform initialisation: U(-l, l), l = sqrt(6 / (fan_in + fan_out)) with Keras's
// fans; biases zero; gradients zero.
TEST(LayerInit, GlorotUniformBoundsAndZeroBias) {
  mf::Rng rng(104);
  mf::Conv2D conv(32, 64, 3, Activation::kRelu, rng);
  const double limit = std::sqrt(6.0 / (3 * 3 * 32 + 3 * 3 * 64));
  double sum2 = 0, maxabs = 0;
  for (float v : conv.weight().value.to_vector()) {
    maxabs = std::max(maxabs, std::fabs(static_cast<double>(v)));
    sum2 += static_cast<double>(v) * v;
  }
  EXPECT_LE(maxabs, limit);
  EXPECT_GT(maxabs, 0.99 * limit);  // 18432 draws reach the edge
  // variance of U(-l, l) is l^2 / 3; 18432 samples: 1% relative standard error
  EXPECT_NEAR(sum2 / conv.weight().value.numel(), limit * limit / 3, 0.05 * limit * limit / 3);
  for (float v : conv.bias().value.to_vector()) EXPECT_EQ(v, 0.0f);
  for (float v : conv.weight().grad.to_vector()) ASSERT_EQ(v, 0.0f);
  mf::Dense dense(1600, 64, Activation::kRelu, rng);
  const double dl = std::sqrt(6.0 / (1600 + 64));
  for (float v : dense.weight().value.to_vector()) ASSERT_LE(std::fabs(v), dl);
}

INSTANTIATE_TEST_SUITE_P(Threads, LayerCpu, ::testing::Values(1, 2), threads_name);

}  // namespace
