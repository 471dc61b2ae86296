// conv2d_direct.cpp: the direct convolution, for few inputs per output (the first layer, 1
// channel x 3x3 = 9): a GEMM with an inner dimension of 9 is a poor GEMM, so per output
// pixel y[0..K) = b + sum over the kkC inputs t of x_t * Wt[t][0..K), W transposed to
// (kkC, K) so that the filters are contiguous and vectorise; its weight gradient the same
// way round, without dx.
#include "kernels/cpu/conv2d.h"

#include <cstring>

#include "kernels/cpu/conv2d_cpu_kernels.h"
#include "runtime/parallel.h"

namespace mf::cpu {

namespace {

// The kkC inputs of output pixel (n, oh, ow), in (r, s, c) order.
inline void gather_inputs(const ConvGeom& g, const float* img, std::int64_t oh, std::int64_t ow, float* in) {
  const std::int64_t run = g.k * g.c;
  for (std::int64_t r = 0; r < g.k; ++r) {
    const float* src = img + ((oh + r) * g.w + ow) * g.c;
    for (std::int64_t i = 0; i < run; ++i) in[r * run + i] = src[i];
  }
}

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
  static_assert(kFilters % kLanes == 0, "whole vectors of filters");
  constexpr int kV = kFilters / kLanes, kInputs = kK * kK * kC, kPix = 4;
  Vec w[kInputs][kV], b[kV];
  for (int v = 0; v < kV; ++v) {
    b[v] = load(bias + v * kLanes);
    for (int t = 0; t < kInputs; ++t) w[t][v] = load(wt + t * kFilters + v * kLanes);
  }
  for (std::int64_t oh = 0; oh < g.oh; ++oh)
    for (std::int64_t ow0 = 0; ow0 < g.ow; ow0 += kPix) {
      const float* in = img + (oh * g.w + ow0) * kC;  // top-left input of the first pixel
      float* o = out + (oh * g.ow + ow0) * kFilters;
      with_count<kPix>(static_cast<int>(std::min<std::int64_t>(kPix, g.ow - ow0)), [&](auto pix) {
        constexpr int kP = decltype(pix)::value;
        Vec acc[kP][kV];
        for (int p = 0; p < kP; ++p)
          for (int v = 0; v < kV; ++v) acc[p][v] = b[v];
        for (int r = 0; r < kK; ++r)
          for (int sc = 0; sc < kK * kC; ++sc)  // (s, c) of kernel row r: contiguous in NHWC
            for (int p = 0; p < kP; ++p) {
              const Vec a = splat(in[r * g.w * kC + p * kC + sc]);
              for (int v = 0; v < kV; ++v) acc[p][v] += a * w[r * kK * kC + sc][v];
            }
        for (int p = 0; p < kP; ++p)
          for (int v = 0; v < kV; ++v)
            store(o + p * kFilters + v * kLanes, relu ? cpu::relu(acc[p][v]) : acc[p][v]);
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
  static_assert(kFilters % kLanes == 0, "whole vectors of filters");
  constexpr int kV = kFilters / kLanes, kInputs = kK * kK * kC;
  Vec acc[kInputs][kV], bacc[kV];
  for (int v = 0; v < kV; ++v) {
    bacc[v] = Vec{};
    for (int t = 0; t < kInputs; ++t) acc[t][v] = Vec{};
  }
  for (std::int64_t n = n0; n < n1; ++n) {
    const float* img = x + n * g.h * g.w * kC;
    for (std::int64_t oh = 0; oh < g.oh; ++oh)
      for (std::int64_t ow = 0; ow < g.ow; ++ow) {
        const std::int64_t p = ((n * g.oh + oh) * g.ow + ow) * kFilters;
        Vec dz[kV];
        for (int v = 0; v < kV; ++v) {
          const Vec d = load(dy + p + v * kLanes);
          dz[v] = relu ? (load(y + p + v * kLanes) > 0.0f ? d : Vec{}) : d;
          bacc[v] += dz[v];
        }
        const float* in = img + (oh * g.w + ow) * kC;
        for (int r = 0; r < kK; ++r)
          for (int sc = 0; sc < kK * kC; ++sc) {
            const Vec a = splat(in[r * g.w * kC + sc]);
            for (int v = 0; v < kV; ++v) acc[r * kK * kC + sc][v] += a * dz[v];
          }
      }
  }
  for (int t = 0; t < kInputs; ++t)
    for (int v = 0; v < kV; ++v) store(dwt + t * kFilters + v * kLanes, acc[t][v]);
  for (int v = 0; v < kV; ++v) store(db + v * kLanes, bacc[v]);
}

}  // namespace

void transpose_weights(const ConvGeom& g, const float* w, float* wt) {
  for (std::int64_t o = 0; o < g.filters; ++o)
    for (std::int64_t t = 0; t < g.kk_c; ++t) wt[t * g.filters + o] = w[o * g.kk_c + t];
}


void conv_forward_direct(ConvCpuState& st, const ConvGeom& g, const float* xp, const float* w, const float* bp,
                         bool relu, float* yp) {
  const std::int64_t K = g.filters;
  if (st.scratch.size() < static_cast<std::size_t>(g.kk_c * K)) st.scratch.resize(static_cast<std::size_t>(g.kk_c * K));
  float* wt = st.scratch.data();
  transpose_weights(g, w, wt);
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

void conv_backward_direct_3x3x1(ConvCpuState& st, const ConvGeom& g, const float* xp, const float* yp,
                                const float* dyp, bool relu, float* dw, float* db) {
  constexpr int kInputs = 9, kFilters = 32;
  ThreadPool& pool = cpu_pool();
  const int threads = pool.num_threads();
  const std::int64_t per_thread = kInputs * kFilters + kFilters;
  if (st.scratch.size() < static_cast<std::size_t>(per_thread * threads))
    st.scratch.resize(static_cast<std::size_t>(per_thread * threads));
  pool.run_on_all([&](int t) {
    float* dwt = st.scratch.data() + t * per_thread;
    direct_weight_grad<3, 1, kFilters>(g, xp, yp, dyp, relu, g.n * t / threads, g.n * (t + 1) / threads, dwt,
                                          dwt + kInputs * kFilters);
  });
  for (int t = 0; t < threads; ++t) {
    const float* dwt = st.scratch.data() + t * per_thread;
    for (int o = 0; o < kFilters; ++o) {
      for (int i = 0; i < kInputs; ++i) dw[o * kInputs + i] += dwt[i * kFilters + o];
      db[o] += dwt[kInputs * kFilters + o];
    }
  }
}

}  // namespace mf::cpu
