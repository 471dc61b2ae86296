// test_kernels_gpu.cpp: every custom CUDA kernel of kernels/gpu/launchers.h against a CPU
// reference computed here with naive loops (f16 storage emulated with mf::round_to_half /
// float_to_half). Each test is skipped where there is no GPU. test/emulator also builds this
// file against a CPU emulation of CUDA, where every test runs (Emulated.KernelsGpu.*).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "runtime/gpu_runtime.h"
#include "kernels/gpu/launchers.h"
#include "optim/loss_scaler.h"
#include "tensor/half.h"
#include "tensor/rng.h"
#include "tensor/tensor.h"
#include "test/test_util.h"

namespace mf {
namespace {

using testing::bits_of_float;
using testing::float_from_bits;
using testing::Tol;

// A single IEEE operation (one add, one division, one conversion) gives the same bits on
// both sides, and copies are copies: those results are compared exactly.
constexpr Tol kExact{0.0, 0.0};

GpuStream stream() { return compute_stream(); }

// ---- moving data: device buffers are u8 tensors of the right byte size ----

template <class T>
Tensor upload(const std::vector<T>& v) {
  Tensor h = Tensor::empty(Shape{static_cast<std::int64_t>(v.size() * sizeof(T))}, DType::kU8);
  if (!v.empty()) std::memcpy(h.raw(), v.data(), v.size() * sizeof(T));
  return h.to(Device::kGpu);
}

// Waits for the compute stream, where the kernels run (Tensor::to copies on it too).
template <class T>
std::vector<T> download(const Tensor& d, std::size_t count) {
  gpu_stream_synchronize(stream());
  const Tensor h = d.to(Device::kCpu);
  std::vector<T> v(count);
  if (count) std::memcpy(v.data(), h.raw(), count * sizeof(T));
  return v;
}

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw());
}

std::vector<float> uniform_vec(std::size_t n, float lo, float hi, Rng& rng) {
  std::vector<float> v(n);
  for (auto& x : v) x = rng.uniform(lo, hi);
  return v;
}
std::vector<Half> to_halves(const std::vector<float>& v) {
  std::vector<Half> h(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) h[i] = float_to_half(v[i]);
  return h;
}
std::vector<float> from_halves(const std::vector<Half>& h) {
  std::vector<float> v(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) v[i] = half_to_float(h[i]);
  return v;
}
std::vector<float> rounded_to_half(std::vector<float> v) {
  for (auto& x : v) x = round_to_half(x);
  return v;
}
std::vector<double> to_d(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// A float vector stored on the device as f32 or f16, read back as float.
Tensor upload_as(const std::vector<float>& v, bool half) { return half ? upload(to_halves(v)) : upload(v); }
std::vector<float> download_as(const Tensor& d, std::size_t count, bool half) {
  return half ? from_halves(download<Half>(d, count)) : download<float>(d, count);
}

// The reductions' scratch (launchers.h): zero-filled, as the kernels leave it.
Tensor zeroed_scratch() { return upload(std::vector<unsigned char>(reduction_scratch_bytes(), 0)); }

// ---- casts ----

// Values that exercise every branch of float_to_half: signed zeros, rounding ties (to even),
// overflow at 65520, half subnormals and their ties, float subnormals, inf and NaNs with
// payloads and signs; then random magnitudes from 2^-30 to 2^17.
std::vector<float> cast_inputs(Rng& rng) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e5f, -1e30f, inf, -inf,
                          float_from_bits(0x7fc00000u), float_from_bits(0xffc00000u), float_from_bits(0x7f800001u),
                          float_from_bits(0xffc12345u), 0x1p-14f, -0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1.8p-24f,
                          0x1p-26f, 0x1.ff8p-15f, 1e-40f, -1e-40f, 1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 2049.0f, 4097.0f,
                          0.1f, 1.0f / 3.0f, 3.14159265f};
  for (int i = 0; i < 2001; ++i) {
    const float mag = std::ldexp(1.0f + rng.uniform01(), static_cast<int>(rng.below(48)) - 30);
    v.push_back(rng.below(2) ? mag : -mag);
  }
  return v;
}

TEST(KernelsGpu, CastF32ToF16MatchesFloatToHalfBitForBit) {
  MF_SKIP_WITHOUT_GPU();
  Rng rng(11);
  const std::vector<float> x = cast_inputs(rng);
  const Tensor xd = upload(x);
  // Full length (vector path plus a tail), short lengths (tail only), and a start one
  // element in (misaligned: the scalar path).
  for (const std::size_t n : {x.size(), std::size_t{1}, std::size_t{3}, std::size_t{4}, std::size_t{7}}) {
    for (const std::size_t first : {std::size_t{0}, std::size_t{1}}) {
      if (first + n > x.size()) continue;
      const Tensor yd = upload(std::vector<Half>(x.size()));
      launch_cast_f32_to_f16(ptr<float>(xd) + first, ptr<Half>(yd) + first, static_cast<std::int64_t>(n), stream());
      const std::vector<Half> y = download<Half>(yd, x.size());
      int bad = 0;
      for (std::size_t i = first; i < first + n; ++i) {
        const std::uint16_t want = float_to_half(x[i]).bits;
        if (y[i].bits != want && ++bad <= 5)
          ADD_FAILURE() << "n=" << n << " [" << i << "] x=" << x[i] << " (0x" << std::hex << bits_of_float(x[i])
                        << "): got 0x" << y[i].bits << ", want 0x" << want << std::dec;
      }
      EXPECT_EQ(bad, 0) << "n=" << n << " first=" << first;
    }
  }
}

TEST(KernelsGpu, CastF16ToF32MatchesHalfToFloatForAllBitPatterns) {
  MF_SKIP_WITHOUT_GPU();
  std::vector<Half> x(65536);
  for (std::size_t i = 0; i < x.size(); ++i) x[i].bits = static_cast<std::uint16_t>(i);
  const Tensor xd = upload(x);
  for (const std::size_t first : {std::size_t{0}, std::size_t{1}}) {  // aligned, then misaligned and odd n
    const std::size_t n = x.size() - first;
    const Tensor yd = upload(std::vector<float>(x.size()));
    launch_cast_f16_to_f32(ptr<Half>(xd) + first, ptr<float>(yd) + first, static_cast<std::int64_t>(n), stream());
    const std::vector<float> y = download<float>(yd, x.size());
    int bad = 0;
    for (std::size_t i = first; i < x.size(); ++i) {  // bits: NaN payloads and signed zeros count
      const std::uint32_t want = bits_of_float(half_to_float(x[i]));
      if (bits_of_float(y[i]) != want && ++bad <= 5)
        ADD_FAILURE() << "half 0x" << std::hex << x[i].bits << ": got 0x" << bits_of_float(y[i]) << ", want 0x" << want
                      << std::dec;
    }
    EXPECT_EQ(bad, 0) << "first=" << first;
  }
}

TEST(KernelsGpu, CastU8ToF32Scales) {
  MF_SKIP_WITHOUT_GPU();
  std::vector<std::uint8_t> x(1031);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<std::uint8_t>((i * 7) % 256);
  const Tensor xd = upload(x);
  for (const float scale : {1.0f, 1.0f / 255.0f}) {
    for (const std::size_t first : {std::size_t{0}, std::size_t{1}}) {
      const std::size_t n = x.size() - first;
      const Tensor yd = upload(std::vector<float>(x.size()));
      launch_cast_u8_to_f32(ptr<std::uint8_t>(xd) + first, ptr<float>(yd) + first, static_cast<std::int64_t>(n),
                            scale, stream());
      const std::vector<float> y = download<float>(yd, x.size());
      std::vector<double> got, want;
      for (std::size_t i = first; i < x.size(); ++i) {
        got.push_back(y[i]);
        want.push_back(static_cast<float>(x[i]) * scale);  // one float rounding, as on the device
      }
      EXPECT_TRUE(testing::all_close(got, want, kExact)) << "scale " << scale << " first " << first;
    }
  }
}

// ---- bias + activation ----

struct RowsChannels {
  std::int64_t rows, channels;
};
// Odd channel counts (scalar path), multiples of 4 but not 8 (f32 vector, f16 scalar), the
// model's 32 and 64, a single element, the first conv layer's rows at batch 4, and more
// channels than one f16 scratch slice holds (1040 > 1024).
const RowsChannels kBiasShapes[] = {{1, 1},   {3, 3},    {7, 10},    {33, 12},  {9, 8},
                                    {5, 32},  {121, 64}, {2704, 32}, {40, 1040}};

TEST(KernelsGpu, BiasActForwardMatchesHost) {
  MF_SKIP_WITHOUT_GPU();
  Rng rng(21);
  for (const auto& s : kBiasShapes)
    for (const bool half : {false, true})
      for (const bool relu : {false, true}) {
        const std::size_t n = static_cast<std::size_t>(s.rows * s.channels);
        std::vector<float> y = uniform_vec(n, -1.0f, 1.0f, rng), b = uniform_vec(s.channels, -0.5f, 0.5f, rng);
        if (half) y = rounded_to_half(y), b = rounded_to_half(b);
        // One f32 add (then a max, then one rounding to f16): the same bits on both sides.
        std::vector<float> want(n);
        for (std::size_t i = 0; i < n; ++i) {
          float z = y[i] + b[i % s.channels];
          if (relu) z = z > 0.0f ? z : 0.0f;
          want[i] = half ? round_to_half(z) : z;
        }
        const Tensor yd = upload_as(y, half), bd = upload_as(b, half);
        launch_bias_act_forward(yd.raw(), bd.raw(), half, static_cast<std::int64_t>(n), s.channels, relu, stream());
        EXPECT_TRUE(testing::all_close(to_d(download_as(yd, n, half)), to_d(want), kExact))
            << "rows " << s.rows << " C " << s.channels << (half ? " f16" : " f32") << (relu ? " relu" : "");
      }
}

TEST(KernelsGpu, BiasActBackwardMasksAndAccumulatesBiasGradient) {
  MF_SKIP_WITHOUT_GPU();
  Rng rng(22);
  const Tensor scratch = zeroed_scratch();
  for (const auto& s : kBiasShapes)
    for (const bool half : {false, true})
      for (const bool relu : {false, true})
        for (const bool in_place : {false, true}) {
          const std::int64_t rows = s.rows, c = s.channels;
          const std::size_t n = static_cast<std::size_t>(rows * c);
          std::vector<float> y = uniform_vec(n, -1.0f, 1.0f, rng), dy = uniform_vec(n, -1.0f, 1.0f, rng);
          std::vector<float> db0 = uniform_vec(c, -1.0f, 1.0f, rng);  // non-zero: the kernel adds to it
          if (half) y = rounded_to_half(y), dy = rounded_to_half(dy), db0 = rounded_to_half(db0);

          std::vector<float> dz(n);
          std::vector<double> sum(c, 0.0), sum_abs(c, 0.0);
          for (std::size_t i = 0; i < n; ++i) {
            dz[i] = relu && !(y[i] > 0.0f) ? 0.0f : dy[i];
            sum[i % c] += dz[i];
            sum_abs[i % c] += std::fabs(dz[i]);
          }
          // Launched twice: db ends at db0 + 2 * sum (each launch adds; with f16 each launch
          // rounds once), and the second launch finds the scratch's counters re-zeroed by the first.
          std::vector<double> db_want(c);
          double max_abs = 0.0;
          for (std::int64_t k = 0; k < c; ++k) {
            if (half) {
              const double once = round_to_half(static_cast<float>(db0[k] + sum[k]));
              db_want[k] = round_to_half(static_cast<float>(once + sum[k]));
            } else {
              db_want[k] = db0[k] + 2.0 * sum[k];
            }
            max_abs = std::max(max_abs, 2.0 * sum_abs[k]);
          }

          const Tensor yd = upload_as(y, half), dyd = upload_as(dy, half), dbd = upload_as(db0, half);
          const Tensor dzd = in_place ? dyd : upload_as(std::vector<float>(n, 7.0f), half);
          for (int rep = 0; rep < 2; ++rep)  // in place, the second launch reads the masked dz: same result
            launch_bias_act_backward(relu ? yd.raw() : nullptr, dyd.raw(), dzd.raw(), dbd.raw(), scratch.raw(), half,
                                     rows, c, relu, stream());
          const std::string what = "rows " + std::to_string(rows) + " C " + std::to_string(c) +
                                   (half ? " f16" : " f32") + (relu ? " relu" : "") + (in_place ? " in place" : "");
          EXPECT_TRUE(testing::all_close(to_d(download_as(dzd, n, half)), to_d(dz), kExact)) << what;
          const std::vector<double> db = to_d(download_as(dbd, c, half));
          if (half) {
            // Two roundings to f16, each of which may land one ulp (2^-10 relative) the other
            // way when the f32 sum falls within its own error of a rounding boundary.
            EXPECT_TRUE(testing::all_close(db, db_want, Tol{1e-3, 2e-3})) << what;
          } else {
            // f32 sums in another order: |error| <= (depth of the sum) * 2^-24 * sum|dz|; each
            // thread's running sum over its rows is a few hundred deep at most, and random
            // rounding errors grow like its square root: 1e-6 * sum|dz| is ~16 units of it.
            EXPECT_TRUE(testing::all_close(db, db_want, Tol{1e-6 * max_abs + 1e-7, 1e-6})) << what;
            EXPECT_LE(testing::nmse(db, db_want), 1e-10) << what;
          }
        }
}

// ---- max pooling ----

struct PoolShape {
  std::int64_t n, h, w, c;
};
// The model's two pools (26x26x32, and 11x11x64 with an odd size), odd H and W with C = 3,
// the smallest window, odd W only, C = 10 (f32 and f16 scalar), odd H/W with f16 vectors.
const PoolShape kPoolShapes[] = {{2, 26, 26, 32}, {3, 11, 11, 64}, {1, 5, 7, 3}, {1, 2, 2, 1},
                                 {2, 4, 7, 10},   {1, 3, 3, 8},    {2, 13, 13, 32}};

TEST(KernelsGpu, MaxPoolForwardAndBackwardMatchHost) {
  MF_SKIP_WITHOUT_GPU();
  Rng rng(31);
  for (const auto& s : kPoolShapes)
    for (const bool half : {false, true}) {
      const std::int64_t oh = s.h / 2, ow = s.w / 2;
      const std::size_t nx = static_cast<std::size_t>(s.n * s.h * s.w * s.c);
      const std::size_t ny = static_cast<std::size_t>(s.n * oh * ow * s.c);
      // Values from {-1, -0.5, 0, 0.5}: most windows hold ties, and the first must win.
      std::vector<float> x(nx);
      for (auto& v : x) v = 0.5f * static_cast<float>(rng.below(4)) - 1.0f;
      std::vector<float> dy = uniform_vec(ny, -1.0f, 1.0f, rng);
      if (half) dy = rounded_to_half(dy);

      std::vector<float> y_want(ny), dx_want(nx, 0.0f);
      std::vector<std::uint8_t> arg_want(ny);
      for (std::int64_t b = 0; b < s.n; ++b)
        for (std::int64_t i = 0; i < oh; ++i)
          for (std::int64_t j = 0; j < ow; ++j)
            for (std::int64_t ch = 0; ch < s.c; ++ch) {
              const std::size_t o = static_cast<std::size_t>(((b * oh + i) * ow + j) * s.c + ch);
              float best = 0.0f;
              int arg = -1;
              std::size_t at = 0;
              for (int q = 0; q < 4; ++q) {
                const std::int64_t hi = 2 * i + q / 2, wi = 2 * j + q % 2;  // window position q
                const std::size_t xi = static_cast<std::size_t>(((b * s.h + hi) * s.w + wi) * s.c + ch);
                if (arg < 0 || x[xi] > best) best = x[xi], arg = q, at = xi;
              }
              y_want[o] = best;
              arg_want[o] = static_cast<std::uint8_t>(arg);
              dx_want[at] = dy[o];
            }

      const Tensor xd = upload_as(x, half), yd = upload_as(std::vector<float>(ny, 0.0f), half);
      const Tensor argd = upload(std::vector<std::uint8_t>(ny, 0xff));
      launch_maxpool2x2_forward(xd.raw(), yd.raw(), ptr<std::uint8_t>(argd), half, s.n, s.h, s.w, s.c, stream());
      const std::string what = "(" + std::to_string(s.n) + ", " + std::to_string(s.h) + ", " + std::to_string(s.w) +
                               ", " + std::to_string(s.c) + ")" + (half ? " f16" : " f32");
      EXPECT_TRUE(testing::all_close(to_d(download_as(yd, ny, half)), to_d(y_want), kExact)) << what;
      EXPECT_EQ(download<std::uint8_t>(argd, ny), arg_want) << what;

      // dx starts as NaN everywhere: an element the kernel fails to write fails the check.
      const Tensor dyd = upload_as(dy, half);
      const Tensor dxd = upload_as(std::vector<float>(nx, std::numeric_limits<float>::quiet_NaN()), half);
      launch_maxpool2x2_backward(dyd.raw(), ptr<std::uint8_t>(argd), dxd.raw(), half, s.n, s.h, s.w, s.c, stream());
      EXPECT_TRUE(testing::all_close(to_d(download_as(dxd, nx, half)), to_d(dx_want), kExact)) << what;
    }
}

// ---- softmax cross-entropy ----

struct XentExpect {
  double loss = 0.0, correct = 0.0;
  std::vector<double> dz;
};

// test_util's double-precision reference (the CPU path's rule: the first index of the largest
// non-NaN logit is the prediction), its gradient of the mean loss scaled as the kernel's:
// times g * n.
XentExpect xent_reference(const std::vector<float>& z, const std::vector<std::int32_t>& labels, std::int64_t n,
                          std::int64_t k, double g) {
  Tensor lt = Tensor::empty(Shape{n}, DType::kI32);
  std::copy(labels.begin(), labels.end(), lt.data<std::int32_t>());
  const mf::testing::XentRef r = mf::testing::softmax_xent_ref(Tensor::from_vector(Shape{n, k}, z), lt);
  XentExpect e{r.loss_sum, static_cast<double>(r.correct), r.dlogits};
  for (double& d : e.dz) d *= g * static_cast<double>(n);
  return e;
}

TEST(KernelsGpu, SoftmaxXentStatsAndGradient) {
  MF_SKIP_WITHOUT_GPU();
  Rng rng(41);
  const Tensor scratch = zeroed_scratch();
  struct Case {
    std::int64_t n, k;
  };
  // The model's batch, one row, rows not a multiple of the 4 warps of a block, K < 32,
  // K > 32 (lanes loop), K = 1.
  const Case cases[] = {{64, 10}, {1, 10}, {257, 10}, {5, 3}, {3, 40}, {2, 1}};
  for (const auto& cs : cases)
    for (const bool half : {false, true})
      for (const int mode : {0, 1, 2}) {  // 0: no dlogits, 1: dlogits, 2: dlogits times a device scale
        const std::int64_t n = cs.n, k = cs.k;
        const std::size_t nz = static_cast<std::size_t>(n * k);
        std::vector<float> z = uniform_vec(nz, -3.0f, 3.0f, rng);
        std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
        for (auto& l : labels) l = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(k)));
        if (n >= 3 && k >= 8) {
          for (std::int64_t j = 0; j < k; ++j) z[j] = 0.0f;  // row 0: all equal, the first index wins
          labels[0] = 0;
          z[k + 3] = z[k + 7] = 5.0f;  // row 1: tie at 3 and 7 (different lanes), labelled 3: a hit
          labels[1] = 3;
          for (std::int64_t j = 0; j < k; ++j) z[2 * k + j] = 100.0f + static_cast<float>(j) * 0.25f;  // row 2: large
        }
        if (half) z = rounded_to_half(z);
        const float grad_scale = 1.0f / static_cast<float>(n);
        const float loss_scale = 1024.0f;
        const double g = static_cast<double>(grad_scale) * (mode == 2 ? loss_scale : 1.0);
        const XentExpect e = xent_reference(z, labels, n, k, g);

        const Tensor zd = upload_as(z, half), ld = upload(labels);
        const Tensor statsd = upload(std::vector<float>{1.5f, 2.0f, 3.0f});  // the kernel adds to these
        const Tensor scaled = upload(std::vector<float>{loss_scale});
        const Tensor dzd = upload_as(std::vector<float>(nz, 7.0f), half);
        launch_softmax_xent(zd.raw(), half, ptr<std::int32_t>(ld), n, k, mode ? dzd.raw() : nullptr, grad_scale,
                            mode == 2 ? ptr<float>(scaled) : nullptr, ptr<float>(statsd), scratch.raw(), stream());
        const std::string what = "n " + std::to_string(n) + " k " + std::to_string(k) + (half ? " f16" : " f32") +
                                 " mode " + std::to_string(mode);
        // f32 exp/log per row (a few ulp) and f32 sums over up to 257 rows of ~2.3.
        EXPECT_TRUE(testing::all_close(to_d(download<float>(statsd, 3)),
                                       {1.5 + e.loss, 2.0 + e.correct, 3.0 + static_cast<double>(n)},
                                       Tol{1e-4, 1e-5}))
            << what;
        const std::vector<float> dz = download_as(dzd, nz, half);
        if (!mode) {
          EXPECT_TRUE(testing::all_close(to_d(dz), std::vector<double>(nz, 7.0), kExact)) << what << " (untouched)";
          continue;
        }
        if (half) {
          // The exact value rounded to f16: one ulp (<= 2^-10 relative) either way, and an
          // f16 subnormal ulp (2^-24) near zero.
          std::vector<double> want(nz);
          for (std::size_t i = 0; i < nz; ++i) want[i] = round_to_half(static_cast<float>(e.dz[i]));
          EXPECT_TRUE(testing::all_close(to_d(dz), want, Tol{2e-6 * g + 0x1p-24, 1e-3})) << what;
        } else {
          // p = expf(z - m) / s in f32: a few ulp of p, times the scale g.
          EXPECT_TRUE(testing::all_close(to_d(dz), e.dz, Tol{2e-6 * g, 1e-5})) << what;
        }
      }
}

// ---- batches ----

// The reductions across blocks add in a fixed order: launched again and again on the same
// data, the sums have the same bits, whatever order the blocks ran and finished in (on the
// emulation each launch draws another order; float atomics would add in the order they
// landed). The scratch's counters are left zero.
TEST(KernelsGpu, ReductionsGiveTheSameBitsAtEveryLaunch) {
  MF_SKIP_WITHOUT_GPU();
  Rng rng(43);
  const Tensor scratch = zeroed_scratch();
  for (const bool half : {false, true}) {
    // conv1's bias gradient at batch 4: 4 * 26 * 26 rows of 32 channels, 16 blocks here.
    const std::int64_t rows = 4 * 26 * 26, c = 32;
    const std::size_t n = static_cast<std::size_t>(rows * c);
    std::vector<float> y = uniform_vec(n, -1.0f, 1.0f, rng), dy = uniform_vec(n, -1.0f, 1.0f, rng);
    const Tensor yd = upload_as(y, half), dyd = upload_as(dy, half), dzd = upload_as(std::vector<float>(n), half);
    std::vector<std::uint32_t> first;
    for (int rep = 0; rep < 4; ++rep) {
      const Tensor dbd = upload(std::vector<float>(static_cast<std::size_t>(c), 0.0f));
      launch_bias_act_backward(yd.raw(), dyd.raw(), dzd.raw(), dbd.raw(), scratch.raw(), half, rows, c, true,
                               stream());
      std::vector<std::uint32_t> bits(static_cast<std::size_t>(c));
      const std::vector<float> db = download_as(dbd, static_cast<std::size_t>(c), half);
      for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = bits_of_float(db[i]);
      if (rep == 0) first = bits;
      EXPECT_EQ(bits, first) << "bias gradient, launch " << rep << (half ? " f16" : " f32");
    }
    // The statistics of 400 rows: 100 blocks.
    const std::int64_t rows_x = 400, k = 10;
    std::vector<float> z = uniform_vec(static_cast<std::size_t>(rows_x * k), -4.0f, 4.0f, rng);
    std::vector<std::int32_t> labels(static_cast<std::size_t>(rows_x));
    for (auto& l : labels) l = static_cast<std::int32_t>(rng.below(10));
    const Tensor zd = upload_as(z, half), ld = upload(labels);
    std::vector<std::uint32_t> first_stats;
    for (int rep = 0; rep < 4; ++rep) {
      const Tensor statsd = upload(std::vector<float>{0.0f, 0.0f, 0.0f});
      launch_softmax_xent(zd.raw(), half, ptr<std::int32_t>(ld), rows_x, k, nullptr, 1.0f, nullptr, ptr<float>(statsd),
                          scratch.raw(), stream());
      const std::vector<float> st = download<float>(statsd, 3);
      const std::vector<std::uint32_t> bits = {bits_of_float(st[0]), bits_of_float(st[1]), bits_of_float(st[2])};
      if (rep == 0) first_stats = bits;
      EXPECT_EQ(bits, first_stats) << "loss statistics, launch " << rep << (half ? " f16" : " f32");
    }
  }
  const std::vector<std::uint32_t> counters = download<std::uint32_t>(scratch, 256 / 4);
  EXPECT_EQ(counters, std::vector<std::uint32_t>(256 / 4, 0u)) << "the last blocks leave the counters zero";
}

TEST(KernelsGpu, GatherBatchFollowsDeviceCursor) {
  MF_SKIP_WITHOUT_GPU();
  Rng rng(51);
  const std::int64_t count = 37;
  for (const std::int64_t sample : {std::int64_t{784}, std::int64_t{13}, std::int64_t{4}})  // vector, scalar, tiny
    for (const bool half : {false, true}) {
      std::vector<std::uint8_t> images(static_cast<std::size_t>(count * sample)), labels(count);
      for (auto& p : images) p = static_cast<std::uint8_t>(rng.below(256));
      images[0] = 255, images[1] = 0;  // the ends of the range
      for (auto& l : labels) l = static_cast<std::uint8_t>(rng.below(10));
      std::vector<std::int32_t> perm(count);
      for (std::int64_t i = 0; i < count; ++i) perm[i] = static_cast<std::int32_t>(i);
      for (std::int64_t i = count - 1; i > 0; --i)
        std::swap(perm[i], perm[rng.below(static_cast<std::uint64_t>(i + 1))]);
      for (std::int64_t i = 0; i < count; ++i)  // sample 0 (with 255 and 0) into the first batch
        if (perm[i] == 0) std::swap(perm[i], perm[5]);

      const Tensor imd = upload(images), lbd = upload(labels), permd = upload(perm);
      const Tensor offd = upload(std::vector<std::int64_t>{5});
      const std::int64_t batch = 8;
      const Tensor xd = upload(std::vector<float>(static_cast<std::size_t>(batch * sample)));  // big enough for f16 too
      const Tensor yd = upload(std::vector<std::int32_t>(batch, -1));
      for (const std::int64_t first : {std::int64_t{5}, std::int64_t{13}}) {  // the second after advance_cursor
        launch_gather_batch(ptr<std::uint8_t>(imd), ptr<std::uint8_t>(lbd), ptr<std::int32_t>(permd),
                            ptr<std::int64_t>(offd), batch, sample, xd.raw(), half, ptr<std::int32_t>(yd), stream());
        std::vector<float> want(static_cast<std::size_t>(batch * sample));
        std::vector<std::int32_t> want_labels(batch);
        for (std::int64_t b = 0; b < batch; ++b) {
          const std::int64_t src = perm[first + b];
          want_labels[b] = labels[src];
          for (std::int64_t p = 0; p < sample; ++p) {
            const float v = static_cast<float>(images[src * sample + p]) / 255.0f;  // as data::gather_batch
            want[b * sample + p] = half ? round_to_half(v) : v;
          }
        }
        const std::string what = "sample " + std::to_string(sample) + (half ? " f16" : " f32") + " offset " +
                                 std::to_string(first);
        EXPECT_TRUE(testing::all_close(to_d(download_as(xd, want.size(), half)), to_d(want), kExact)) << what;
        EXPECT_EQ(download<std::int32_t>(yd, batch), want_labels) << what;
        launch_advance_cursor(ptr<std::int64_t>(offd), batch, stream());
        EXPECT_EQ(download<std::int64_t>(offd, 1)[0], first + batch) << what;
      }
    }
}

TEST(KernelsGpu, NormalizeBatchScalesAndWidens) {
  MF_SKIP_WITHOUT_GPU();
  Rng rng(52);
  for (const std::int64_t sample : {std::int64_t{784}, std::int64_t{13}})
    for (const std::int64_t batch : {std::int64_t{5}, std::int64_t{1}})
      for (const bool half : {false, true}) {
        std::vector<std::uint8_t> images(static_cast<std::size_t>(batch * sample)), labels(batch);
        for (std::size_t i = 0; i < images.size(); ++i) images[i] = static_cast<std::uint8_t>(i % 256);
        for (auto& l : labels) l = static_cast<std::uint8_t>(rng.below(10));
        const Tensor imd = upload(images), lbd = upload(labels);
        const Tensor xd = upload(std::vector<float>(images.size()));
        const Tensor yd = upload(std::vector<std::int32_t>(batch, -1));
        launch_normalize_batch(ptr<std::uint8_t>(imd), ptr<std::uint8_t>(lbd), batch, sample, xd.raw(), half,
                               ptr<std::int32_t>(yd), stream());
        std::vector<float> want(images.size());
        for (std::size_t i = 0; i < images.size(); ++i) {
          const float v = static_cast<float>(images[i]) / 255.0f;
          want[i] = half ? round_to_half(v) : v;
        }
        const std::string what = "batch " + std::to_string(batch) + " sample " + std::to_string(sample) +
                                 (half ? " f16" : " f32");
        EXPECT_TRUE(testing::all_close(to_d(download_as(xd, want.size(), half)), to_d(want), kExact)) << what;
        EXPECT_EQ(download<std::int32_t>(yd, batch), std::vector<std::int32_t>(labels.begin(), labels.end())) << what;
      }
}

// ---- optimizers ----

struct AdamRef {  // the Keras Adam of optim/adam.cpp in double, on the float hyper-parameters
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-7f;
  std::vector<double> w, m, v;
  int t = 0;
  void step(const std::vector<double>& g) {
    ++t;
    const double b1 = beta1, b2 = beta2;
    const double lr_t = static_cast<double>(lr) * std::sqrt(1.0 - std::pow(b2, t)) / (1.0 - std::pow(b1, t));
    for (std::size_t i = 0; i < w.size(); ++i) {
      m[i] = b1 * m[i] + (1.0 - b1) * g[i];
      v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
      w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
    }
  }
};

// f32 Adam against double: each step adds a few float roundings of w (~6e-8 for |w| < 1)
// and of m and v (relative ~1e-7, with cancellation in m bounded by |g| <= 1).
constexpr Tol kAdamW{1e-6, 1e-5}, kAdamM{1e-6, 1e-5}, kAdamV{1e-9, 1e-5};

TEST(KernelsGpu, AdamStepMatchesReferenceOverThreeSteps) {
  MF_SKIP_WITHOUT_GPU();
  Rng rng(61);
  // Vector path with a 3-element tail, vector path only, tiny, and misaligned (scalar path).
  for (const std::size_t n : {std::size_t{1003}, std::size_t{4096}, std::size_t{3}})
    for (const std::size_t first : {std::size_t{0}, std::size_t{1}}) {
      if (first && n < 8) continue;
      AdamRef ref;
      const std::vector<float> w0 = uniform_vec(n + first, -1.0f, 1.0f, rng);
      ref.w.assign(w0.begin() + first, w0.end());
      ref.m.assign(n, 0.0);
      ref.v.assign(n, 0.0);
      const Tensor wd = upload(w0), md = upload(std::vector<float>(n + first));
      const Tensor vd = upload(std::vector<float>(n + first));
      Tensor gd = upload(std::vector<float>(n + first));
      const Tensor stepd = upload(std::vector<std::int32_t>{0});
      for (int s = 0; s < 3; ++s) {
        const std::vector<float> g = uniform_vec(n + first, -1.0f, 1.0f, rng);
        gd.copy_from(upload(g));  // a fresh gradient (the kernel zeroed the last one)
        ref.step(std::vector<double>(g.begin() + first, g.end()));
        const auto p = [first](const Tensor& t) { return ptr<float>(t) + first; };
        launch_adam_step(p(wd), p(gd), p(md), p(vd), static_cast<std::int64_t>(n), ref.lr, ref.beta1, ref.beta2,
                         ref.eps, ptr<std::int32_t>(stepd), stream());
        launch_finish_step(ptr<std::int32_t>(stepd), stream());
        const auto tail = [first, n](const std::vector<float>& v) {
          return std::vector<double>(v.begin() + first, v.begin() + first + n);
        };
        const std::string what = "n " + std::to_string(n) + " first " + std::to_string(first) + " step " +
                                 std::to_string(s + 1);
        EXPECT_TRUE(testing::all_close(tail(download<float>(wd, n + first)), ref.w, kAdamW)) << what;
        EXPECT_TRUE(testing::all_close(tail(download<float>(md, n + first)), ref.m, kAdamM)) << what;
        EXPECT_TRUE(testing::all_close(tail(download<float>(vd, n + first)), ref.v, kAdamV)) << what;
        EXPECT_TRUE(testing::all_close(tail(download<float>(gd, n + first)), std::vector<double>(n, 0.0), kExact))
            << what << " (gradient zeroed)";
        EXPECT_EQ(download<std::int32_t>(stepd, 1)[0], s + 1) << what;
      }
    }
}

// The fused step moves the count on before Adam runs (launch_adam_step's count_moved):
// three steps that way give the same bits as the usual update-then-count, and the same count.
TEST(KernelsGpu, AdamAfterTheCountMovedGivesTheUsualUpdate) {
  MF_SKIP_WITHOUT_GPU();
  Rng rng(62);
  const std::size_t n = 1003;
  const auto count = static_cast<std::int64_t>(n);
  const std::vector<float> w0 = uniform_vec(n, -1.0f, 1.0f, rng);
  struct State {
    Tensor w, g, m, v, step;
  };
  State usual{upload(w0), upload(std::vector<float>(n)), upload(std::vector<float>(n)), upload(std::vector<float>(n)),
              upload(std::vector<std::int32_t>{0})};
  State moved{upload(w0), upload(std::vector<float>(n)), upload(std::vector<float>(n)), upload(std::vector<float>(n)),
              upload(std::vector<std::int32_t>{0})};
  const AdamRef h;
  for (int s = 0; s < 3; ++s) {
    const std::vector<float> g = uniform_vec(n, -1.0f, 1.0f, rng);
    for (State* st : {&usual, &moved}) st->g.copy_from(upload(g));
    launch_adam_step(ptr<float>(usual.w), ptr<float>(usual.g), ptr<float>(usual.m), ptr<float>(usual.v), count, h.lr,
                     h.beta1, h.beta2, h.eps, ptr<std::int32_t>(usual.step), stream());
    launch_finish_step(ptr<std::int32_t>(usual.step), stream());
    launch_finish_step(ptr<std::int32_t>(moved.step), stream());
    launch_adam_step(ptr<float>(moved.w), ptr<float>(moved.g), ptr<float>(moved.m), ptr<float>(moved.v), count, h.lr,
                     h.beta1, h.beta2, h.eps, ptr<std::int32_t>(moved.step), stream(), true);
    for (Tensor State::*t : {&State::w, &State::m, &State::v})
      EXPECT_EQ(download<float>(usual.*t, n), download<float>(moved.*t, n)) << "step " << s + 1;
    EXPECT_EQ(download<std::int32_t>(moved.step, 1)[0], s + 1);
  }
}

// The device step count stops at 2^31 - 1 (FP32 and mixed precision), and Adam's update
// there has a bias correction of 1. It used to wrap to -2^31, whose bias correction is NaN.
TEST(KernelsGpu, StepCountStopsAtInt32Max) {
  MF_SKIP_WITHOUT_GPU();
  constexpr std::int32_t kMax = std::numeric_limits<std::int32_t>::max();
  AdamRef ref;
  ref.w = {1.0, -1.0}, ref.m = {0.0, 0.0}, ref.v = {0.0, 0.0};
  const Tensor wd = upload(std::vector<float>{1.0f, -1.0f}), md = upload(std::vector<float>(2));
  const Tensor vd = upload(std::vector<float>(2)), gd = upload(std::vector<float>{1.0f, -1.0f});
  const Tensor stepd = upload(std::vector<std::int32_t>{kMax - 1});
  launch_adam_step(ptr<float>(wd), ptr<float>(gd), ptr<float>(md), ptr<float>(vd), 2, ref.lr, ref.beta1, ref.beta2,
                   ref.eps, ptr<std::int32_t>(stepd), stream());
  launch_finish_step(ptr<std::int32_t>(stepd), stream());
  // the reference at t = 2^31 - 1: beta^t is 0 in double, so lr_t = lr
  const double lr = ref.lr, move = lr * 0.1 / (std::sqrt(0.001) + static_cast<double>(ref.eps));
  EXPECT_TRUE(testing::all_close(to_d(download<float>(wd, 2)), {1.0 - move, -1.0 + move}, kAdamW));
  EXPECT_EQ(download<std::int32_t>(stepd, 1)[0], kMax);
  launch_finish_step(ptr<std::int32_t>(stepd), stream());
  EXPECT_EQ(download<std::int32_t>(stepd, 1)[0], kMax) << "FP32 finish at the end of the count";
  const Tensor stated = upload(std::vector<LossScaleState>{{1024.0f, 0, 0, 0}});
  launch_finish_step_mixed(ptr<std::int32_t>(stepd), ptr<LossScaleState>(stated), 2000, 1.0f, 65536.0f, stream());
  EXPECT_EQ(download<std::int32_t>(stepd, 1)[0], kMax) << "mixed-precision finish at the end of the count";
}

TEST(KernelsGpu, SgdStepMatchesReferenceOverThreeSteps) {
  MF_SKIP_WITHOUT_GPU();
  Rng rng(62);
  const float lr = 0.01f, momentum = 0.9f;
  for (const std::size_t n : {std::size_t{1003}, std::size_t{4096}, std::size_t{3}}) {
    const std::vector<float> w0 = uniform_vec(n, -1.0f, 1.0f, rng);
    std::vector<double> w(w0.begin(), w0.end()), vel(n, 0.0);
    const Tensor wd = upload(w0), veld = upload(std::vector<float>(n));
    Tensor gd = upload(std::vector<float>(n));
    const Tensor stepd = upload(std::vector<std::int32_t>{0});
    for (int s = 0; s < 3; ++s) {
      const std::vector<float> g = uniform_vec(n, -1.0f, 1.0f, rng);
      gd.copy_from(upload(g));
      for (std::size_t i = 0; i < n; ++i) {
        vel[i] = static_cast<double>(momentum) * vel[i] - static_cast<double>(lr) * g[i];
        w[i] += vel[i];
      }
      launch_sgd_step(ptr<float>(wd), ptr<float>(gd), ptr<float>(veld), static_cast<std::int64_t>(n), lr, momentum,
                      stream());
      launch_finish_step(ptr<std::int32_t>(stepd), stream());
      const std::string what = "n " + std::to_string(n) + " step " + std::to_string(s + 1);
      // a few float roundings of w (|w| < 1.1) and of the velocity (|vel| < 0.03)
      EXPECT_TRUE(testing::all_close(to_d(download<float>(wd, n)), w, Tol{1e-6, 1e-5})) << what;
      EXPECT_TRUE(testing::all_close(to_d(download<float>(veld, n)), vel, Tol{1e-8, 1e-5})) << what;
      EXPECT_TRUE(testing::all_close(to_d(download<float>(gd, n)), std::vector<double>(n, 0.0), kExact)) << what;
      EXPECT_EQ(download<std::int32_t>(stepd, 1)[0], s + 1) << what;
    }
  }
}

// ---- mixed precision: unscale_check + adam_step_mixed + finish_step_mixed ----

LossScaleState read_state(const Tensor& d) { return download<LossScaleState>(d, 1)[0]; }

TEST(KernelsGpu, MixedAdamSkipsOverflowAndAdjustsScale) {
  MF_SKIP_WITHOUT_GPU();
  Rng rng(71);
  LossScalerConfig cfg;
  cfg.initial_scale = 1024.0f;
  cfg.growth_interval = 3;  // small, so that growth happens within the test
  // clean x3 (growth to 2048 after the third), inf in the vector part, clean, NaN in the
  // tail, clean x3 (growth again).
  enum Kind { kClean, kInf, kNanTail };
  const Kind plan[] = {kClean, kClean, kClean, kInf, kClean, kNanTail, kClean, kClean, kClean};
  for (const std::size_t n : {std::size_t{1003}, std::size_t{4096}}) {
    LossScalerModel model(cfg);
    AdamRef ref;
    const std::vector<float> w0 = uniform_vec(n, -1.0f, 1.0f, rng);
    ref.w.assign(w0.begin(), w0.end());
    ref.m.assign(n, 0.0);
    ref.v.assign(n, 0.0);
    const Tensor wd = upload(w0), hwd = upload(to_halves(w0));
    const Tensor md = upload(std::vector<float>(n)), vd = upload(std::vector<float>(n));
    Tensor hgd = upload(std::vector<Half>(n));
    const Tensor stepd = upload(std::vector<std::int32_t>{0});
    const Tensor stated = upload(std::vector<LossScaleState>{{cfg.initial_scale, 0, 0, 0}});
    std::vector<float> w_prev = w0, m_prev(n, 0.0f), v_prev(n, 0.0f);
    std::vector<Half> hw_prev = to_halves(w0);

    int step_no = 0;
    for (const Kind kind : plan) {
      ++step_no;
      const float scale = model.scale;  // what the loss was multiplied by this step
      std::vector<Half> hg(n);
      std::vector<double> g(n);
      for (std::size_t i = 0; i < n; ++i) {
        hg[i] = float_to_half(rng.uniform(-1e-2f, 1e-2f) * scale);  // |g * scale| <= 41: no overflow
        g[i] = static_cast<double>(half_to_float(hg[i])) / scale;    // what the kernel unscales to
      }
      if (kind == kInf) hg[17].bits = 0x7c00;        // +inf, found by a 16-byte group
      if (kind == kNanTail) hg[n - 2].bits = 0xfe00;  // -NaN; for n = 1003 in the tail past 8 * 125
      hgd.copy_from(upload(hg));

      launch_unscale_check(ptr<Half>(hgd), static_cast<std::int64_t>(n), ptr<LossScaleState>(stated), stream());
      launch_adam_step_mixed(ptr<float>(wd), ptr<Half>(hwd), ptr<Half>(hgd), ptr<float>(md), ptr<float>(vd),
                             static_cast<std::int64_t>(n), ref.lr, ref.beta1, ref.beta2, ref.eps,
                             ptr<std::int32_t>(stepd), ptr<LossScaleState>(stated), stream());
      launch_finish_step_mixed(ptr<std::int32_t>(stepd), ptr<LossScaleState>(stated), cfg.growth_interval,
                               cfg.min_scale, cfg.max_scale, stream());
      const bool applied = model.update(kind != kClean);
      if (applied) ref.step(g);

      const std::string what = "n " + std::to_string(n) + " step " + std::to_string(step_no);
      const LossScaleState st = read_state(stated);
      EXPECT_EQ(st.scale, model.scale) << what;
      EXPECT_EQ(st.clean_steps, model.clean_steps) << what;
      EXPECT_EQ(st.skipped, model.skipped) << what;
      EXPECT_EQ(st.found_inf, 0) << what << " (cleared for the next step)";
      EXPECT_EQ(download<std::int32_t>(stepd, 1)[0], ref.t) << what;
      // The growth rule spelled out, not only through the model:
      if (step_no == 3) {
        EXPECT_EQ(st.scale, 2048.0f) << what << " (grows after 3 clean steps)";
      }
      if (step_no == 4) {
        EXPECT_EQ(st.scale, 1024.0f) << what << " (halves on inf)";
        EXPECT_EQ(st.skipped, 1) << what;
      }

      const std::vector<float> w = download<float>(wd, n), m = download<float>(md, n), v = download<float>(vd, n);
      const std::vector<Half> hw = download<Half>(hwd, n), hg_after = download<Half>(hgd, n);
      int nonzero = 0;
      for (const Half h : hg_after) nonzero += h.bits != 0;
      EXPECT_EQ(nonzero, 0) << what << " (f16 gradients zeroed, clean or not)";
      if (applied) {
        EXPECT_TRUE(testing::all_close(to_d(w), ref.w, kAdamW)) << what;
        EXPECT_TRUE(testing::all_close(to_d(m), ref.m, kAdamM)) << what;
        EXPECT_TRUE(testing::all_close(to_d(v), ref.v, kAdamV)) << what;
        int bad = 0;
        for (std::size_t i = 0; i < n; ++i) bad += hw[i].bits != float_to_half(w[i]).bits;
        EXPECT_EQ(bad, 0) << what << " (half_w is the f16 rounding of the f32 master)";
      } else {  // skipped: bit for bit what it was
        EXPECT_EQ(std::memcmp(w.data(), w_prev.data(), n * 4), 0) << what << " (w unchanged)";
        EXPECT_EQ(std::memcmp(m.data(), m_prev.data(), n * 4), 0) << what << " (m unchanged)";
        EXPECT_EQ(std::memcmp(v.data(), v_prev.data(), n * 4), 0) << what << " (v unchanged)";
        EXPECT_EQ(std::memcmp(hw.data(), hw_prev.data(), n * 2), 0) << what << " (half_w unchanged)";
      }
      w_prev = w, m_prev = m, v_prev = v, hw_prev = hw;
    }
  }
}

TEST(KernelsGpu, FinishStepMixedClampsScale) {
  MF_SKIP_WITHOUT_GPU();
  const float min_scale = 0.25f, max_scale = 2048.0f;
  struct Case {
    LossScaleState before;
    LossScaleState after;
    std::int32_t step_after;  // from 10
  };
  const Case cases[] = {
      {{2048.0f, 2, 0, 0}, {2048.0f, 0, 0, 0}, 11},  // would grow past max_scale: stays
      {{1024.0f, 2, 0, 0}, {2048.0f, 0, 0, 0}, 11},  // third clean step: doubles
      {{1024.0f, 1, 0, 0}, {1024.0f, 2, 0, 0}, 11},  // second clean step: counts
      {{0.25f, 2, 3, 1}, {0.25f, 0, 4, 0}, 10},      // would halve below min_scale: stays
      {{0.75f, 2, 3, 1}, {0.375f, 0, 4, 0}, 10},     // halves, skipped++, no step
  };
  for (const auto& c : cases) {
    const Tensor stated = upload(std::vector<LossScaleState>{c.before});
    const Tensor stepd = upload(std::vector<std::int32_t>{10});
    launch_finish_step_mixed(ptr<std::int32_t>(stepd), ptr<LossScaleState>(stated), 3, min_scale, max_scale, stream());
    const LossScaleState st = read_state(stated);
    EXPECT_EQ(st.scale, c.after.scale) << "scale before " << c.before.scale;
    EXPECT_EQ(st.clean_steps, c.after.clean_steps) << "scale before " << c.before.scale;
    EXPECT_EQ(st.skipped, c.after.skipped) << "scale before " << c.before.scale;
    EXPECT_EQ(st.found_inf, 0);
    EXPECT_EQ(download<std::int32_t>(stepd, 1)[0], c.step_after) << "scale before " << c.before.scale;
  }
}

TEST(KernelsGpu, UnscaleCheckOnlySetsTheFlag) {
  MF_SKIP_WITHOUT_GPU();
  // Clean gradients leave found_inf as it was (0 stays 0, 1 stays 1: only finish clears it);
  // one inf or NaN anywhere, including the scalar tail and the very last element, sets it.
  const std::size_t n = 1003;
  for (const std::int32_t start : {0, 1})
    for (const long bad_at : {-1L, 0L, 999L, 1000L, 1002L}) {
      std::vector<Half> g = to_halves(std::vector<float>(n, 65504.0f));  // largest finite: not inf
      if (bad_at >= 0) g[static_cast<std::size_t>(bad_at)].bits = bad_at % 2 ? 0xfc00 : 0x7e01;  // -inf / NaN
      const Tensor gd = upload(g);
      const Tensor stated = upload(std::vector<LossScaleState>{{8.0f, 1, 2, start}});
      launch_unscale_check(ptr<Half>(gd), static_cast<std::int64_t>(n), ptr<LossScaleState>(stated), stream());
      const LossScaleState st = read_state(stated);
      EXPECT_EQ(st.found_inf, bad_at >= 0 ? 1 : start) << "bad at " << bad_at << ", start " << start;
      EXPECT_EQ(st.scale, 8.0f);
      EXPECT_EQ(st.clean_steps, 1);
      EXPECT_EQ(st.skipped, 2);
    }
}

// ---- the word comparison of doctor --burn ----

// Words that differ in one bit anywhere (the sign, a NaN payload, the lowest bit) count;
// equal words do not, NaNs included; the count adds to what is there. Sizes off the
// block and warp multiples.
TEST(KernelsGpu, CountMismatchCountsEveryDifferingWord) {
  MF_SKIP_WITHOUT_GPU();
  Rng rng(41);
  for (std::int64_t n : {1, 31, 257, 70001}) {
    SCOPED_TRACE(n);
    std::vector<std::uint32_t> a(static_cast<std::size_t>(n)), b;
    for (auto& w : a) w = static_cast<std::uint32_t>(rng.below(1ull << 32));
    a[0] = 0x7fc00001u;  // a NaN, equal to itself word for word
    b = a;
    std::uint64_t expected = 0;
    for (std::size_t i = 1; i < b.size(); i += 1 + rng.below(7)) {
      b[i] ^= 1u << rng.below(32);
      ++expected;
    }
    const std::uint64_t before = 5;
    Tensor da = upload(a), db = upload(b), count = upload(std::vector<std::uint64_t>{before});
    launch_count_mismatch(ptr<std::uint32_t>(da), ptr<std::uint32_t>(db), n, ptr<unsigned long long>(count), stream());
    EXPECT_EQ(download<std::uint64_t>(count, 1)[0], before + expected);
    launch_count_mismatch(ptr<std::uint32_t>(da), ptr<std::uint32_t>(da), n, ptr<unsigned long long>(count), stream());
    EXPECT_EQ(download<std::uint64_t>(count, 1)[0], before + expected) << "a buffer against itself";
  }
}

TEST(KernelsGpu, ZeroSizesLaunchNothing) {
  MF_SKIP_WITHOUT_GPU();
  // n == 0 must not launch (a grid of 0 blocks is a launch error), so null pointers are fine.
  const GpuStream s = stream();
  EXPECT_NO_THROW({
    launch_cast_f32_to_f16(nullptr, nullptr, 0, s);
    launch_cast_f16_to_f32(nullptr, nullptr, 0, s);
    launch_cast_u8_to_f32(nullptr, nullptr, 0, 1.0f, s);
    launch_bias_act_forward(nullptr, nullptr, false, 0, 32, true, s);
    launch_bias_act_backward(nullptr, nullptr, nullptr, nullptr, nullptr, true, 0, 32, true, s);
    launch_maxpool2x2_forward(nullptr, nullptr, nullptr, false, 0, 26, 26, 32, s);
    launch_maxpool2x2_backward(nullptr, nullptr, nullptr, true, 0, 26, 26, 32, s);
    launch_softmax_xent(nullptr, false, nullptr, 0, 10, nullptr, 1.0f, nullptr, nullptr, nullptr, s);
    launch_gather_batch(nullptr, nullptr, nullptr, nullptr, 0, 784, nullptr, false, nullptr, s);
    launch_advance_cursor(nullptr, 0, s);
    launch_normalize_batch(nullptr, nullptr, 0, 784, nullptr, true, nullptr, s);
    launch_adam_step(nullptr, nullptr, nullptr, nullptr, 0, 1e-3f, 0.9f, 0.999f, 1e-7f, nullptr, s);
    launch_sgd_step(nullptr, nullptr, nullptr, 0, 0.1f, 0.9f, s);
    launch_unscale_check(nullptr, 0, nullptr, s);
    launch_adam_step_mixed(nullptr, nullptr, nullptr, nullptr, nullptr, 0, 1e-3f, 0.9f, 0.999f, 1e-7f, nullptr,
                           nullptr, s);
    launch_count_mismatch(nullptr, nullptr, 0, nullptr, s);
    gpu_stream_synchronize(s);
  });
}

}  // namespace
}  // namespace mf
