// naive.h: the naive rung on the CPU (train_mnist --kernels naive): each layer's three
// products as plain FP32 loops over the outputs, no intrinsics, no tiling, no sparsity.
// Threads split the outputs (the images for y and dx, the filters or input features for
// the weight gradients), so every output is summed by one thread in one fixed order, and
// `--threads 1` against `--threads 2` shows what the cores alone buy.
//
// With relu, the gradient behind the ReLU is dz = dy where the output y was positive, else
// 0; without, dz = dy. Weight and bias gradients ACCUMULATE (+=); dx is overwritten.
#pragma once
#include "kernels/naive_index.h"

namespace mf::cpu {

// y[n,i,j,f] = act(b[f] + sum over r, s, c of x[n,i+r,j+s,c] * w[f,r,s,c])
void conv_forward_naive(const naive::Conv& g, const float* x, const float* w, const float* b, bool relu, float* y);
// dw[f,r,s,c] += sum over n, i, j of dz[n,i,j,f] * x[n,i+r,j+s,c];  db[f] += sum of dz[..,f];
// dx[n,p,q,c] = sum over r, s, f of dz[n,p-r,q-s,f] * w[f,r,s,c] (where p-r, q-s are outputs),
// when dx is not null.
void conv_backward_naive(const naive::Conv& g, const float* x, const float* y, const float* dy, const float* w,
                         bool relu, float* dw, float* db, float* dx);

// y[s,u] = act(b[u] + sum over i of x[s,i] * w[i,u])
void dense_forward_naive(const naive::Dense& g, const float* x, const float* w, const float* b, bool relu, float* y);
// dw[i,u] += sum over s of x[s,i] * dz[s,u];  db[u] += sum of dz[..,u];
// dx[s,i] = sum over u of dz[s,u] * w[i,u], when dx is not null.
void dense_backward_naive(const naive::Dense& g, const float* x, const float* y, const float* dy, const float* w,
                          bool relu, float* dw, float* db, float* dx);

}  // namespace mf::cpu
