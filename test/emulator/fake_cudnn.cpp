// fake_cudnn.cpp: the cuDNN calls microflow makes, on the CPU, for the emulated GPU tests.
// Compiled against the real <cudnn.h> and linked instead of libcudnn (see fake_cudart.cpp).
//
// What it emulates: the legacy (cuDNN 7-style) 2-D convolution API on 4-D NCHW or NHWC
// tensors of f32 or f16 data: descriptors, the three directions with any padding, stride
// and dilation, both convolution modes, alpha/beta scaling, and the checks cuDNN makes of
// the descriptors against each other (channels, batch, output size, data types, layouts).
// Algorithm lists and workspace sizes are a fixed, plausible table (see kFwdAlgos and the
// others), not timings: one algorithm that needs a workspace comes first, so the caller's
// workspace growth runs, and some algorithms are reported NOT_SUPPORTED, so the caller's
// skipping of them runs. The work runs on the handle's stream (streams.h); it first
// scribbles over the workspace the algorithm asked for, so a workspace that overlaps live
// data shows. Products are accumulated in double and rounded once to the data type, except
// by the non-deterministic algorithms (backward-filter ALGO_3 and ALGO_0, listed fastest
// first as on many GPUs), which add per-image partials in float in an order that changes at
// every call, as atomics do: only a caller that asks for CUDNN_DETERMINISTIC algorithms gets
// the same bits twice.
// Operands (and the workspace) that run past their allocation or lie in host memory fail the
// call (CUDNN_STATUS_EXECUTION_FAILED, with a line on stderr), where a GPU would read or write
// them anyway.
// What it does not: the graph (backend) API, grouped or N-D convolutions, strided
// (non-packed) tensors, data types other than FLOAT and HALF, half-precision accumulation
// (CUDNN_DATA_HALF compute type) and TF32, the alignment and channel-count rules of
// particular kernels (except, on request, the f16 channel rule: refused_half), real timings.
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "tensor/half.h"
#include "test/emulator/streams.h"

// cuDNN 9 marks the legacy convolution API (the descriptor types included) deprecated. It is
// the API microflow uses, so this file defines it; under CUDNN_WARN_DEPRECATED every line
// below would warn about the very declarations it implements.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

struct cudnnContext {
  cudaStream_t stream = nullptr;  // nullptr: the legacy default stream
};

// A descriptor is usable only once a Set call succeeded on it.
struct cudnnTensorStruct {
  bool set = false;
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int n = 0, c = 0, h = 0, w = 0;
};

struct cudnnFilterStruct {
  bool set = false;
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;  // NCHW: memory KCRS; NHWC: memory KRSC
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int k = 0, c = 0, r = 0, s = 0;
};

struct cudnnConvolutionStruct {
  bool set = false;
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dil_h = 1, dil_w = 1;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;  // may be set before the rest
};

namespace {

// ---- one convolution, as checked and captured at the call ----

// Everything the work needs, copied out of the descriptors at the call: the work may run
// later (in a captured graph), after the descriptors changed or were destroyed, as the
// parameters of a real kernel launch would not.
struct Conv {
  bool half = false;
  cudnnTensorFormat_t x_format = CUDNN_TENSOR_NCHW, y_format = CUDNN_TENSOR_NCHW, w_format = CUDNN_TENSOR_NCHW;
  std::int64_t n = 0, c = 0, h = 0, w = 0;  // x
  std::int64_t k = 0, r = 0, s = 0;         // w (and C)
  std::int64_t p = 0, q = 0;                // y spatial (N, K, P, Q)
  std::int64_t pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dil_h = 1, dil_w = 1;
  bool flip = false;  // CUDNN_CONVOLUTION: the kernel is applied flipped (true convolution)
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;

  std::size_t elem() const { return half ? 2 : 4; }
  std::int64_t x_count() const { return n * c * h * w; }
  std::int64_t y_count() const { return n * k * p * q; }
  std::int64_t w_count() const { return k * c * r * s; }

  // Element offsets in the packed layouts the formats name.
  std::int64_t x_at(std::int64_t in, std::int64_t ic, std::int64_t ih, std::int64_t iw) const {
    return x_format == CUDNN_TENSOR_NHWC ? ((in * h + ih) * w + iw) * c + ic : ((in * c + ic) * h + ih) * w + iw;
  }
  std::int64_t y_at(std::int64_t in, std::int64_t ik, std::int64_t ip, std::int64_t iq) const {
    return y_format == CUDNN_TENSOR_NHWC ? ((in * p + ip) * q + iq) * k + ik : ((in * k + ik) * p + ip) * q + iq;
  }
  std::int64_t w_at(std::int64_t ik, std::int64_t ic, std::int64_t ir, std::int64_t is) const {
    return w_format == CUDNN_TENSOR_NHWC ? ((ik * r + ir) * s + is) * c + ic : ((ik * c + ic) * r + ir) * s + is;
  }
};

bool is_data_type(int t) { return t >= CUDNN_DATA_FLOAT && t <= CUDNN_DATA_COMPLEX_FP64; }
bool is_format(int f) { return f == CUDNN_TENSOR_NCHW || f == CUDNN_TENSOR_NHWC || f == CUDNN_TENSOR_NCHW_VECT_C; }

// What Set*4dDescriptor accepts: invalid enumerants are BAD_PARAM (as documented); valid
// ones this emulation cannot compute with are NOT_SUPPORTED.
cudnnStatus_t check_layout(cudnnTensorFormat_t format, cudnnDataType_t type) {
  if (!is_format(format) || !is_data_type(type)) return CUDNN_STATUS_BAD_PARAM;
  if (format == CUDNN_TENSOR_NCHW_VECT_C) return CUDNN_STATUS_NOT_SUPPORTED;
  if (type != CUDNN_DATA_FLOAT && type != CUDNN_DATA_HALF) return CUDNN_STATUS_NOT_SUPPORTED;
  return CUDNN_STATUS_SUCCESS;
}

// The checks cuDNN makes of x (N, C, H, W), w (K, C, R, S) and y (N, K, P, Q) in every
// query and every compute call of the three directions; fills `conv` when they pass.
cudnnStatus_t make_conv(cudnnHandle_t handle, cudnnTensorDescriptor_t xd, cudnnFilterDescriptor_t wd,
                        cudnnConvolutionDescriptor_t cd, cudnnTensorDescriptor_t yd, Conv* conv) {
  if (!handle || !xd || !wd || !cd || !yd) return CUDNN_STATUS_BAD_PARAM;
  if (!xd->set || !wd->set || !cd->set || !yd->set) return CUDNN_STATUS_BAD_PARAM;
  if (xd->type != yd->type || xd->type != wd->type) return CUDNN_STATUS_BAD_PARAM;
  const bool half = xd->type == CUDNN_DATA_HALF;
  // Half accumulation of float data would lose precision the caller asked to keep.
  if (!half && cd->compute != CUDNN_DATA_FLOAT) return CUDNN_STATUS_BAD_PARAM;
  if (wd->c != xd->c || yd->n != xd->n || yd->c != wd->k) return CUDNN_STATUS_BAD_PARAM;
  // The dilated filter must fit in the padded input, in each spatial dimension.
  const std::int64_t extent_h = static_cast<std::int64_t>(cd->dil_h) * (wd->r - 1) + 1;
  const std::int64_t extent_w = static_cast<std::int64_t>(cd->dil_w) * (wd->s - 1) + 1;
  const std::int64_t padded_h = xd->h + 2 * static_cast<std::int64_t>(cd->pad_h);
  const std::int64_t padded_w = xd->w + 2 * static_cast<std::int64_t>(cd->pad_w);
  if (extent_h > padded_h || extent_w > padded_w) return CUDNN_STATUS_BAD_PARAM;
  const std::int64_t p = (padded_h - extent_h) / cd->stride_h + 1, q = (padded_w - extent_w) / cd->stride_w + 1;
  if (yd->h != p || yd->w != q) return CUDNN_STATUS_BAD_PARAM;
  // cuDNN's f16 NHWC kernels take the filter in the tensors' layout (KRSC), never mixed.
  if (half && (xd->format != yd->format || wd->format != xd->format)) return CUDNN_STATUS_NOT_SUPPORTED;
  Conv v;
  v.half = half;
  v.x_format = xd->format, v.y_format = yd->format, v.w_format = wd->format;
  v.n = xd->n, v.c = xd->c, v.h = xd->h, v.w = xd->w;
  v.k = wd->k, v.r = wd->r, v.s = wd->s;
  v.p = p, v.q = q;
  v.pad_h = cd->pad_h, v.pad_w = cd->pad_w, v.stride_h = cd->stride_h, v.stride_w = cd->stride_w;
  v.dil_h = cd->dil_h, v.dil_w = cd->dil_w;
  v.flip = cd->mode == CUDNN_CONVOLUTION;
  v.math = cd->math;
  *conv = v;
  return CUDNN_STATUS_SUCCESS;
}

// ---- the algorithm tables ----

enum class Dir { kFwd, kBwdData, kBwdFilter };

// How much workspace an algorithm asks for, as a function of the problem.
enum class Ws {
  kNone,
  kPrecomp,    // precomputed input offsets: one int per filter tap and channel, plus tiles
  kIm2col,     // the whole im2col matrix: N P Q x C R S elements
  kFilterT,    // a transposed copy of the filter, plus tiles
  kFilterF32,  // f32 partial sums of the filter gradient, plus tiles
};

struct Algo {
  int id;
  bool supported;
  Ws ws;
  cudnnDeterminism_t determinism;
};

// Listed as cuDNN lists them: every algorithm of the enum once, those that run first,
// fastest first. The first of each needs a workspace so that a caller taking the fastest
// grows its workspace; FFT and Winograd are NOT_SUPPORTED (cuDNN runs neither on NHWC).
constexpr Algo kFwdAlgos[] = {
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, true, Ws::kPrecomp, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, true, Ws::kNone, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_FWD_ALGO_GEMM, true, Ws::kIm2col, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_FWD_ALGO_FFT, false, Ws::kNone, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING, false, Ws::kNone, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD, false, Ws::kNone, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, false, Ws::kNone, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_FWD_ALGO_DIRECT, false, Ws::kNone, CUDNN_DETERMINISTIC},
};
constexpr Algo kBwdDataAlgos[] = {
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, true, Ws::kFilterT, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, true, Ws::kNone, CUDNN_NON_DETERMINISTIC},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT, false, Ws::kNone, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING, false, Ws::kNone, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD, false, Ws::kNone, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED, false, Ws::kNone, CUDNN_DETERMINISTIC},
};
// The fastest backward-filter algorithm is a non-deterministic one, as it often is on a
// GPU: it sums its partial results in an order that changes at every call (see
// backward_filter), so that a caller who needs the same bits at every run must look past it.
constexpr Algo kBwdFilterAlgos[] = {
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, true, Ws::kFilterF32, CUDNN_NON_DETERMINISTIC},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, true, Ws::kFilterF32, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, true, Ws::kNone, CUDNN_NON_DETERMINISTIC},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT, false, Ws::kNone, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING, false, Ws::kNone, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD, false, Ws::kNone, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED, false, Ws::kNone, CUDNN_DETERMINISTIC},
};
static_assert(sizeof(kFwdAlgos) / sizeof(Algo) == CUDNN_CONVOLUTION_FWD_ALGO_COUNT, "every forward algorithm once");
static_assert(sizeof(kBwdDataAlgos) / sizeof(Algo) == CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
              "every bwd-data algorithm once");
static_assert(sizeof(kBwdFilterAlgos) / sizeof(Algo) == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
              "every bwd-filter algorithm once");

struct Table {
  const Algo* algos;
  int count;
};

Table table(Dir dir) {
  switch (dir) {
    case Dir::kFwd: return {kFwdAlgos, CUDNN_CONVOLUTION_FWD_ALGO_COUNT};
    case Dir::kBwdData: return {kBwdDataAlgos, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT};
    case Dir::kBwdFilter: return {kBwdFilterAlgos, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT};
  }
  return {nullptr, 0};
}

constexpr std::size_t kTiles = 4096;  // the fixed part of the workspaces: a few tiles' worth

std::size_t workspace_bytes(Ws ws, const Conv& v) {
  const auto taps = static_cast<std::size_t>(v.c * v.r * v.s);
  switch (ws) {
    case Ws::kNone: return 0;
    case Ws::kPrecomp: return taps * sizeof(int) + kTiles;
    case Ws::kIm2col: return static_cast<std::size_t>(v.n * v.p * v.q) * taps * v.elem();
    case Ws::kFilterT: return static_cast<std::size_t>(v.k) * taps * v.elem() + kTiles;
    case Ws::kFilterF32: return static_cast<std::size_t>(v.k) * taps * sizeof(float) + kTiles;
  }
  return 0;
}

// The algorithm `id` of direction `dir`, if it is one this emulation runs.
const Algo* find_algo(Dir dir, int id) {
  const Table t = table(dir);
  for (int i = 0; i < t.count; ++i)
    if (t.algos[i].id == id) return t.algos[i].supported ? &t.algos[i] : nullptr;
  return nullptr;
}

// The math an entry reports, by its rank among the successful ones. f16: Tensor Cores for
// the fastest two. f32: the fastest is reported with DEFAULT math (TF32 allowed), the
// others with FMA, so a caller that needs FMA only must look past the first. A descriptor
// set to FMA forbids Tensor Cores: every entry reports FMA.
cudnnMathType_t reported_math(const Conv& v, int rank) {
  if (v.math == CUDNN_FMA_MATH) return CUDNN_FMA_MATH;
  if (v.half) return rank < 2 ? CUDNN_TENSOR_OP_MATH : CUDNN_DEFAULT_MATH;
  return rank == 0 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

// MF_EMULATED_CUDNN_F16_CHANNELS=8 makes every algorithm refuse (NOT_SUPPORTED) an f16
// convolution whose input or output channel count is not a multiple of 8: the worst case
// the cuDNN documentation leaves open. Its Developer Guide (Legacy API > Convolution
// Functions > Data and Filter Formats) runs f16 convolutions on Tensor Cores only when the
// channel counts are multiples of 8, and pads only NCHW data, not NHWC; whether a non-Tensor
// Core algorithm is offered instead for C = 1 (the first layer) is not stated. Unset (the
// default): every listed algorithm runs any channel count, as they do in FP32.
bool refused_half(const Conv& v) {
  if (!v.half) return false;
  const char* e = std::getenv("MF_EMULATED_CUDNN_F16_CHANNELS");
  const long m = e ? std::strtol(e, nullptr, 10) : 0;
  return m > 1 && (v.c % m != 0 || v.k % m != 0);
}

// Fills the first min(requested, algorithms) entries of `perf`, as cuDNN orders them: the
// algorithms that ran (fastest first), then those whose workspace exceeded `limit`, then
// those not supported. `limit` is the Find calls' workspace; the heuristics have none.
template <class Perf, class AlgoEnum>
cudnnStatus_t fill_perf(Dir dir, const Conv& v, int requested, int* returned, Perf* perf, std::size_t limit) {
  if (requested < 1 || !returned || !perf) return CUDNN_STATUS_BAD_PARAM;
  const Table t = table(dir);
  std::vector<Perf> out;
  for (int pass = 0; pass < 3; ++pass)
    for (int i = 0; i < t.count; ++i) {
      const Algo& a = t.algos[i];
      const std::size_t bytes = workspace_bytes(a.ws, v);
      // CUDNN_STATUS_ALLOC_FAILED: the workspace it needs was not given (in cuDNN 9 the same
      // value as CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED).
      const cudnnStatus_t status = !a.supported || refused_half(v) ? CUDNN_STATUS_NOT_SUPPORTED
                                   : bytes > limit ? CUDNN_STATUS_ALLOC_FAILED
                                                   : CUDNN_STATUS_SUCCESS;
      const int order = status == CUDNN_STATUS_SUCCESS ? 0 : status == CUDNN_STATUS_ALLOC_FAILED ? 1 : 2;
      if (order != pass) continue;
      Perf e{};
      e.algo = static_cast<AlgoEnum>(a.id);
      e.status = status;
      const int rank = static_cast<int>(out.size());
      e.time = status == CUDNN_STATUS_SUCCESS ? 0.01f * static_cast<float>(rank + 1) : -1.0f;
      e.memory = a.supported ? bytes : 0;
      e.determinism = a.determinism;
      e.mathType = status == CUDNN_STATUS_SUCCESS ? reported_math(v, rank) : CUDNN_DEFAULT_MATH;
      out.push_back(e);
    }
  const int n = requested < static_cast<int>(out.size()) ? requested : static_cast<int>(out.size());
  for (int i = 0; i < n; ++i) perf[i] = out[static_cast<std::size_t>(i)];
  *returned = n;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t workspace_size(Dir dir, const Conv& v, int algo, std::size_t* bytes) {
  if (!bytes) return CUDNN_STATUS_BAD_PARAM;
  const Algo* a = find_algo(dir, algo);
  if (!a || refused_half(v)) return CUDNN_STATUS_NOT_SUPPORTED;
  *bytes = workspace_bytes(a->ws, v);
  return CUDNN_STATUS_SUCCESS;
}

// ---- the arithmetic ----

float load(const void* p, bool half, std::int64_t i) {
  if (half) return mf::half_to_float(static_cast<const mf::Half*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

void store(void* p, bool half, std::int64_t i, double v) {
  if (half)
    static_cast<mf::Half*>(p)[i] = mf::float_to_half(static_cast<float>(v));
  else
    static_cast<float*>(p)[i] = static_cast<float>(v);
}

// out = alpha acc + beta out; out is not read when beta == 0 (it may hold NaN garbage).
void blend(void* out, bool half, std::int64_t i, double acc, float alpha, float beta) {
  double v = static_cast<double>(alpha) * acc;
  if (beta != 0.0f) v += static_cast<double>(beta) * load(out, half, i);
  store(out, half, i, v);
}

// The filter as the taps apply it, (K, R, S, C) in f32: w(k, c, r, s), or w(k, c, R-1-r,
// S-1-s) for CUDNN_CONVOLUTION (the kernel flipped).
std::vector<float> filter_taps(const Conv& v, const void* w) {
  std::vector<float> t(static_cast<std::size_t>(v.w_count()));
  std::size_t i = 0;
  for (std::int64_t k = 0; k < v.k; ++k)
    for (std::int64_t r = 0; r < v.r; ++r)
      for (std::int64_t s = 0; s < v.s; ++s)
        for (std::int64_t c = 0; c < v.c; ++c)
          t[i++] = load(w, v.half, v.w_at(k, c, v.flip ? v.r - 1 - r : r, v.flip ? v.s - 1 - s : s));
  return t;
}

// x as (N, H, W, C) in f32, whatever its layout.
std::vector<float> input_nhwc(const Conv& v, const void* x) {
  std::vector<float> t(static_cast<std::size_t>(v.x_count()));
  std::size_t i = 0;
  for (std::int64_t n = 0; n < v.n; ++n)
    for (std::int64_t h = 0; h < v.h; ++h)
      for (std::int64_t w = 0; w < v.w; ++w)
        for (std::int64_t c = 0; c < v.c; ++c) t[i++] = load(x, v.half, v.x_at(n, c, h, w));
  return t;
}

// The input row and column tap (r, s) of output (p, q) reads; may lie in the padding.
std::int64_t in_row(const Conv& v, std::int64_t p, std::int64_t r) { return p * v.stride_h - v.pad_h + r * v.dil_h; }
std::int64_t in_col(const Conv& v, std::int64_t q, std::int64_t s) { return q * v.stride_w - v.pad_w + s * v.dil_w; }

// The (R, S, C) patch of x that output (n, p, q) sees, zeros in the padding.
void gather_patch(const Conv& v, const std::vector<float>& x, std::int64_t n, std::int64_t p, std::int64_t q,
                  float* patch) {
  for (std::int64_t r = 0; r < v.r; ++r)
    for (std::int64_t s = 0; s < v.s; ++s, patch += v.c) {
      const std::int64_t h = in_row(v, p, r), w = in_col(v, q, s);
      if (h < 0 || h >= v.h || w < 0 || w >= v.w) {
        std::fill(patch, patch + v.c, 0.0f);
      } else {
        const float* src = x.data() + ((n * v.h + h) * v.w + w) * v.c;
        std::copy(src, src + v.c, patch);
      }
    }
}

// y (N, K, P, Q) = alpha sum_{c, r, s} x(n, c, p stride - pad + r dil, ...) tap(k, c, r, s) + beta y.
void forward(const Conv& v, const void* x, const void* w, void* y, float alpha, float beta) {
  const std::vector<float> xs = input_nhwc(v, x), taps = filter_taps(v, w);
  const std::int64_t len = v.r * v.s * v.c;
  std::vector<float> patch(static_cast<std::size_t>(len));
  for (std::int64_t n = 0; n < v.n; ++n)
    for (std::int64_t p = 0; p < v.p; ++p)
      for (std::int64_t q = 0; q < v.q; ++q) {
        gather_patch(v, xs, n, p, q, patch.data());
        for (std::int64_t k = 0; k < v.k; ++k) {
          const float* t = taps.data() + k * len;
          double acc = 0.0;
          for (std::int64_t i = 0; i < len; ++i) acc += static_cast<double>(patch[i]) * t[i];
          blend(y, v.half, v.y_at(n, k, p, q), acc, alpha, beta);
        }
      }
}

// dx (N, C, H, W) = alpha sum over the (k, p, q, r, s) whose tap reads x(n, c, h, w) of
// dy(n, k, p, q) tap(k, c, r, s) + beta dx: the forward's transpose.
void backward_data(const Conv& v, const void* w, const void* dy, void* dx, float alpha, float beta) {
  const std::vector<float> taps = filter_taps(v, w);
  std::vector<double> acc(static_cast<std::size_t>(v.x_count()), 0.0);  // (N, H, W, C)
  std::vector<float> g(static_cast<std::size_t>(v.k));
  for (std::int64_t n = 0; n < v.n; ++n)
    for (std::int64_t p = 0; p < v.p; ++p)
      for (std::int64_t q = 0; q < v.q; ++q) {
        for (std::int64_t k = 0; k < v.k; ++k) g[static_cast<std::size_t>(k)] = load(dy, v.half, v.y_at(n, k, p, q));
        for (std::int64_t r = 0; r < v.r; ++r)
          for (std::int64_t s = 0; s < v.s; ++s) {
            const std::int64_t h = in_row(v, p, r), col = in_col(v, q, s);
            if (h < 0 || h >= v.h || col < 0 || col >= v.w) continue;  // the tap reads padding
            double* a = acc.data() + ((n * v.h + h) * v.w + col) * v.c;
            for (std::int64_t k = 0; k < v.k; ++k) {
              const double d = g[static_cast<std::size_t>(k)];
              const float* t = taps.data() + ((k * v.r + r) * v.s + s) * v.c;
              for (std::int64_t c = 0; c < v.c; ++c) a[c] += d * t[c];
            }
          }
      }
  std::size_t i = 0;
  for (std::int64_t n = 0; n < v.n; ++n)
    for (std::int64_t h = 0; h < v.h; ++h)
      for (std::int64_t col = 0; col < v.w; ++col)
        for (std::int64_t c = 0; c < v.c; ++c) blend(dx, v.half, v.x_at(n, c, h, col), acc[i++], alpha, beta);
}

// The order a non-deterministic algorithm adds its per-image partial sums in: a new
// rotation at every call, as float atomics from blocks that finish in a different order.
std::int64_t atomic_order_start(std::int64_t images) {
  static std::atomic<std::uint64_t> calls{std::random_device{}()};
  return static_cast<std::int64_t>((calls.fetch_add(0x9e3779b97f4a7c15ull) >> 33) % static_cast<std::uint64_t>(images));
}

// dw (K, C, R, S) = alpha sum_{n, p, q} x(n, c, p stride - pad + r dil, ...) dy(n, k, p, q)
// + beta dw, at the flipped position (R-1-r, S-1-s) for CUDNN_CONVOLUTION. A deterministic
// algorithm sums in double, in image order. A non-deterministic one sums each image in
// double, rounds that partial to float and adds the partials in float, starting from a
// different image at every call: the low bits of the result change from call to call.
void backward_filter(const Conv& v, const void* x, const void* dy, void* dw, float alpha, float beta,
                     bool deterministic) {
  const std::vector<float> xs = input_nhwc(v, x);
  const std::int64_t len = v.r * v.s * v.c;
  std::vector<double> acc(static_cast<std::size_t>(v.k * len), 0.0);  // (K, R, S, C) in tap order
  std::vector<double> image(deterministic ? 0 : acc.size());
  std::vector<float> patch(static_cast<std::size_t>(len));
  const std::int64_t start = deterministic || v.n == 0 ? 0 : atomic_order_start(v.n);
  for (std::int64_t step = 0; step < v.n; ++step) {
    const std::int64_t n = (start + step) % v.n;
    std::vector<double>& into = deterministic ? acc : image;
    if (!deterministic) std::fill(image.begin(), image.end(), 0.0);
    for (std::int64_t p = 0; p < v.p; ++p)
      for (std::int64_t q = 0; q < v.q; ++q) {
        gather_patch(v, xs, n, p, q, patch.data());
        for (std::int64_t k = 0; k < v.k; ++k) {
          const double d = load(dy, v.half, v.y_at(n, k, p, q));
          double* a = into.data() + k * len;
          for (std::int64_t i = 0; i < len; ++i) a[i] += d * patch[i];
        }
      }
    if (!deterministic)
      for (std::size_t j = 0; j < acc.size(); ++j)
        acc[j] = static_cast<float>(static_cast<float>(acc[j]) + static_cast<float>(image[j]));
  }
  std::size_t i = 0;
  for (std::int64_t k = 0; k < v.k; ++k)
    for (std::int64_t r = 0; r < v.r; ++r)
      for (std::int64_t s = 0; s < v.s; ++s)
        for (std::int64_t c = 0; c < v.c; ++c)
          blend(dw, v.half, v.w_at(k, c, v.flip ? v.r - 1 - r : r, v.flip ? v.s - 1 - s : s), acc[i++], alpha, beta);
}

// ---- the calls' shared steps ----

// The element counts of a direction's operands, in the order the calls take them: (x, w, y)
// forward, (w, dy, dx) backward data, (x, dy, dw) backward filter.
std::array<std::int64_t, 3> operand_counts(Dir dir, const Conv& v) {
  switch (dir) {
    case Dir::kFwd: return {v.x_count(), v.w_count(), v.y_count()};
    case Dir::kBwdData: return {v.w_count(), v.y_count(), v.x_count()};
    case Dir::kBwdFilter: return {v.x_count(), v.y_count(), v.w_count()};
  }
  return {0, 0, 0};
}

// True when the operands and `workspace_bytes` of workspace each lie inside one device
// allocation. cuDNN does not check this: its kernels would run past an operand whose
// descriptor is larger than its buffer (or into host memory) and fault or use whatever lies
// there, so the call fails here instead, with a line on stderr naming the operand.
bool on_device(Dir dir, const Conv& v, const void* in0, const void* in1, const void* out, const void* workspace,
               std::size_t workspace_bytes) {
  static const char* const kNames[3][3] = {{"x", "w", "y"}, {"w", "dy", "dx"}, {"x", "dy", "dw"}};
  const std::array<std::int64_t, 3> counts = operand_counts(dir, v);
  const void* const ptrs[3] = {in0, in1, out};
  for (int i = 0; i < 3; ++i)
    if (!mf::emulator::device_span(ptrs[i], static_cast<std::size_t>(counts[static_cast<std::size_t>(i)]) * v.elem())) {
      std::fprintf(stderr, "emulated cuDNN: %s (%lld elements) is not inside one device allocation\n",
                   kNames[static_cast<int>(dir)][i], static_cast<long long>(counts[static_cast<std::size_t>(i)]));
      return false;
    }
  if (workspace_bytes > 0 && !mf::emulator::device_span(workspace, workspace_bytes)) {
    std::fprintf(stderr, "emulated cuDNN: the workspace (%zu bytes) is not inside one device allocation\n",
                 workspace_bytes);
    return false;
  }
  return true;
}

// A compute call's checks past the descriptors: pointers, the algorithm, its workspace.
// Returns the algorithm's workspace size in *need.
cudnnStatus_t check_compute(Dir dir, const Conv& v, int algo, const void* alpha, const void* beta, const void* in0,
                            const void* in1, const void* out, const void* workspace, std::size_t workspace_bytes_given,
                            std::size_t* need) {
  if (!alpha || !beta || !in0 || !in1 || !out) return CUDNN_STATUS_BAD_PARAM;
  const Algo* a = find_algo(dir, algo);
  if (!a || refused_half(v)) return CUDNN_STATUS_NOT_SUPPORTED;
  *need = workspace_bytes(a->ws, v);
  if (workspace_bytes_given < *need) return CUDNN_STATUS_BAD_PARAM;
  if (*need > 0 && !workspace) return CUDNN_STATUS_BAD_PARAM;
  if (!on_device(dir, v, in0, in1, out, workspace, *need)) return CUDNN_STATUS_EXECUTION_FAILED;
  return CUDNN_STATUS_SUCCESS;
}

// Queues `compute` after scribbling 0xcd over the `need` workspace bytes the algorithm
// uses, before it reads its inputs: a workspace that overlaps an input or live data of the
// caller then corrupts it, as the real algorithm's scratch writes would.
template <class F>
cudnnStatus_t enqueue_compute(cudnnHandle_t handle, void* workspace, std::size_t need, F compute) {
  const bool queued = mf::emulator::enqueue(handle->stream, [workspace, need, compute] {
    if (need > 0) std::memset(workspace, 0xcd, need);
    compute();
  });
  return queued ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_EXECUTION_FAILED;
}

// The Find*Ex calls run every candidate on the caller's buffers and wait for them. What
// they leave in the output is no result to rely on: it is left as NaN (all bits set, a NaN
// in f32 and in f16), so a caller that forgets to compute it again reads NaN. The
// candidates' scratch writes cover the workspace they were given.
cudnnStatus_t find_algorithms(Dir dir, cudnnHandle_t handle, const Conv& v, const void* in0, const void* in1,
                              void* out, std::int64_t out_count, int requested, int* returned, void* perf_results,
                              void* workspace, std::size_t workspace_bytes_given) {
  if (!in0 || !in1 || !out || requested < 1 || !returned || !perf_results) return CUDNN_STATUS_BAD_PARAM;
  if (!workspace && workspace_bytes_given > 0) return CUDNN_STATUS_BAD_PARAM;
  if (!on_device(dir, v, in0, in1, out, workspace, workspace_bytes_given)) return CUDNN_STATUS_EXECUTION_FAILED;
  // Finding waits for the work, which a stream being captured into a graph forbids (the
  // capture is then invalidated, as CUDA does).
  if (!mf::emulator::may_synchronize(handle->stream)) return CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH;
  cudnnStatus_t s = CUDNN_STATUS_SUCCESS;
  switch (dir) {
    case Dir::kFwd:
      s = fill_perf<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
          dir, v, requested, returned, static_cast<cudnnConvolutionFwdAlgoPerf_t*>(perf_results),
          workspace_bytes_given);
      break;
    case Dir::kBwdData:
      s = fill_perf<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
          dir, v, requested, returned, static_cast<cudnnConvolutionBwdDataAlgoPerf_t*>(perf_results),
          workspace_bytes_given);
      break;
    case Dir::kBwdFilter:
      s = fill_perf<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
          dir, v, requested, returned, static_cast<cudnnConvolutionBwdFilterAlgoPerf_t*>(perf_results),
          workspace_bytes_given);
      break;
  }
  if (s != CUDNN_STATUS_SUCCESS) return s;
  const std::size_t out_bytes = static_cast<std::size_t>(out_count) * v.elem();
  const bool queued = mf::emulator::enqueue(handle->stream, [=] {
    if (workspace_bytes_given > 0) std::memset(workspace, 0xcd, workspace_bytes_given);
    std::memset(out, 0xff, out_bytes);
  });
  return queued ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_EXECUTION_FAILED;
}

}  // namespace

// extern "C", as the headers declare them: a definition whose parameters differ from the
// declaration is then an error instead of a silent C++ overload.
extern "C" {

// ---- handle, version, errors ----

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (!handle) return CUDNN_STATUS_BAD_PARAM;
  *handle = new cudnnContext;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  if (!handle) return CUDNN_STATUS_BAD_PARAM;
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUDNN_STATUS_BAD_PARAM;
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

std::size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

std::size_t cudnnGetCudartVersion(void) { return CUDART_VERSION; }

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (static_cast<int>(status)) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH: return "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH";
    case CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH: return "CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH";
    case CUDNN_STATUS_DEPRECATED: return "CUDNN_STATUS_DEPRECATED";
    case CUDNN_STATUS_LICENSE_ERROR: return "CUDNN_STATUS_LICENSE_ERROR";
    case CUDNN_STATUS_RUNTIME_IN_PROGRESS: return "CUDNN_STATUS_RUNTIME_IN_PROGRESS";
    case CUDNN_STATUS_RUNTIME_FP_OVERFLOW: return "CUDNN_STATUS_RUNTIME_FP_OVERFLOW";
    case CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED: return "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_INVALID_VALUE: return "CUDNN_STATUS_INVALID_VALUE";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER: return "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER";
    case CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED: return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
    case CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND: return "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND";
    case CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT: return "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT";
    case CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH";
    case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
    case CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES: return "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES";
    case CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE: return "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE";
    case CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH";
    case CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE: return "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN: return "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN";
    case CUDNN_STATUS_NOT_SUPPORTED_SHAPE: return "CUDNN_STATUS_NOT_SUPPORTED_SHAPE";
    case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE: return "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE";
    case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT: return "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT";
    case CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER:
      return "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER";
    case CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART: return "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART";
    case CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH: return "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH";
    case CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING:
      return "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING";
    case CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE: return "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE";
    case CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT:
      return "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT";
    case CUDNN_STATUS_NOT_SUPPORTED_PADDING: return "CUDNN_STATUS_NOT_SUPPORTED_PADDING";
    case CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM: return "CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API: return "CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API";
    case CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE: return "CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE";
    case CUDNN_STATUS_INTERNAL_ERROR: return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED: return "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED";
    case CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE: return "CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE";
    case CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED:
      return "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED";
    case CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED:
      return "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED";
    case CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM: return "CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM";
    case CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED:
      return "CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    case CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER: return "CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER";
    case CUDNN_STATUS_EXECUTION_FAILED_CUBLAS: return "CUDNN_STATUS_EXECUTION_FAILED_CUBLAS";
    case CUDNN_STATUS_EXECUTION_FAILED_CUDART: return "CUDNN_STATUS_EXECUTION_FAILED_CUDART";
    case CUDNN_STATUS_EXECUTION_FAILED_CURAND: return "CUDNN_STATUS_EXECUTION_FAILED_CURAND";
  }
  return "CUDNN_UNKNOWN_STATUS_FOUND";
}

// ---- descriptors ----

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* desc) {
  if (!desc) return CUDNN_STATUS_BAD_PARAM;
  *desc = new cudnnTensorStruct;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t desc) {
  delete desc;  // destroying NULL is allowed
  return CUDNN_STATUS_SUCCESS;
}

// Packed 4-D tensor. A failed call leaves the descriptor as it was.
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t desc, cudnnTensorFormat_t format,
                                         cudnnDataType_t type, int n, int c, int h, int w) {
  if (!desc) return CUDNN_STATUS_BAD_PARAM;
  const cudnnStatus_t s = check_layout(format, type);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  if (n < 1 || c < 1 || h < 1 || w < 1) return CUDNN_STATUS_BAD_PARAM;
  // cuDNN limits a tensor to 2 Gi elements.
  if (static_cast<std::int64_t>(n) * c * h * w > INT32_MAX) return CUDNN_STATUS_NOT_SUPPORTED;
  desc->format = format, desc->type = type;
  desc->n = n, desc->c = c, desc->h = h, desc->w = w;
  desc->set = true;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* desc) {
  if (!desc) return CUDNN_STATUS_BAD_PARAM;
  *desc = new cudnnFilterStruct;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t desc) {
  delete desc;
  return CUDNN_STATUS_SUCCESS;
}

// (K, C, R, S) filter; `format` NCHW stores it KCRS, NHWC stores it KRSC.
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t desc, cudnnDataType_t type,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
  if (!desc) return CUDNN_STATUS_BAD_PARAM;
  const cudnnStatus_t s = check_layout(format, type);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  if (k < 1 || c < 1 || h < 1 || w < 1) return CUDNN_STATUS_BAD_PARAM;
  if (static_cast<std::int64_t>(k) * c * h * w > INT32_MAX) return CUDNN_STATUS_NOT_SUPPORTED;
  desc->type = type, desc->format = format;
  desc->k = k, desc->c = c, desc->r = h, desc->s = w;
  desc->set = true;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* desc) {
  if (!desc) return CUDNN_STATUS_BAD_PARAM;
  *desc = new cudnnConvolutionStruct;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t desc) {
  delete desc;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t desc, int pad_h, int pad_w, int u, int v,
                                              int dilation_h, int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t computeType) {
  if (!desc) return CUDNN_STATUS_BAD_PARAM;
  if (pad_h < 0 || pad_w < 0 || u < 1 || v < 1 || dilation_h < 1 || dilation_w < 1) return CUDNN_STATUS_BAD_PARAM;
  if (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION) return CUDNN_STATUS_BAD_PARAM;
  if (!is_data_type(computeType)) return CUDNN_STATUS_BAD_PARAM;
  if (computeType != CUDNN_DATA_FLOAT && computeType != CUDNN_DATA_HALF) return CUDNN_STATUS_NOT_SUPPORTED;
  desc->pad_h = pad_h, desc->pad_w = pad_w, desc->stride_h = u, desc->stride_w = v;
  desc->dil_h = dilation_h, desc->dil_w = dilation_w;
  desc->mode = mode;
  desc->compute = computeType;
  desc->set = true;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t desc, cudnnMathType_t mathType) {
  if (!desc) return CUDNN_STATUS_BAD_PARAM;
  switch (mathType) {
    case CUDNN_DEFAULT_MATH:
    case CUDNN_TENSOR_OP_MATH:
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
    case CUDNN_FMA_MATH:
      desc->math = mathType;
      return CUDNN_STATUS_SUCCESS;
  }
  return CUDNN_STATUS_BAD_PARAM;
}

// ---- algorithm choice: heuristics (no workspace limit) ----

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                     const cudnnFilterDescriptor_t wDesc,
                                                     const cudnnConvolutionDescriptor_t convDesc,
                                                     const cudnnTensorDescriptor_t yDesc, const int requestedAlgoCount,
                                                     int* returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t* perf) {
  Conv v;
  const cudnnStatus_t s = make_conv(handle, xDesc, wDesc, convDesc, yDesc, &v);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  return fill_perf<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(Dir::kFwd, v, requestedAlgoCount,
                                                                             returnedAlgoCount, perf, SIZE_MAX);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc,
                                                          const cudnnTensorDescriptor_t dyDesc,
                                                          const cudnnConvolutionDescriptor_t convDesc,
                                                          const cudnnTensorDescriptor_t dxDesc,
                                                          const int requestedAlgoCount, int* returnedAlgoCount,
                                                          cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  Conv v;
  const cudnnStatus_t s = make_conv(handle, dxDesc, wDesc, convDesc, dyDesc, &v);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  return fill_perf<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
      Dir::kBwdData, v, requestedAlgoCount, returnedAlgoCount, perf, SIZE_MAX);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
                                                            const cudnnTensorDescriptor_t diffDesc,
                                                            const cudnnConvolutionDescriptor_t convDesc,
                                                            const cudnnFilterDescriptor_t gradDesc,
                                                            const int requestedAlgoCount, int* returnedAlgoCount,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  Conv v;
  const cudnnStatus_t s = make_conv(handle, srcDesc, gradDesc, convDesc, diffDesc, &v);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  return fill_perf<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
      Dir::kBwdFilter, v, requestedAlgoCount, returnedAlgoCount, perf, SIZE_MAX);
}

// ---- algorithm choice: "timed" on the caller's buffers, within its workspace ----

cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                     const void* x, const cudnnFilterDescriptor_t wDesc, const void* w,
                                                     const cudnnConvolutionDescriptor_t convDesc,
                                                     const cudnnTensorDescriptor_t yDesc, void* y,
                                                     const int requestedAlgoCount, int* returnedAlgoCount,
                                                     cudnnConvolutionFwdAlgoPerf_t* perf, void* workSpace,
                                                     std::size_t workSpaceSizeInBytes) {
  Conv v;
  const cudnnStatus_t s = make_conv(handle, xDesc, wDesc, convDesc, yDesc, &v);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  return find_algorithms(Dir::kFwd, handle, v, x, w, y, v.y_count(), requestedAlgoCount, returnedAlgoCount, perf,
                         workSpace, workSpaceSizeInBytes);
}

cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc,
                                                          const void* w, const cudnnTensorDescriptor_t dyDesc,
                                                          const void* dy, const cudnnConvolutionDescriptor_t convDesc,
                                                          const cudnnTensorDescriptor_t dxDesc, void* dx,
                                                          const int requestedAlgoCount, int* returnedAlgoCount,
                                                          cudnnConvolutionBwdDataAlgoPerf_t* perf, void* workSpace,
                                                          std::size_t workSpaceSizeInBytes) {
  Conv v;
  const cudnnStatus_t s = make_conv(handle, dxDesc, wDesc, convDesc, dyDesc, &v);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  return find_algorithms(Dir::kBwdData, handle, v, w, dy, dx, v.x_count(), requestedAlgoCount, returnedAlgoCount,
                         perf, workSpace, workSpaceSizeInBytes);
}

cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                            const void* x, const cudnnTensorDescriptor_t dyDesc,
                                                            const void* y, const cudnnConvolutionDescriptor_t convDesc,
                                                            const cudnnFilterDescriptor_t dwDesc, void* dw,
                                                            const int requestedAlgoCount, int* returnedAlgoCount,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t* perf, void* workSpace,
                                                            std::size_t workSpaceSizeInBytes) {
  Conv v;
  const cudnnStatus_t s = make_conv(handle, xDesc, dwDesc, convDesc, dyDesc, &v);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  return find_algorithms(Dir::kBwdFilter, handle, v, x, y, dw, v.w_count(), requestedAlgoCount, returnedAlgoCount,
                         perf, workSpace, workSpaceSizeInBytes);
}

// ---- workspace sizes ----

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                      const cudnnFilterDescriptor_t wDesc,
                                                      const cudnnConvolutionDescriptor_t convDesc,
                                                      const cudnnTensorDescriptor_t yDesc,
                                                      cudnnConvolutionFwdAlgo_t algo, std::size_t* sizeInBytes) {
  Conv v;
  const cudnnStatus_t s = make_conv(handle, xDesc, wDesc, convDesc, yDesc, &v);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  return workspace_size(Dir::kFwd, v, algo, sizeInBytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc,
                                                           const cudnnTensorDescriptor_t dyDesc,
                                                           const cudnnConvolutionDescriptor_t convDesc,
                                                           const cudnnTensorDescriptor_t dxDesc,
                                                           cudnnConvolutionBwdDataAlgo_t algo,
                                                           std::size_t* sizeInBytes) {
  Conv v;
  const cudnnStatus_t s = make_conv(handle, dxDesc, wDesc, convDesc, dyDesc, &v);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  return workspace_size(Dir::kBwdData, v, algo, sizeInBytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                             const cudnnTensorDescriptor_t dyDesc,
                                                             const cudnnConvolutionDescriptor_t convDesc,
                                                             const cudnnFilterDescriptor_t gradDesc,
                                                             cudnnConvolutionBwdFilterAlgo_t algo,
                                                             std::size_t* sizeInBytes) {
  Conv v;
  const cudnnStatus_t s = make_conv(handle, xDesc, gradDesc, convDesc, dyDesc, &v);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  return workspace_size(Dir::kBwdFilter, v, algo, sizeInBytes);
}

// ---- the convolutions: checked now, computed when the stream gets to them ----
// alpha and beta are host floats for FLOAT and HALF data alike (cuDNN's scaling parameters
// are float unless the data is double), read at the call.

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t xDesc,
                                      const void* x, const cudnnFilterDescriptor_t wDesc, const void* w,
                                      const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
                                      void* workSpace, std::size_t workSpaceSizeInBytes, const void* beta,
                                      const cudnnTensorDescriptor_t yDesc, void* y) {
  Conv v;
  cudnnStatus_t s = make_conv(handle, xDesc, wDesc, convDesc, yDesc, &v);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  std::size_t need = 0;
  s = check_compute(Dir::kFwd, v, algo, alpha, beta, x, w, y, workSpace, workSpaceSizeInBytes, &need);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  return enqueue_compute(handle, workSpace, need, [v, x, w, y, a, b] { forward(v, x, w, y, a, b); });
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha, const cudnnFilterDescriptor_t wDesc,
                                           const void* w, const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                           const cudnnConvolutionDescriptor_t convDesc,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* workSpace,
                                           std::size_t workSpaceSizeInBytes, const void* beta,
                                           const cudnnTensorDescriptor_t dxDesc, void* dx) {
  Conv v;
  cudnnStatus_t s = make_conv(handle, dxDesc, wDesc, convDesc, dyDesc, &v);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  std::size_t need = 0;
  s = check_compute(Dir::kBwdData, v, algo, alpha, beta, w, dy, dx, workSpace, workSpaceSizeInBytes, &need);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  return enqueue_compute(handle, workSpace, need, [v, w, dy, dx, a, b] { backward_data(v, w, dy, dx, a, b); });
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha,
                                             const cudnnTensorDescriptor_t xDesc, const void* x,
                                             const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                             const cudnnConvolutionDescriptor_t convDesc,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void* workSpace,
                                             std::size_t workSpaceSizeInBytes, const void* beta,
                                             const cudnnFilterDescriptor_t dwDesc, void* dw) {
  Conv v;
  cudnnStatus_t s = make_conv(handle, xDesc, dwDesc, convDesc, dyDesc, &v);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  std::size_t need = 0;
  s = check_compute(Dir::kBwdFilter, v, algo, alpha, beta, x, dy, dw, workSpace, workSpaceSizeInBytes, &need);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  const bool deterministic = find_algo(Dir::kBwdFilter, algo)->determinism == CUDNN_DETERMINISTIC;
  return enqueue_compute(handle, workSpace, need,
                         [v, x, dy, dw, a, b, deterministic] { backward_filter(v, x, dy, dw, a, b, deterministic); });
}

}  // extern "C"

#pragma GCC diagnostic pop
