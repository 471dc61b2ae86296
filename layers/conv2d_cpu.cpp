// conv2d_cpu.cpp: Conv2D on the CPU as im2col + GEMM (Eigen), the batch split across threads.
//
// NHWC makes im2col cheap: for output pixel (n, oh, ow) and kernel row r, the k inputs
// x[n, oh+r, ow .. ow+k-1, 0 .. C-1] are k*C contiguous floats, so a row of the column
// matrix is k contiguous copies. With the kernel stored (K, k, k, C) as a K x kkC matrix W:
//
//   forward          Y  (P x K)   = col (P x kkC) * W^T            P = output pixels
//   weight gradient  dW (K x kkC) += dZ^T (K x P) * col (P x kkC)  dZ = dY masked by ReLU
//   data gradient    dcol (P x kkC) = dZ (P x K) * W, scattered back (col2im)
//
// Each thread takes a contiguous run of images and walks it in blocks of a few images,
// so that the block's column matrix stays in the core's L2 cache between the GEMMs that
// use it. Weight and bias gradients are summed per thread, then reduced.
//
// A forward convolution with few inputs per output (the first layer: 1 channel x 3x3 = 9)
// is a GEMM with an inner dimension of 9, which GEMM libraries handle poorly. It takes a
// direct path instead: per output pixel, y[0..K) = b + sum over the kkC inputs t of
// x_t * Wt[t][0..K), with W transposed to (kkC, K) so the inner loop runs over contiguous
// filters and vectorises; for K = 32 and 64 the accumulators stay in registers. Its
// backward is still GEMMs: there the inner dimension is the pixel count, which is large.
#include <algorithm>
#include <cstring>

#include "layers/conv2d.h"
#include "layers/eigen_util.h"
#include "tensor/parallel.h"

namespace mf {

namespace {

constexpr std::int64_t kTargetBlockRows = 512;  // output pixels per GEMM block
constexpr std::int64_t kMaxDirectInputs = 32;   // kkC up to this takes the direct path

struct ConvGeom {
  std::int64_t n, h, w, c, k, oh, ow, kk_c, filters;
  std::int64_t pixels() const { return oh * ow; }
  std::int64_t images_per_block() const { return std::max<std::int64_t>(1, kTargetBlockRows / pixels()); }
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
      for (std::int64_t o = 0; o < K; ++o) out[o] = relu ? std::max(acc[o], 0.0f) : acc[o];
    }
}

// Weight and bias gradients of one run of images for kkC = kInputs, K = kFilters (both
// fixed, so the kInputs x kFilters sums stay in registers), ReLU mask applied on the fly:
// dWt[t][o] += x_t * dz[o], db[o] += dz[o] for every output pixel. Used when no input
// gradient is needed (the first layer), where the GEMM form's 9-wide output is inefficient.
template <int kInputs, int kFilters>
void direct_weight_grad(const ConvGeom& g, const float* x, const float* y, const float* dy, bool relu,
                        std::int64_t n0, std::int64_t n1, float* dwt, float* db) {
  float acc[kInputs][kFilters] = {};
  float bacc[kFilters] = {};
  float in[kMaxDirectInputs];
  for (std::int64_t n = n0; n < n1; ++n) {
    const float* img = x + n * g.h * g.w * g.c;
    for (std::int64_t oh = 0; oh < g.oh; ++oh)
      for (std::int64_t ow = 0; ow < g.ow; ++ow) {
        const std::int64_t p = ((n * g.oh + oh) * g.ow + ow) * kFilters;
        gather_inputs(g, img, oh, ow, in);
        float dz[kFilters];
        for (int o = 0; o < kFilters; ++o) dz[o] = relu && y[p + o] <= 0.0f ? 0.0f : dy[p + o];
        for (int o = 0; o < kFilters; ++o) bacc[o] += dz[o];
        for (int t = 0; t < kInputs; ++t)
          for (int o = 0; o < kFilters; ++o) acc[t][o] += in[t] * dz[o];
      }
  }
  for (int t = 0; t < kInputs; ++t)
    for (int o = 0; o < kFilters; ++o) dwt[t * kFilters + o] = acc[t][o];
  for (int o = 0; o < kFilters; ++o) db[o] = bacc[o];
}

}  // namespace

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
      if (g.kk_c == 9 && K == 32) direct_image<9, 32>(g, img, wt, bp, relu, out);  // the model's first layer
      else if (K == 32) direct_image<0, 32>(g, img, wt, bp, relu, out);
      else if (K == 64) direct_image<0, 64>(g, img, wt, bp, relu, out);
      else direct_image<0, 0>(g, img, wt, bp, relu, out);
    }
  });
}

void Conv2D::backward_direct_9x32(const Tensor& dy) {
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
    direct_weight_grad<kInputs, kFilters>(g, xp, yp, dyp, relu, g.n * t / threads, g.n * (t + 1) / threads, dwt,
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

void Conv2D::forward_cpu(const Tensor& x, Tensor& y) {
  if (k_ * k_ * in_channels_ <= kMaxDirectInputs && filters_ <= 1024) return forward_direct(x, y);
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
      if (relu) out = (out.rowwise() + b).cwiseMax(0.0f);
      else out.rowwise() += b;
    }
  });
}

void Conv2D::backward_cpu(const Tensor& dy, Tensor& dx) {
  const ConvGeom g = geometry(x_, k_, filters_);
  if (!dx.defined() && g.kk_c == 9 && g.filters == 32) return backward_direct_9x32(dy);
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

}  // namespace mf
