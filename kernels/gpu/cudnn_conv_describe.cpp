// cudnn_conv_describe.cpp: what a convolution's cuDNN plan chose, in words, for --verbose
// (Conv2D::gpu_config): algorithm names, math modes, the f32 fallback and the cost of
// --deterministic.
#include <cudnn.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "kernels/gpu/cudnn_conv.h"
#include "runtime/errors.h"

namespace mf {

namespace {

const char* fwd_algo_name(cudnnConvolutionFwdAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM: return "IMPLICIT_GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM: return "IMPLICIT_PRECOMP_GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_GEMM: return "GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_DIRECT: return "DIRECT";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT: return "FFT";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING: return "FFT_TILING";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD: return "WINOGRAD";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED: return "WINOGRAD_NONFUSED";
    default: return "?";
  }
}
const char* bwd_data_algo_name(cudnnConvolutionBwdDataAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_0: return "ALGO_0";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_1: return "ALGO_1";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT: return "FFT";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING: return "FFT_TILING";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD: return "WINOGRAD";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED: return "WINOGRAD_NONFUSED";
    default: return "?";
  }
}
const char* bwd_filter_algo_name(cudnnConvolutionBwdFilterAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0: return "ALGO_0";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1: return "ALGO_1";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT: return "FFT";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3: return "ALGO_3";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED: return "WINOGRAD_NONFUSED";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING: return "FFT_TILING";
    default: return "?";
  }
}

// DEFAULT math lets cuDNN run f32 convolutions as TF32 on Ampere and newer; FMA forbids it.
const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_TENSOR_OP_MATH: return "Tensor Core";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "Tensor Core, converting";
    case CUDNN_FMA_MATH: return "FMA";
    default: return "default math: TF32 allowed in f32";
  }
}

// " (deterministic: +0.012 ms a call)": what a timed choice lost by skipping a faster
// non-deterministic candidate; empty when nothing faster was skipped or nothing was timed.
template <class Algo>
std::string determinism_cost(const Choice<Algo>& c, bool timed) {
  if (!timed || c.nondeterministic_ms < 0.f || c.ms < 0.f) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, " [deterministic: %+.3f ms a call]", static_cast<double>(c.ms - c.nondeterministic_ms));
  return buf;
}

// " (f32: no f16 algorithm)" after a direction that fell back.
template <class Algo>
const char* fallback_text(const Choice<Algo>& c) {
  return c.f32 ? " [f32: no f16 algorithm]" : "";
}

}  // namespace

std::string describe(const ConvGpuState& st) {
  const ConvPlan* p = st.last_backward ? st.last_backward : st.last_forward;
  if (!p) return "cuDNN, algorithms not chosen yet (no input seen)";
  std::string s = "cuDNN NHWC " + std::string(dtype_name(st.dtype)) + ": fwd " +
                  fwd_algo_name(p->fwd.algo) + " (" + math_name(p->fwd.math) + ")" + fallback_text(p->fwd) +
                  determinism_cost(p->fwd, p->timed);
  if (p->bwd_data.chosen)
    s += ", bwd-data " + std::string(bwd_data_algo_name(p->bwd_data.algo)) + " (" + math_name(p->bwd_data.math) + ")" +
         fallback_text(p->bwd_data) + determinism_cost(p->bwd_data, p->timed);
  if (p->bwd_filter.chosen)
    s += ", bwd-filter " + std::string(bwd_filter_algo_name(p->bwd_filter.algo)) + " (" +
         math_name(p->bwd_filter.math) + ")" + fallback_text(p->bwd_filter) + determinism_cost(p->bwd_filter, p->timed);
  const std::size_t ws = std::max({p->fwd.workspace, p->bwd_data.workspace, p->bwd_filter.workspace});
  s += "; workspace " + format_bytes(ws) + "; " + (p->timed ? "timed" : "heuristic") +
       (p->deterministic ? ", deterministic" : "") + " for batch " +
       std::to_string(p->n);
  if (st.plans.size() > 1) s += " (+" + std::to_string(st.plans.size() - 1) + " other shapes)";
  return s;
}

}  // namespace mf
