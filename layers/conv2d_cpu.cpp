// conv2d_cpu.cpp: Conv2D on the CPU, the batch split across threads. Every path computes
// the same three products. With the kernel stored (K, k, k, C) as a K x kkC matrix W, and
// "col" the matrix whose row p holds output pixel p's kkC inputs (its receptive field):
//
//   forward          Y  (P x K)   = col (P x kkC) * W^T            P = output pixels
//   weight gradient  dW (K x kkC) += dZ^T (K x P) * col (P x kkC)  dZ = dY masked by ReLU
//   data gradient    dcol (P x kkC) = dZ (P x K) * W, scattered back (col2im)
//
// Which code computes them, fastest first:
// - Implicit GEMM (K a multiple of the vector width; the model's second layer): the
//   register-tiled kernels of conv2d_cpu_kernels.h read the receptive fields straight from
//   x, which NHWC makes k runs of k*C contiguous floats; col is never built. When most of
//   dZ is zero, as behind max-pooling, the gradients come from lists of its nonzero
//   entries instead ("Sparse gradients" there).
// - Direct (few inputs per output: the first layer, 1 channel x 3x3 = 9): a GEMM with an
//   inner dimension of 9 is a poor GEMM, so per output pixel y[0..K) = b + sum over the kkC
//   inputs t of x_t * Wt[t][0..K), W transposed to (kkC, K) so that the filters are
//   contiguous and vectorise; its weight gradient the same way round, without dx.
// - im2col + Eigen GEMMs (anything else): each thread walks its images in blocks whose
//   column matrix stays in the core's L2 cache between the GEMMs that use it.
// Weight and bias gradients are summed per thread, then reduced.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>

#include "layers/conv2d.h"
#include "layers/conv2d_cpu_kernels.h"
#include "layers/conv_options.h"
#include "layers/eigen_util.h"
#include "tensor/parallel.h"

namespace mf {

namespace {

constexpr std::int64_t kTargetBlockRows = 512;  // output pixels per GEMM block
constexpr std::int64_t kMaxDirectInputs = 32;   // kkC up to this takes the direct path
// The sparse weight gradient reads receptive-field rows of a block of input images in no
// particular order: blocks of images whose inputs fit in a core's L1 data cache (48 KB on
// the cores measured; 2 MNIST feature maps of 13x13x32 floats) keep those reads out of L2.
constexpr std::int64_t kL1Bytes = 48 * 1024;
// The implicit backward when it listed dZ's nonzeros, as --verbose names it: cpu_config()
// adds how sparse dZ was.
constexpr const char* kImplicitListed = "implicit GEMM";

struct ConvGeom {
  std::int64_t n, h, w, c, k, oh, ow, kk_c, filters;
  std::int64_t pixels() const { return oh * ow; }
  // Where, in a batch of input images, output pixel p's receptive field starts (its top-left
  // input, channel 0); p counts the output pixels of the whole batch.
  std::int64_t field(std::int64_t p) const {
    const std::int64_t q = p % pixels();
    return ((p / pixels() * h + q / ow) * w + q % ow) * c;
  }
  std::int64_t images_per_block() const { return std::max<std::int64_t>(1, kTargetBlockRows / pixels()); }
  std::int64_t images_per_l1() const {
    return std::max<std::int64_t>(1, kL1Bytes / (h * w * c * static_cast<std::int64_t>(sizeof(float))));
  }
};

ConvGeom geometry(const Tensor& x, std::int64_t k, std::int64_t filters) {
  ConvGeom g{};
  g.n = x.dim(0), g.h = x.dim(1), g.w = x.dim(2), g.c = x.dim(3), g.k = k;
  g.oh = g.h - k + 1, g.ow = g.w - k + 1, g.kk_c = k * k * g.c, g.filters = filters;
  return g;
}

// col rows for images [n0, n1): row (n, oh, ow), columns (r, s, c).
void im2col(const ConvGeom& g, const float* x, std::int64_t n0, std::int64_t n1, float* col) {
  const std::int64_t run = g.k * g.c;  // contiguous floats per kernel row
  for (std::int64_t n = n0; n < n1; ++n) {
    const float* img = x + n * g.h * g.w * g.c;
    for (std::int64_t oh = 0; oh < g.oh; ++oh)
      for (std::int64_t ow = 0; ow < g.ow; ++ow) {
        for (std::int64_t r = 0; r < g.k; ++r) {
          const float* src = img + ((oh + r) * g.w + ow) * g.c;
          for (std::int64_t i = 0; i < run; ++i) col[r * run + i] = src[i];
        }
        col += g.kk_c;
      }
  }
}

// dx[n, oh+r, ow .. ow+k-1, :] += dcol rows, for images [n0, n1) (dx zeroed by the caller).
void col2im_add(const ConvGeom& g, const float* dcol, std::int64_t n0, std::int64_t n1, float* dx) {
  const std::int64_t run = g.k * g.c;
  for (std::int64_t n = n0; n < n1; ++n) {
    float* img = dx + n * g.h * g.w * g.c;
    for (std::int64_t oh = 0; oh < g.oh; ++oh)
      for (std::int64_t ow = 0; ow < g.ow; ++ow) {
        for (std::int64_t r = 0; r < g.k; ++r) {
          float* dst = img + ((oh + r) * g.w + ow) * g.c;
          const float* src = dcol + r * run;
          for (std::int64_t i = 0; i < run; ++i) dst[i] += src[i];
        }
        dcol += g.kk_c;
      }
  }
}

// The kkC inputs of output pixel (n, oh, ow), in (r, s, c) order.
inline void gather_inputs(const ConvGeom& g, const float* img, std::int64_t oh, std::int64_t ow, float* in) {
  const std::int64_t run = g.k * g.c;
  for (std::int64_t r = 0; r < g.k; ++r) {
    const float* src = img + ((oh + r) * g.w + ow) * g.c;
    for (std::int64_t i = 0; i < run; ++i) in[r * run + i] = src[i];
  }
}

// W (K, kkC) -> Wt (kkC, K)
void transpose_weights(const ConvGeom& g, const float* w, float* wt) {
  for (std::int64_t o = 0; o < g.filters; ++o)
    for (std::int64_t t = 0; t < g.kk_c; ++t) wt[t * g.filters + o] = w[o * g.kk_c + t];
}

}  // namespace

namespace {

// One image's direct convolution. kInputs, kFilters > 0 fix kkC and K at compile time, so
// the loops unroll and the accumulators live in registers; 0 means "read from g".
template <int kInputs, int kFilters>
void direct_image(const ConvGeom& g, const float* img, const float* wt, const float* bias, bool relu, float* out) {
  const std::int64_t K = kFilters > 0 ? kFilters : g.filters;
  const std::int64_t KK = kInputs > 0 ? kInputs : g.kk_c;
  float in[kMaxDirectInputs];
  for (std::int64_t oh = 0; oh < g.oh; ++oh)
    for (std::int64_t ow = 0; ow < g.ow; ++ow, out += K) {
      gather_inputs(g, img, oh, ow, in);
      float acc[kFilters > 0 ? kFilters : 1024];
      for (std::int64_t o = 0; o < K; ++o) acc[o] = bias[o];
      for (std::int64_t t = 0; t < KK; ++t) {
        const float v = in[t];
        const float* wrow = wt + t * K;
        for (std::int64_t o = 0; o < K; ++o) acc[o] += v * wrow[o];
      }
      for (std::int64_t o = 0; o < K; ++o) out[o] = relu ? cpu::relu(acc[o]) : acc[o];
    }
}

// The model's first layer, with the kernel size kK, channels kC and filters kFilters fixed at
// compile time: every loop over the k*k*C inputs of a pixel unrolls, each input is one
// broadcast straight from the image, and the filters are kV vectors.
//
// Forward: kPix neighbouring pixels of an output row at a time, so that kPix * kV sums are in
// flight. One pixel alone would be kV chains of k*k*C FMAs, each FMA waiting ~4 cycles for
// the one before: a quarter of the core's FMA rate.
template <int kK, int kC, int kFilters>
void direct_image_small(const ConvGeom& g, const float* img, const float* wt, const float* bias, bool relu,
                        float* out) {
  static_assert(kFilters % cpu::kLanes == 0, "whole vectors of filters");
  constexpr int kV = kFilters / cpu::kLanes, kInputs = kK * kK * kC, kPix = 4;
  cpu::Vec w[kInputs][kV], b[kV];
  for (int v = 0; v < kV; ++v) {
    b[v] = cpu::load(bias + v * cpu::kLanes);
    for (int t = 0; t < kInputs; ++t) w[t][v] = cpu::load(wt + t * kFilters + v * cpu::kLanes);
  }
  for (std::int64_t oh = 0; oh < g.oh; ++oh)
    for (std::int64_t ow0 = 0; ow0 < g.ow; ow0 += kPix) {
      const float* in = img + (oh * g.w + ow0) * kC;  // top-left input of the first pixel
      float* o = out + (oh * g.ow + ow0) * kFilters;
      cpu::with_count<kPix>(static_cast<int>(std::min<std::int64_t>(kPix, g.ow - ow0)), [&](auto pix) {
        constexpr int kP = decltype(pix)::value;
        cpu::Vec acc[kP][kV];
        for (int p = 0; p < kP; ++p)
          for (int v = 0; v < kV; ++v) acc[p][v] = b[v];
        for (int r = 0; r < kK; ++r)
          for (int sc = 0; sc < kK * kC; ++sc)  // (s, c) of kernel row r: contiguous in NHWC
            for (int p = 0; p < kP; ++p) {
              const cpu::Vec a = cpu::splat(in[r * g.w * kC + p * kC + sc]);
              for (int v = 0; v < kV; ++v) acc[p][v] += a * w[r * kK * kC + sc][v];
            }
        for (int p = 0; p < kP; ++p)
          for (int v = 0; v < kV; ++v)
            cpu::store(o + p * kFilters + v * cpu::kLanes, relu ? cpu::relu(acc[p][v]) : acc[p][v]);
      });
    }
}

// Weight and bias gradients of images [n0, n1), ReLU mask applied on the fly:
// dWt[t][o] += x_t * dz[o], db[o] += dz[o] for every output pixel, the k*k*C x kV sums in
// registers. Used when no input gradient is needed (the first layer), where the GEMM form's
// 9-wide output would be inefficient.
template <int kK, int kC, int kFilters>
void direct_weight_grad(const ConvGeom& g, const float* x, const float* y, const float* dy, bool relu,
                        std::int64_t n0, std::int64_t n1, float* dwt, float* db) {
  static_assert(kFilters % cpu::kLanes == 0, "whole vectors of filters");
  constexpr int kV = kFilters / cpu::kLanes, kInputs = kK * kK * kC;
  cpu::Vec acc[kInputs][kV], bacc[kV];
  for (int v = 0; v < kV; ++v) {
    bacc[v] = cpu::Vec{};
    for (int t = 0; t < kInputs; ++t) acc[t][v] = cpu::Vec{};
  }
  for (std::int64_t n = n0; n < n1; ++n) {
    const float* img = x + n * g.h * g.w * kC;
    for (std::int64_t oh = 0; oh < g.oh; ++oh)
      for (std::int64_t ow = 0; ow < g.ow; ++ow) {
        const std::int64_t p = ((n * g.oh + oh) * g.ow + ow) * kFilters;
        cpu::Vec dz[kV];
        for (int v = 0; v < kV; ++v) {
          const cpu::Vec d = cpu::load(dy + p + v * cpu::kLanes);
          dz[v] = relu ? (cpu::load(y + p + v * cpu::kLanes) > 0.0f ? d : cpu::Vec{}) : d;
          bacc[v] += dz[v];
        }
        const float* in = img + (oh * g.w + ow) * kC;
        for (int r = 0; r < kK; ++r)
          for (int sc = 0; sc < kK * kC; ++sc) {
            const cpu::Vec a = cpu::splat(in[r * g.w * kC + sc]);
            for (int v = 0; v < kV; ++v) acc[r * kK * kC + sc][v] += a * dz[v];
          }
      }
  }
  for (int t = 0; t < kInputs; ++t)
    for (int v = 0; v < kV; ++v) cpu::store(dwt + t * kFilters + v * cpu::kLanes, acc[t][v]);
  for (int v = 0; v < kV; ++v) cpu::store(db + v * cpu::kLanes, bacc[v]);
}

}  // namespace

namespace {

// ---- implicit GEMM (conv2d_cpu_kernels.h): filters a multiple of the vector width ----

using cpu::vecs_for;

// y (N, H-k+1, W-k+1, K) = conv(x (N, H, W, C), Wt) [+ bias, ReLU]: output pixels are dealt
// to threads in tiles of kTileRegs / kVecs.
template <int kVecs>
void implicit_conv(std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c, std::int64_t k, const float* x,
                   const float* wt, std::int64_t K, const float* bias, bool relu, float* y) {
  constexpr int kRows = cpu::kTileRegs / kVecs;
  const ConvGeom g{n, h, w, c, k, h - k + 1, w - k + 1, k * k * c, K};
  const std::int64_t total = n * g.pixels(), tiles = (total + kRows - 1) / kRows;
  cpu_pool().parallel_for(tiles, [&](std::int64_t t0, std::int64_t t1, int) {
    const float* in[kRows];
    float* out[kRows];
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t p0 = t * kRows;
      const int rows = static_cast<int>(std::min<std::int64_t>(kRows, total - p0));
      for (int i = 0; i < rows; ++i) {
        in[i] = x + g.field(p0 + i);
        out[i] = y + (p0 + i) * K;
      }
      for (std::int64_t o0 = 0; o0 < K; o0 += kVecs * cpu::kLanes)
        cpu::with_rows<kVecs>(rows, [&](auto r) {
          cpu::conv_tile<decltype(r)::value, kVecs>(in, w * c, k, k * c, wt, K, o0, bias, relu, out);
        });
    }
  });
}


// dwt (kkC, K) += sum over pixels [p0, p1) of x_p's receptive field (x) dz_p, pixels taken
// in chunks whose dz rows stay in L1/L2 while every tile of dwt passes over them.
template <int kVecs>
void implicit_wgrad(const ConvGeom& g, const float* x, const float* dzm, std::int64_t p0, std::int64_t p1,
                    float* dwt) {
  constexpr int kRows = cpu::kTileRegs / kVecs;
  constexpr std::int64_t kChunk = 128;
  const std::int64_t K = g.filters, run = g.k * g.c;
  const float* in[kChunk];
  const float* dz[kChunk];
  for (std::int64_t c0 = p0; c0 < p1; c0 += kChunk) {
    const std::int64_t np = std::min(kChunk, p1 - c0);
    for (std::int64_t i = 0; i < np; ++i) {
      const std::int64_t p = c0 + i;
      in[i] = x + g.field(p);
      dz[i] = dzm + p * K;
    }
    for (std::int64_t r = 0; r < g.k; ++r)
      for (std::int64_t j0 = 0; j0 < run; j0 += kRows) {
        const int rows = static_cast<int>(std::min<std::int64_t>(kRows, run - j0));
        for (std::int64_t o0 = 0; o0 < K; o0 += kVecs * cpu::kLanes)
          cpu::with_rows<kVecs>(rows, [&](auto rr) {
            cpu::wgrad_tile<decltype(rr)::value, kVecs>(in, dz, np, r * g.w * g.c + j0, o0,
                                                        dwt + (r * run + j0) * K, K);
          });
      }
  }
}

// dx (N, H, W, C) = the data gradient for images [n0, n1), by scatter-adding tiles of
// dgrad_tile (overwrites those images of dx). Needs k*C a multiple of kLanes*kVecs.
template <int kVecs>
void implicit_dgrad(const ConvGeom& g, const float* dzm, const float* w, std::int64_t n0, std::int64_t n1,
                    float* dx) {
  constexpr int kRows = cpu::kTileRegs / kVecs;
  const std::int64_t K = g.filters, run = g.k * g.c, pixels = g.oh * g.ow;
  if (n1 > n0) std::memset(dx + n0 * g.h * g.w * g.c, 0, (n1 - n0) * g.h * g.w * g.c * sizeof(float));
  const float* dz[kRows];
  float* field[kRows];
  const std::int64_t p_end = n1 * pixels;
  for (std::int64_t p0 = n0 * pixels; p0 < p_end; p0 += kRows) {
    const int rows = static_cast<int>(std::min<std::int64_t>(kRows, p_end - p0));
    for (int i = 0; i < rows; ++i) {
      const std::int64_t p = p0 + i;
      dz[i] = dzm + p * K;
      field[i] = dx + g.field(p);
    }
    for (std::int64_t r = 0; r < g.k; ++r)
      for (std::int64_t j0 = 0; j0 < run; j0 += kVecs * cpu::kLanes)
        cpu::with_rows<kVecs>(rows, [&](auto rr) {
          cpu::dgrad_tile<decltype(rr)::value, kVecs>(dz, field, r * g.w * g.c + j0, w + r * run + j0, g.kk_c, K);
        });
  }
}

}  // namespace

void cpu::conv_forward(std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c, std::int64_t k, const float* x,
                       const float* wt, std::int64_t K, const float* bias, bool relu, float* y) {
  switch (vecs_for(K)) {
    case 4: return implicit_conv<4>(n, h, w, c, k, x, wt, K, bias, relu, y);
    case 2: return implicit_conv<2>(n, h, w, c, k, x, wt, K, bias, relu, y);
    default: return implicit_conv<1>(n, h, w, c, k, x, wt, K, bias, relu, y);
  }
}

void Conv2D::forward_direct(const Tensor& x, Tensor& y) {
  const ConvGeom g = geometry(x, k_, filters_);
  const std::int64_t K = g.filters;
  if (scratch_.size() < static_cast<std::size_t>(g.kk_c * K)) scratch_.resize(static_cast<std::size_t>(g.kk_c * K));
  float* wt = scratch_.data();
  transpose_weights(g, weight_.value.data<float>(), wt);
  const float* xp = x.data<float>();
  const float* bp = bias_.value.data<float>();
  float* yp = y.data<float>();
  const bool relu = act_ == Activation::kRelu;
  const std::int64_t in_size = g.h * g.w * g.c, out_size = g.oh * g.ow * K;
  cpu_pool().parallel_for(g.n, [&](std::int64_t n0, std::int64_t n1, int) {
    for (std::int64_t n = n0; n < n1; ++n) {
      const float* img = xp + n * in_size;
      float* out = yp + n * out_size;
      if (g.k == 3 && g.c == 1 && K == 32) direct_image_small<3, 1, 32>(g, img, wt, bp, relu, out);  // first layer
      else if (K == 32) direct_image<0, 32>(g, img, wt, bp, relu, out);
      else if (K == 64) direct_image<0, 64>(g, img, wt, bp, relu, out);
      else direct_image<0, 0>(g, img, wt, bp, relu, out);
    }
  });
}

void Conv2D::backward_direct_3x3x1(const Tensor& dy) {
  constexpr int kInputs = 9, kFilters = 32;
  const ConvGeom g = geometry(x_, k_, filters_);
  ThreadPool& pool = cpu_pool();
  const int threads = pool.num_threads();
  const std::int64_t per_thread = kInputs * kFilters + kFilters;
  if (scratch_.size() < static_cast<std::size_t>(per_thread * threads))
    scratch_.resize(static_cast<std::size_t>(per_thread * threads));
  const float* xp = x_.data<float>();
  const float* yp = y_.data<float>();
  const float* dyp = dy.data<float>();
  const bool relu = act_ == Activation::kRelu;
  pool.run_on_all([&](int t) {
    float* dwt = scratch_.data() + t * per_thread;
    direct_weight_grad<3, 1, kFilters>(g, xp, yp, dyp, relu, g.n * t / threads, g.n * (t + 1) / threads, dwt,
                                          dwt + kInputs * kFilters);
  });
  float* dw = weight_.grad.data<float>();
  float* db = bias_.grad.data<float>();
  for (int t = 0; t < threads; ++t) {
    const float* dwt = scratch_.data() + t * per_thread;
    for (int o = 0; o < kFilters; ++o) {
      for (int i = 0; i < kInputs; ++i) dw[o * kInputs + i] += dwt[i * kFilters + o];
      db[o] += dwt[kInputs * kFilters + o];
    }
  }
}

void Conv2D::forward_implicit(const Tensor& x, Tensor& y) {
  const ConvGeom g = geometry(x, k_, filters_);
  if (scratch_.size() < static_cast<std::size_t>(g.kk_c * g.filters))
    scratch_.resize(static_cast<std::size_t>(g.kk_c * g.filters));
  transpose_weights(g, weight_.value.data<float>(), scratch_.data());
  cpu::conv_forward(g.n, g.h, g.w, g.c, g.k, x.data<float>(), scratch_.data(), g.filters,
                    bias_.value.data<float>(), act_ == Activation::kRelu, y.data<float>());
}

// Backward with implicit GEMMs, each thread on its own run of images:
//   dZ = dY masked by ReLU, and the bias gradient (its sum over pixels)
//   weight gradient  dWt (kkC, K) = sum over pixels of receptive field (x) dz    (wgrad tiles)
//   data gradient    dx[field of p] += W^T dz_p, scatter-added                  (dgrad tiles)
// or, when few enough dZ entries are nonzero (conv_options().cpu_sparse_below), the same two
// gradients from lists of the nonzero entries (conv2d_cpu_kernels.h, "Sparse gradients").
// dZ is listed first; a thread whose share turns out dense writes it out for the tiles.
void Conv2D::backward_implicit(const Tensor& dy, Tensor& dx) {
  const ConvGeom g = geometry(x_, k_, filters_);
  const std::int64_t K = g.filters, run = g.k * g.c, pixels = g.oh * g.ow, total = g.n * pixels;
  const std::int64_t image = g.h * g.w * g.c;  // floats of one input image
  ThreadPool& pool = cpu_pool();
  const int threads = pool.num_threads();
  // scratch_: dZ for the dense kernels, then per thread dW (in either layout), db and one dz
  // row. nz_*: dZ's nonzero entries pixel by pixel, then per thread the same entries of one
  // block of images regrouped by filter, for the sparse weight gradient.
  const std::int64_t block_images = g.images_per_l1(), block = block_images * pixels;
  const std::int64_t part = g.kk_c * K + 2 * K;
  if (scratch_.size() < static_cast<std::size_t>(total * K + part * threads))
    scratch_.resize(static_cast<std::size_t>(total * K + part * threads));
  const std::int64_t csr = total * K + cpu::kLanes, csc = K * block;  // room for pack_nonzeros
  if (nz_val_.size() < static_cast<std::size_t>(csr + csc * threads)) {
    nz_val_.resize(static_cast<std::size_t>(csr + csc * threads));
    nz_idx_.resize(nz_val_.size());
  }
  if (nz_rows_.size() < static_cast<std::size_t>(2 * total + K * threads))
    nz_rows_.resize(static_cast<std::size_t>(2 * total + K * threads));
  const float* yp = y_.data<float>();
  const float* dyp = dy.data<float>();
  const float* xp = x_.data<float>();
  const float* w = weight_.value.data<float>();
  float* dxp = dx.defined() ? dx.data<float>() : nullptr;
  const bool relu = act_ == Activation::kRelu;
  const double sparse_below = (run % cpu::kLanes == 0) ? conv_options().cpu_sparse_below : 0.0;
  std::vector<char> sparse_part(static_cast<std::size_t>(threads));
  std::vector<std::int64_t> nonzeros(static_cast<std::size_t>(threads));  // listed dZ entries per share

  pool.run_on_all([&](int t) {
    const std::int64_t n0 = g.n * t / threads, n1 = g.n * (t + 1) / threads;
    const std::int64_t p0 = n0 * pixels, p1 = n1 * pixels;
    float* dwt = scratch_.data() + total * K + t * part;
    float* db = dwt + g.kk_c * K;
    float* row = db + K;
    std::fill(dwt, dwt + g.kk_c * K + K, 0.0f);
    auto masked = [&](std::int64_t p, std::int64_t o) {  // K is a multiple of kLanes on this path
      const cpu::Vec d = cpu::load(dyp + p * K + o);
      return relu ? (cpu::load(yp + p * K + o) > 0.0f ? d : cpu::Vec{}) : d;
    };
    // dZ's nonzero entries, pixel by pixel: [begin[p], end[p]) of idx (filter) and val.
    float* val = nz_val_.data();
    std::int32_t* idx = nz_idx_.data();
    std::int64_t* begin = nz_rows_.data();
    std::int64_t* end = begin + total;
    float* dzm = scratch_.data();
    const bool listing = sparse_below > 0;  // else dZ goes straight to dzm
    std::int64_t e = p0 * K;
    for (std::int64_t p = p0; p < p1; ++p) {
      float* dz_p = listing ? row : dzm + p * K;
      for (std::int64_t o = 0; o < K; o += cpu::kLanes) {
        const cpu::Vec dz = masked(p, o);
        cpu::store(dz_p + o, dz);
        cpu::store(db + o, cpu::load(db + o) + dz);
      }
      begin[p] = e;
      if (listing) e += cpu::pack_nonzeros(row, K, idx + e, val + e);
      end[p] = e;
    }
    nonzeros[t] = e - p0 * K;
    const bool sparse = static_cast<double>(nonzeros[t]) < sparse_below * static_cast<double>((p1 - p0) * K);
    sparse_part[t] = sparse;

    if (!sparse) {
      if (listing)
        for (std::int64_t p = p0; p < p1; ++p)
          for (std::int64_t o = 0; o < K; o += cpu::kLanes) cpu::store(dzm + p * K + o, masked(p, o));
      switch (cpu::vecs_for(K)) {
        case 4: implicit_wgrad<4>(g, xp, dzm, p0, p1, dwt); break;
        case 2: implicit_wgrad<2>(g, xp, dzm, p0, p1, dwt); break;
        default: implicit_wgrad<1>(g, xp, dzm, p0, p1, dwt); break;
      }
      if (dxp) switch (cpu::vecs_for(run)) {
          case 4: implicit_dgrad<4>(g, dzm, w, n0, n1, dxp); break;
          case 2: implicit_dgrad<2>(g, dzm, w, n0, n1, dxp); break;
          default: implicit_dgrad<1>(g, dzm, w, n0, n1, dxp); break;
        }
      return;
    }

    // Weight gradient dW (K, kkC), a block of images at a time: the block's entries
    // regrouped by filter (the offset of their pixel's receptive field in the block, and the
    // value), then per filter and chunk of a receptive-field row, one sparse_rows_sum.
    float* fval = nz_val_.data() + csr + t * csc;
    std::int32_t* ffield = nz_idx_.data() + csr + t * csc;
    std::int64_t* count = nz_rows_.data() + 2 * total + t * K;
    for (std::int64_t b0 = n0; b0 < n1; b0 += block_images) {
      const std::int64_t b1 = std::min(n1, b0 + block_images);
      std::fill(count, count + K, 0);
      for (std::int64_t p = b0 * pixels; p < b1 * pixels; ++p) {
        const auto field = static_cast<std::int32_t>(g.field(p - b0 * pixels));  // in the block
        for (std::int64_t i = begin[p]; i < end[p]; ++i) {
          const std::int64_t slot = idx[i] * block + count[idx[i]]++;
          ffield[slot] = field;
          fval[slot] = val[i];
        }
      }
      const float* xb = xp + b0 * image;
      for (std::int64_t o = 0; o < K; ++o) {
        if (count[o] == 0) continue;
        for (std::int64_t r = 0; r < g.k; ++r)
          cpu::for_each_chunk(run, [&](std::int64_t j0, auto v) {
            cpu::sparse_rows_sum<decltype(v)::value>(xb + r * g.w * g.c + j0, 1, ffield + o * block,
                                                     fval + o * block, count[o], dwt + o * g.kk_c + r * run + j0);
          });
      }
    }
    if (!dxp) return;
    // Data gradient, image by image, per chunk of W's columns (its K rows of the chunk stay
    // in L1): every pixel's entries select rows of W.
    for (std::int64_t n = n0; n < n1; ++n) {
      float* img = dxp + n * image;
      std::memset(img, 0, static_cast<std::size_t>(image) * sizeof(float));
      for (std::int64_t r = 0; r < g.k; ++r)
        cpu::for_each_chunk(run, [&](std::int64_t j0, auto v) {
          for (std::int64_t p = n * pixels; p < (n + 1) * pixels; ++p) {
            float* field = dxp + g.field(p) + r * g.w * g.c + j0;
            cpu::sparse_rows_sum<decltype(v)::value>(w + r * run + j0, g.kk_c, idx + begin[p], val + begin[p],
                                                     end[p] - begin[p], field);
          }
        });
    }
  });
  if (sparse_below > 0) {
    cpu_backward_ = kImplicitListed;
    const auto listed = std::accumulate(nonzeros.begin(), nonzeros.end(), std::int64_t{0});
    sparsity_ = {static_cast<int>(std::count(sparse_part.begin(), sparse_part.end(), 1)), threads,
                 total > 0 ? static_cast<double>(listed) / static_cast<double>(total * K) : 0.0, sparse_below};
  } else {
    cpu_backward_ = run % cpu::kLanes != 0
                        ? "implicit GEMM, dense tiles (dZ not listed: k*k*C is not a multiple of the vector width)"
                        : "implicit GEMM, dense tiles (dZ not listed: sparse lists off, --dense-grad)";
  }
  float* dw = weight_.grad.data<float>();
  float* dbias = bias_.grad.data<float>();
  for (int t = 0; t < threads; ++t) {
    const float* dwt = scratch_.data() + total * K + t * part;
    if (sparse_part[t]) {  // dW (K, kkC), the parameter's own layout
      for (std::int64_t i = 0; i < g.kk_c * K; ++i) dw[i] += dwt[i];
    } else {  // dWt (kkC, K)
      for (std::int64_t o = 0; o < K; ++o)
        for (std::int64_t j = 0; j < g.kk_c; ++j) dw[o * g.kk_c + j] += dwt[j * K + o];
    }
    for (std::int64_t o = 0; o < K; ++o) dbias[o] += dwt[g.kk_c * K + o];
  }
}

void Conv2D::forward_cpu(const Tensor& x, Tensor& y) {
  if (k_ * k_ * in_channels_ <= kMaxDirectInputs && filters_ <= 1024) {
    cpu_forward_ = "direct";
    return forward_direct(x, y);
  }
  if (filters_ % cpu::kLanes == 0) {
    cpu_forward_ = "implicit GEMM (register tiles)";
    return forward_implicit(x, y);
  }
  cpu_forward_ = "im2col + Eigen GEMM";
  const ConvGeom g = geometry(x, k_, filters_);
  const std::int64_t ipb = g.images_per_block();
  ThreadPool& pool = cpu_pool();
  const std::int64_t col_floats = ipb * g.pixels() * g.kk_c;
  if (scratch_.size() < static_cast<std::size_t>(col_floats * pool.num_threads()))
    scratch_.resize(static_cast<std::size_t>(col_floats * pool.num_threads()));
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const ConstMatView w = cmat(weight_.value.data<float>(), g.filters, g.kk_c);
  const ConstRowVecView b(bias_.value.data<float>(), g.filters);
  const bool relu = act_ == Activation::kRelu;
  pool.parallel_for(g.n, [&](std::int64_t n0, std::int64_t n1, int t) {
    float* col = scratch_.data() + t * col_floats;
    for (std::int64_t b0 = n0; b0 < n1; b0 += ipb) {
      const std::int64_t b1 = std::min(n1, b0 + ipb);
      const std::int64_t rows = (b1 - b0) * g.pixels();
      im2col(g, xp, b0, b1, col);
      MatView out = mat(yp + b0 * g.pixels() * g.filters, rows, g.filters);
      out.noalias() = mat(static_cast<const float*>(col), rows, g.kk_c) * w.transpose();
      if (relu) out = (out.rowwise() + b).cwiseMax(0.0f);  // std::max(z, 0): NaN passes, as in cpu::relu
      else out.rowwise() += b;
    }
  });
}

void Conv2D::backward_cpu(const Tensor& dy, Tensor& dx) {
  const ConvGeom g = geometry(x_, k_, filters_);
  if (!dx.defined() && g.k == 3 && g.c == 1 && g.filters == 32) {
    cpu_backward_ = "direct (weight gradient only: the first layer needs no dx)";
    return backward_direct_3x3x1(dy);
  }
  if (g.filters % cpu::kLanes == 0 && (!dx.defined() || (g.k * g.c) % cpu::kLanes == 0))
    return backward_implicit(dy, dx);
  cpu_backward_ = "im2col + Eigen GEMM";
  const std::int64_t ipb = g.images_per_block();
  ThreadPool& pool = cpu_pool();
  const int threads = pool.num_threads();
  const std::int64_t block_rows = ipb * g.pixels();
  // Per thread: col, dz and dcol for one block, then private dW and db sums.
  const std::int64_t per_thread = block_rows * g.kk_c * 2 + block_rows * g.filters + g.filters * g.kk_c + g.filters;
  if (scratch_.size() < static_cast<std::size_t>(per_thread * threads))
    scratch_.resize(static_cast<std::size_t>(per_thread * threads));
  const float* xp = x_.data<float>();
  const float* yp = y_.data<float>();
  const float* dyp = dy.data<float>();
  float* dxp = dx.defined() ? dx.data<float>() : nullptr;
  const ConstMatView w = cmat(weight_.value.data<float>(), g.filters, g.kk_c);
  const bool relu = act_ == Activation::kRelu;

  pool.run_on_all([&](int t) {
    const std::int64_t n0 = g.n * t / threads, n1 = g.n * (t + 1) / threads;
    float* col = scratch_.data() + t * per_thread;
    float* dcol = col + block_rows * g.kk_c;
    float* dz = dcol + block_rows * g.kk_c;
    float* dw_sum = dz + block_rows * g.filters;
    float* db_sum = dw_sum + g.filters * g.kk_c;
    MatView dw_t = mat(dw_sum, g.filters, g.kk_c);
    RowVecView db_t(db_sum, g.filters);
    dw_t.setZero();
    db_t.setZero();
    if (dxp && n1 > n0) std::memset(dxp + n0 * g.h * g.w * g.c, 0, (n1 - n0) * g.h * g.w * g.c * sizeof(float));
    for (std::int64_t b0 = n0; b0 < n1; b0 += ipb) {
      const std::int64_t b1 = std::min(n1, b0 + ipb);
      const std::int64_t rows = (b1 - b0) * g.pixels();
      const std::int64_t off = b0 * g.pixels() * g.filters;
      MatView dzm = mat(dz, rows, g.filters);
      if (relu)  // ReLU's gradient: pass where the output was positive
        dzm = (mat(yp + off, rows, g.filters).array() > 0.0f).select(mat(dyp + off, rows, g.filters), 0.0f);
      else
        dzm = mat(dyp + off, rows, g.filters);
      db_t += dzm.colwise().sum();
      im2col(g, xp, b0, b1, col);
      dw_t.noalias() += dzm.transpose() * mat(static_cast<const float*>(col), rows, g.kk_c);
      if (dxp) {
        mat(dcol, rows, g.kk_c).noalias() = dzm * w;
        col2im_add(g, dcol, b0, b1, dxp);
      }
    }
  });
  // Reduce the per-thread sums into the parameters' gradients (accumulate).
  MatView dw = mat(weight_.grad.data<float>(), g.filters, g.kk_c);
  RowVecView db(bias_.grad.data<float>(), g.filters);
  for (int t = 0; t < threads; ++t) {
    float* dw_sum = scratch_.data() + t * per_thread + block_rows * g.kk_c * 2 + block_rows * g.filters;
    dw += mat(dw_sum, g.filters, g.kk_c);
    db += ConstRowVecView(dw_sum + g.filters * g.kk_c, g.filters);
  }
}

std::string Conv2D::cpu_config() const {
  if (!cpu_forward_) return "";
  std::string s = std::string("fwd ") + cpu_forward_;
  if (!cpu_backward_) return s;
  s += std::string("; bwd ") + cpu_backward_;
  if (cpu_backward_ != kImplicitListed) return s;
  // dZ's nonzeros were listed: each thread's share summed them sparsely or used the dense tiles.
  const Sparsity& z = sparsity_;
  char buf[160];
  std::snprintf(buf, sizeof buf, ", %s: %d of %d thread shares sparse; dZ %.0f %% nonzero (sparse below %.0f %%)",
                z.sparse_shares == z.shares ? "sparse lists" : z.sparse_shares == 0 ? "dense tiles" : "mixed",
                z.sparse_shares, z.shares, 100.0 * z.nonzero, 100.0 * z.threshold);
  return s + buf;
}

}  // namespace mf
