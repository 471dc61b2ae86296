// naive.cpp: the naive rung's loops (naive.h). Each function is the definition of the
// product it computes, written out; kernels/gpu/naive.cu turns each outer loop nest into a
// grid of CUDA threads.
#include "kernels/cpu/naive.h"

#include <algorithm>
#include <cstdint>

#include "runtime/parallel.h"

namespace mf::cpu {

namespace {
using i64 = std::int64_t;

// The gradient behind the ReLU at output element e.
inline float grad_at(const float* y, const float* dy, i64 e, bool relu) {
  return !relu || y[e] > 0.0f ? dy[e] : 0.0f;
}
}  // namespace

void conv_forward_naive(const naive::Conv& g, const float* x, const float* w, const float* b, bool relu, float* y) {
  cpu_pool().parallel_for(g.n, [&](i64 n0, i64 n1, int) {
    for (i64 n = n0; n < n1; ++n)
      for (i64 i = 0; i < g.oh; ++i)
        for (i64 j = 0; j < g.ow; ++j)
          for (i64 f = 0; f < g.filters; ++f) {
            float acc = b[f];
            for (i64 r = 0; r < g.k; ++r)
              for (i64 s = 0; s < g.k; ++s)
                for (i64 c = 0; c < g.c; ++c) acc += x[g.x_at(n, i + r, j + s, c)] * w[g.w_at(f, r, s, c)];
            y[g.y_at(n, i, j, f)] = relu ? std::max(acc, 0.0f) : acc;
          }
  });
}

void conv_backward_naive(const naive::Conv& g, const float* x, const float* y, const float* dy, const float* w,
                         bool relu, float* dw, float* db, float* dx) {
  // One thread per range of filters: it owns their weights and bias, nothing to reduce.
  cpu_pool().parallel_for(g.filters, [&](i64 f0, i64 f1, int) {
    for (i64 f = f0; f < f1; ++f) {
      float bias_sum = 0.0f;
      for (i64 n = 0; n < g.n; ++n)
        for (i64 i = 0; i < g.oh; ++i)
          for (i64 j = 0; j < g.ow; ++j) bias_sum += grad_at(y, dy, g.y_at(n, i, j, f), relu);
      db[f] += bias_sum;
      for (i64 r = 0; r < g.k; ++r)
        for (i64 s = 0; s < g.k; ++s)
          for (i64 c = 0; c < g.c; ++c) {
            float acc = 0.0f;
            for (i64 n = 0; n < g.n; ++n)
              for (i64 i = 0; i < g.oh; ++i)
                for (i64 j = 0; j < g.ow; ++j)
                  acc += grad_at(y, dy, g.y_at(n, i, j, f), relu) * x[g.x_at(n, i + r, j + s, c)];
            dw[g.w_at(f, r, s, c)] += acc;
          }
    }
  });
  if (!dx) return;
  // Input pixel (p, q) fed output (p - r, q - s) through kernel tap (r, s), where that
  // output exists: the loops gather from those outputs rather than scatter to the inputs.
  cpu_pool().parallel_for(g.n, [&](i64 n0, i64 n1, int) {
    for (i64 n = n0; n < n1; ++n)
      for (i64 p = 0; p < g.h; ++p)
        for (i64 q = 0; q < g.w; ++q)
          for (i64 c = 0; c < g.c; ++c) {
            float acc = 0.0f;
            for (i64 r = 0; r < g.k; ++r)
              for (i64 s = 0; s < g.k; ++s) {
                const i64 i = p - r, j = q - s;
                if (i < 0 || i >= g.oh || j < 0 || j >= g.ow) continue;
                for (i64 f = 0; f < g.filters; ++f)
                  acc += grad_at(y, dy, g.y_at(n, i, j, f), relu) * w[g.w_at(f, r, s, c)];
              }
            dx[g.x_at(n, p, q, c)] = acc;
          }
  });
}

void dense_forward_naive(const naive::Dense& g, const float* x, const float* w, const float* b, bool relu, float* y) {
  cpu_pool().parallel_for(g.n, [&](i64 s0, i64 s1, int) {
    for (i64 s = s0; s < s1; ++s)
      for (i64 u = 0; u < g.units; ++u) {
        float acc = b[u];
        for (i64 i = 0; i < g.in; ++i) acc += x[g.x_at(s, i)] * w[g.w_at(i, u)];
        y[g.y_at(s, u)] = relu ? std::max(acc, 0.0f) : acc;
      }
  });
}

void dense_backward_naive(const naive::Dense& g, const float* x, const float* y, const float* dy, const float* w,
                          bool relu, float* dw, float* db, float* dx) {
  for (i64 u = 0; u < g.units; ++u) {
    float acc = 0.0f;
    for (i64 s = 0; s < g.n; ++s) acc += grad_at(y, dy, g.y_at(s, u), relu);
    db[u] += acc;
  }
  // One thread per range of input features: it owns those rows of dw.
  cpu_pool().parallel_for(g.in, [&](i64 i0, i64 i1, int) {
    for (i64 i = i0; i < i1; ++i)
      for (i64 u = 0; u < g.units; ++u) {
        float acc = 0.0f;
        for (i64 s = 0; s < g.n; ++s) acc += x[g.x_at(s, i)] * grad_at(y, dy, g.y_at(s, u), relu);
        dw[g.w_at(i, u)] += acc;
      }
  });
  if (!dx) return;
  cpu_pool().parallel_for(g.n, [&](i64 s0, i64 s1, int) {
    for (i64 s = s0; s < s1; ++s)
      for (i64 i = 0; i < g.in; ++i) {
        float acc = 0.0f;
        for (i64 u = 0; u < g.units; ++u) acc += grad_at(y, dy, g.y_at(s, u), relu) * w[g.w_at(i, u)];
        dx[g.x_at(s, i)] = acc;
      }
  });
}

}  // namespace mf::cpu
