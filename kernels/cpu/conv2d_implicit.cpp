// conv2d_implicit.cpp: the implicit GEMM: the register-tiled kernels of conv2d_cpu_kernels.h
// read the receptive fields straight from x, which NHWC makes k runs of k*C contiguous
// floats; col is never built. When most of dZ is zero, as behind max-pooling, the gradients
// come from lists of its nonzero entries instead ("Sparse gradients" there).
#include "kernels/cpu/conv2d.h"

#include <cstring>
#include <numeric>

#include "kernels/cpu/conv2d_cpu_kernels.h"
#include "runtime/parallel.h"

namespace mf::cpu {

namespace {

// ---- implicit GEMM (conv2d_cpu_kernels.h): filters a multiple of the vector width ----

// y (N, H-k+1, W-k+1, K) = conv(x (N, H, W, C), Wt) [+ bias, ReLU]: output pixels are dealt
// to threads in tiles of kTileRegs / kVecs.
template <int kVecs>
void implicit_conv(std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c, std::int64_t k, const float* x,
                   const float* wt, std::int64_t K, const float* bias, bool relu, float* y) {
  constexpr int kRows = kTileRegs / kVecs;
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
      for (std::int64_t o0 = 0; o0 < K; o0 += kVecs * kLanes)
        with_rows<kVecs>(rows, [&](auto r) {
          conv_tile<decltype(r)::value, kVecs>(in, w * c, k, k * c, wt, K, o0, bias, relu, out);
        });
    }
  });
}


// dwt (kkC, K) += sum over pixels [p0, p1) of x_p's receptive field (x) dz_p, pixels taken
// in chunks whose dz rows stay in L1/L2 while every tile of dwt passes over them.
template <int kVecs>
void implicit_wgrad(const ConvGeom& g, const float* x, const float* dzm, std::int64_t p0, std::int64_t p1,
                    float* dwt) {
  constexpr int kRows = kTileRegs / kVecs;
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
        for (std::int64_t o0 = 0; o0 < K; o0 += kVecs * kLanes)
          with_rows<kVecs>(rows, [&](auto rr) {
            wgrad_tile<decltype(rr)::value, kVecs>(in, dz, np, r * g.w * g.c + j0, o0,
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
  constexpr int kRows = kTileRegs / kVecs;
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
      for (std::int64_t j0 = 0; j0 < run; j0 += kVecs * kLanes)
        with_rows<kVecs>(rows, [&](auto rr) {
          dgrad_tile<decltype(rr)::value, kVecs>(dz, field, r * g.w * g.c + j0, w + r * run + j0, g.kk_c, K);
        });
  }
}

}  // namespace

void conv_forward(std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c, std::int64_t k, const float* x,
                       const float* wt, std::int64_t K, const float* bias, bool relu, float* y) {
  switch (vecs_for(K)) {
    case 4: return implicit_conv<4>(n, h, w, c, k, x, wt, K, bias, relu, y);
    case 2: return implicit_conv<2>(n, h, w, c, k, x, wt, K, bias, relu, y);
    default: return implicit_conv<1>(n, h, w, c, k, x, wt, K, bias, relu, y);
  }
}

void conv_forward_implicit(ConvCpuState& st, const ConvGeom& g, const float* x, const float* w, const float* b,
                           bool relu, float* y) {
  if (st.scratch.size() < static_cast<std::size_t>(g.kk_c * g.filters))
    st.scratch.resize(static_cast<std::size_t>(g.kk_c * g.filters));
  transpose_weights(g, w, st.scratch.data());
  conv_forward(g.n, g.h, g.w, g.c, g.k, x, st.scratch.data(), g.filters, b, relu, y);
}

// Backward with implicit GEMMs, each thread on its own run of images:
//   dZ = dY masked by ReLU, and the bias gradient (its sum over pixels)
//   weight gradient  dWt (kkC, K) = sum over pixels of receptive field (x) dz    (wgrad tiles)
//   data gradient    dx[field of p] += W^T dz_p, scatter-added                  (dgrad tiles)
// or, when few enough dZ entries are nonzero (`sparse_below`: --dense-grad sets 0), the same two
// gradients from lists of the nonzero entries (conv2d_cpu_kernels.h, "Sparse gradients").
// dZ is listed first; a thread whose share turns out dense writes it out for the tiles.
void conv_backward_implicit(ConvCpuState& st, const ConvGeom& g, const float* xp, const float* yp, const float* dyp,
                            const float* w, bool relu, double sparse_below_asked, float* dw, float* dbias,
                            float* dxp) {
  const std::int64_t K = g.filters, run = g.k * g.c, pixels = g.oh * g.ow, total = g.n * pixels;
  const std::int64_t image = g.h * g.w * g.c;  // floats of one input image
  ThreadPool& pool = cpu_pool();
  const int threads = pool.num_threads();
  // st.scratch: dZ for the dense kernels, then per thread dW (in either layout), db and one dz
  // row. nz_*: dZ's nonzero entries pixel by pixel, then per thread the same entries of one
  // block of images regrouped by filter, for the sparse weight gradient.
  const std::int64_t block_images = g.images_per_l1(), block = block_images * pixels;
  const std::int64_t part = g.kk_c * K + 2 * K;
  if (st.scratch.size() < static_cast<std::size_t>(total * K + part * threads))
    st.scratch.resize(static_cast<std::size_t>(total * K + part * threads));
  const std::int64_t csr = total * K + kLanes, csc = K * block;  // room for pack_nonzeros
  if (st.nz_val.size() < static_cast<std::size_t>(csr + csc * threads)) {
    st.nz_val.resize(static_cast<std::size_t>(csr + csc * threads));
    st.nz_idx.resize(st.nz_val.size());
  }
  if (st.nz_rows.size() < static_cast<std::size_t>(2 * total + K * threads))
    st.nz_rows.resize(static_cast<std::size_t>(2 * total + K * threads));
  const double sparse_below = (run % kLanes == 0) ? sparse_below_asked : 0.0;
  std::vector<char> sparse_part(static_cast<std::size_t>(threads));
  std::vector<std::int64_t> nonzeros(static_cast<std::size_t>(threads));  // listed dZ entries per share

  pool.run_on_all([&](int t) {
    const std::int64_t n0 = g.n * t / threads, n1 = g.n * (t + 1) / threads;
    const std::int64_t p0 = n0 * pixels, p1 = n1 * pixels;
    float* dwt = st.scratch.data() + total * K + t * part;
    float* db = dwt + g.kk_c * K;
    float* row = db + K;
    std::fill(dwt, dwt + g.kk_c * K + K, 0.0f);
    auto masked = [&](std::int64_t p, std::int64_t o) {  // K is a multiple of kLanes on this path
      const Vec d = load(dyp + p * K + o);
      return relu ? (load(yp + p * K + o) > 0.0f ? d : Vec{}) : d;
    };
    // dZ's nonzero entries, pixel by pixel: [begin[p], end[p]) of idx (filter) and val.
    float* val = st.nz_val.data();
    std::int32_t* idx = st.nz_idx.data();
    std::int64_t* begin = st.nz_rows.data();
    std::int64_t* end = begin + total;
    float* dzm = st.scratch.data();
    const bool listing = sparse_below > 0;  // else dZ goes straight to dzm
    std::int64_t e = p0 * K;
    for (std::int64_t p = p0; p < p1; ++p) {
      float* dz_p = listing ? row : dzm + p * K;
      for (std::int64_t o = 0; o < K; o += kLanes) {
        const Vec dz = masked(p, o);
        store(dz_p + o, dz);
        store(db + o, load(db + o) + dz);
      }
      begin[p] = e;
      if (listing) e += pack_nonzeros(row, K, idx + e, val + e);
      end[p] = e;
    }
    nonzeros[t] = e - p0 * K;
    const bool sparse = static_cast<double>(nonzeros[t]) < sparse_below * static_cast<double>((p1 - p0) * K);
    sparse_part[t] = sparse;

    if (!sparse) {
      if (listing)
        for (std::int64_t p = p0; p < p1; ++p)
          for (std::int64_t o = 0; o < K; o += kLanes) store(dzm + p * K + o, masked(p, o));
      switch (vecs_for(K)) {
        case 4: implicit_wgrad<4>(g, xp, dzm, p0, p1, dwt); break;
        case 2: implicit_wgrad<2>(g, xp, dzm, p0, p1, dwt); break;
        default: implicit_wgrad<1>(g, xp, dzm, p0, p1, dwt); break;
      }
      if (dxp) switch (vecs_for(run)) {
          case 4: implicit_dgrad<4>(g, dzm, w, n0, n1, dxp); break;
          case 2: implicit_dgrad<2>(g, dzm, w, n0, n1, dxp); break;
          default: implicit_dgrad<1>(g, dzm, w, n0, n1, dxp); break;
        }
      return;
    }

    // Weight gradient dW (K, kkC), a block of images at a time: the block's entries
    // regrouped by filter (the offset of their pixel's receptive field in the block, and the
    // value), then per filter and chunk of a receptive-field row, one sparse_rows_sum.
    float* fval = st.nz_val.data() + csr + t * csc;
    std::int32_t* ffield = st.nz_idx.data() + csr + t * csc;
    std::int64_t* count = st.nz_rows.data() + 2 * total + t * K;
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
          for_each_chunk(run, [&](std::int64_t j0, auto v) {
            sparse_rows_sum<decltype(v)::value>(xb + r * g.w * g.c + j0, 1, ffield + o * block,
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
        for_each_chunk(run, [&](std::int64_t j0, auto v) {
          for (std::int64_t p = n * pixels; p < (n + 1) * pixels; ++p) {
            float* field = dxp + g.field(p) + r * g.w * g.c + j0;
            sparse_rows_sum<decltype(v)::value>(w + r * run + j0, g.kk_c, idx + begin[p], val + begin[p],
                                                     end[p] - begin[p], field);
          }
        });
    }
  });
  if (sparse_below > 0) {
    st.backward = kImplicitListed;
    const auto listed = std::accumulate(nonzeros.begin(), nonzeros.end(), std::int64_t{0});
    st.sparsity = {static_cast<int>(std::count(sparse_part.begin(), sparse_part.end(), 1)), threads,
                 total > 0 ? static_cast<double>(listed) / static_cast<double>(total * K) : 0.0, sparse_below};
  } else {
    st.backward = run % kLanes != 0
                        ? "implicit GEMM, dense tiles (dZ not listed: k*k*C is not a multiple of the vector width)"
                        : "implicit GEMM, dense tiles (dZ not listed: sparse lists off, --dense-grad)";
  }
  for (int t = 0; t < threads; ++t) {
    const float* dwt = st.scratch.data() + total * K + t * part;
    if (sparse_part[t]) {  // dW (K, kkC), the parameter's own layout
      for (std::int64_t i = 0; i < g.kk_c * K; ++i) dw[i] += dwt[i];
    } else {  // dWt (kkC, K)
      for (std::int64_t o = 0; o < K; ++o)
        for (std::int64_t j = 0; j < g.kk_c; ++j) dw[o * g.kk_c + j] += dwt[j * K + o];
    }
    for (std::int64_t o = 0; o < K; ++o) dbias[o] += dwt[g.kk_c * K + o];
  }
}

}  // namespace mf::cpu
