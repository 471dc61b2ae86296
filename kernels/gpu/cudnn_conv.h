// cudnn_conv.h: a convolution's cuDNN side, for layers/conv2d_gpu.cu: the descriptors of
// each input shape, the choice of an algorithm for each direction (forward, backward data,
// backward filter) and the calls.
//
// The algorithms are chosen once per input shape, when the layer first meets it: that
// happens in the eager warm-up step, before the training step is captured into a CUDA
// graph, because the choice times kernels (cudnnFind*), synchronises and may grow the
// shared workspace, none of which a capture allows. Later calls with a known shape only
// enqueue work.
//
// The first convolution has C = 1. cuDNN's NHWC f16 Tensor Core kernels want C to be a
// multiple of 8. We do not zero-pad the input to 8 channels: that would take 8x the input
// bytes, an extra kernel and buffer, and 8x this layer's multiply-adds (from 8 % of the
// model's to 40 %), 7 in 8 of them on zeros, for a layer that needs no input gradient and
// is bound by memory traffic, not arithmetic. Instead cuDNN picks what runs best for C = 1
// (Find times the candidates, Tensor Core kernels or not), and describe() reports the
// algorithms and math modes it chose, so --verbose shows what actually ran.
//
// Should cuDNN offer no f16 algorithm at all for a direction of a layer (its documentation
// promises Tensor Cores only for channel counts that are multiples of 8 and does not say
// what else it offers for C = 1), that direction runs in f32 instead: the f16 operands are
// cast to f32 copies, the convolution uses the f32 master weights, and the result is cast
// back (or, for the filter gradient, added into the f16 gradient). One line on stderr says
// so for the layer, and describe() marks the direction "[f32: no f16 algorithm]".
#pragma once
#include <cudnn.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "kernels/kernel_options.h"
#include "runtime/cuda_raii.h"
#include "tensor/tensor.h"

namespace mf {

// One direction's choice: the algorithm, the math mode it was measured with (set on that
// direction's convolution descriptor, as cuDNN requires) and the workspace it needs.
template <class Algo>
struct Choice {
  bool chosen = false;
  Algo algo{};
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  std::size_t workspace = 0;
  // Timed choices (cudnnFind*) only: the chosen algorithm's time, and that of the fastest
  // candidate passed over for not being deterministic (--deterministic's cost); -1 if none.
  float ms = -1.f, nondeterministic_ms = -1.f;
  // An f16 layer's direction for which cuDNN offered no f16 algorithm: it runs in f32 on
  // copies of its operands (see ConvPlan).
  bool f32 = false;
};

// One input shape's cuDNN setup.
struct ConvPlan {
  std::int64_t n = 0, h = 0, w = 0;
  TensorDesc x, y;                                   // NHWC input and output
  ConvDesc fwd_conv, bwd_data_conv, bwd_filter_conv;  // one per direction: each carries its math mode
  Choice<cudnnConvolutionFwdAlgo_t> fwd;
  Choice<cudnnConvolutionBwdDataAlgo_t> bwd_data;
  Choice<cudnnConvolutionBwdFilterAlgo_t> bwd_filter;
  bool timed = false;          // chosen by timing (cudnnFind*) rather than by the heuristics
  bool deterministic = false;  // only CUDNN_DETERMINISTIC algorithms were taken
  // The f32 fallback of an f16 layer: descriptors and f32 copies of x, y, dz and dx for the
  // directions cuDNN has no f16 algorithm for (cast in and out around the convolution; the
  // bias, ReLU and the other layers stay f16). Per shape, so that a CUDA graph captured for
  // one shape keeps its buffers when another shape runs.
  bool has_f32 = false;
  TensorDesc x32d, y32d;
  Tensor x32, y32, dz32, dx32;
};


// Everything one layer keeps for cuDNN: its filter descriptor and a plan per input shape.
// The geometry: c input channels, k filters of r x r; `layer` names it in messages.
struct ConvGpuState {
  ConvGpuState(DType dtype, std::int64_t c, std::int64_t k, std::int64_t r, std::string layer);
  DType dtype = DType::kF32;
  std::int64_t c = 0, k = 0, r = 0;
  std::string layer;
  FilterDesc w;  // (K, C, k, k) in NHWC order, i.e. memory (K, k, k, C): the layer's OHWI kernel
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, DType>, ConvPlan> plans;  // (N, H, W, dtype)
  const ConvPlan* last_forward = nullptr;
  const ConvPlan* last_backward = nullptr;
  Tensor dz;  // dy masked by ReLU: the layer's own buffer (dy belongs to the next layer)
  FilterDesc w32;     // the f32 fallback's filter descriptor (the master weights), and
  Tensor dw32;        // its filter gradient, added into the f16 gradient
  bool noted_f32 = false;  // the one line saying that this layer falls back has been printed
};

// The plan for input x (N, H, W, C) with output y: made on first sight of that shape (never
// during a graph capture: std::logic_error), with its algorithms still to choose.
ConvPlan& conv_plan(ConvGpuState& st, const Tensor& x, const Tensor& y, const KernelOptions& o);

// y = conv(x, w): `weight` is the layer's kernel in x's dtype, `master` its f32 values (the
// f32 fallback's weights). Chooses the forward algorithm on the first call for the plan.
void conv_forward(ConvGpuState& st, ConvPlan& p, const Tensor& x, const void* weight, const Tensor& master, Tensor& y,
                  const KernelOptions& o);

// The two gradients from dz (st.dz, the ReLU-masked output gradient): dw += conv_filter(x,
// dz) into `grad`, and, when dx is defined, dx = conv_data(w, dz). Chooses the backward
// algorithms on the first call for the plan.
void conv_backward(ConvGpuState& st, ConvPlan& p, const Tensor& x, const void* weight, const Tensor& master,
                   Tensor& grad, Tensor& dx, const KernelOptions& o);

// "cuDNN NHWC f32: fwd IMPLICIT_GEMM (FMA), bwd-data ..., bwd-filter ...; workspace 1.2 MiB;
// timed for batch 64", for --verbose.
std::string describe(const ConvGpuState& st);

}  // namespace mf
