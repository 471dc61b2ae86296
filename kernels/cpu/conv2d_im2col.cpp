// conv2d_im2col.cpp: the general path: im2col + Eigen GEMMs. Each thread walks its images
// in blocks whose column matrix stays in the core's L2 cache between the GEMMs that use it.
// Also what the paths ran, in words.
#include "kernels/cpu/conv2d.h"

#include <cstdio>
#include <cstring>

#include "kernels/cpu/eigen_util.h"
#include "runtime/parallel.h"

namespace mf::cpu {

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

void conv_forward_im2col(ConvCpuState& st, const ConvGeom& g, const float* xp, const float* wp, const float* bp,
                         bool relu, float* yp) {
  const std::int64_t ipb = g.images_per_block();
  ThreadPool& pool = cpu_pool();
  const std::int64_t col_floats = ipb * g.pixels() * g.kk_c;
  if (st.scratch.size() < static_cast<std::size_t>(col_floats * pool.num_threads()))
    st.scratch.resize(static_cast<std::size_t>(col_floats * pool.num_threads()));
  const ConstMatView w = cmat(wp, g.filters, g.kk_c);
  const ConstRowVecView b(bp, g.filters);
  pool.parallel_for(g.n, [&](std::int64_t n0, std::int64_t n1, int t) {
    float* col = st.scratch.data() + t * col_floats;
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

void conv_backward_im2col(ConvCpuState& st, const ConvGeom& g, const float* xp, const float* yp, const float* dyp,
                          const float* wp, bool relu, float* dwp, float* dbp, float* dxp) {
  const std::int64_t ipb = g.images_per_block();
  ThreadPool& pool = cpu_pool();
  const int threads = pool.num_threads();
  const std::int64_t block_rows = ipb * g.pixels();
  // Per thread: col, dz and dcol for one block, then private dW and db sums.
  const std::int64_t per_thread = block_rows * g.kk_c * 2 + block_rows * g.filters + g.filters * g.kk_c + g.filters;
  if (st.scratch.size() < static_cast<std::size_t>(per_thread * threads))
    st.scratch.resize(static_cast<std::size_t>(per_thread * threads));
  const ConstMatView w = cmat(wp, g.filters, g.kk_c);

  pool.run_on_all([&](int t) {
    const std::int64_t n0 = g.n * t / threads, n1 = g.n * (t + 1) / threads;
    float* col = st.scratch.data() + t * per_thread;
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
  MatView dw = mat(dwp, g.filters, g.kk_c);
  RowVecView db(dbp, g.filters);
  for (int t = 0; t < threads; ++t) {
    float* dw_sum = st.scratch.data() + t * per_thread + block_rows * g.kk_c * 2 + block_rows * g.filters;
    dw += mat(dw_sum, g.filters, g.kk_c);
    db += ConstRowVecView(dw_sum + g.filters * g.kk_c, g.filters);
  }
}

std::string describe(const ConvCpuState& st) {
  if (!st.forward) return "";
  std::string s = std::string("fwd ") + st.forward;
  if (!st.backward) return s;
  s += std::string("; bwd ") + st.backward;
  if (st.backward != kImplicitListed) return s;
  // dZ's nonzeros were listed: each thread's share summed them sparsely or used the dense tiles.
  const ConvCpuState::Sparsity& z = st.sparsity;
  char buf[160];
  std::snprintf(buf, sizeof buf, ", %s: %d of %d thread shares sparse; dZ %.0f %% nonzero (sparse below %.0f %%)",
                z.sparse_shares == z.shares ? "sparse lists" : z.sparse_shares == 0 ? "dense tiles" : "mixed",
                z.sparse_shares, z.shares, 100.0 * z.nonzero, 100.0 * z.threshold);
  return s + buf;
}

}  // namespace mf::cpu
