// conv2d_gpu.cu: Conv2D on the GPU: cuDNN convolutions on NHWC tensors (f32, or f16 with f32
// accumulation on Tensor Cores) followed by the fused bias + ReLU kernels of kernels/.
//
// Per direction (forward, backward data, backward filter) cuDNN offers several algorithms.
// They are chosen once per input shape, when the layer first meets it: that happens in the
// eager warm-up step, before the training step is captured into a CUDA graph, because the
// choice times kernels (cudnnFind*), synchronises and may grow the shared workspace, none of
// which a capture allows. Later calls with a known shape only enqueue work.
//
// The first convolution has C = 1. cuDNN's NHWC f16 Tensor Core kernels want C to be a
// multiple of 8. We do not zero-pad the input to 8 channels: that would take 8x the input
// bytes, an extra kernel and buffer, and 8x this layer's multiply-adds (from 8 % of the
// model's to 40 %), 7 in 8 of them on zeros, for a layer that needs no input gradient and
// is bound by memory traffic, not arithmetic. Instead cuDNN picks what runs best for C = 1
// (Find times the candidates, Tensor Core kernels or not), and gpu_config() reports the
// algorithms and math modes it chose, so --verbose shows what actually ran.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda_check.h"
#include "kernels/cuda_raii.h"
#include "kernels/errors.h"
#include "kernels/gpu_context.h"
#include "kernels/launchers.h"
#include "layers/conv2d.h"
#include "layers/conv_options.h"

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

cudnnDataType_t cudnn_type(DType t) { return t == DType::kF16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT; }

// The math mode the descriptors start with: f16 -> Tensor Cores; f32 -> cuDNN's default
// (which may use TF32), or plain FMA when the tests ask for bit-honest FP32.
cudnnMathType_t requested_math(DType dtype) {
  if (dtype == DType::kF16) return CUDNN_TENSOR_OP_MATH;
  return conv_options().fma_math_only ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
}

int as_int(std::int64_t v) { return static_cast<int>(v); }

std::string shape_text(std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c, DType dtype) {
  return std::string(dtype_name(dtype)) + " (" + std::to_string(n) + ", " + std::to_string(h) + ", " +
         std::to_string(w) + ", " + std::to_string(c) + ")";
}

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
};

}  // namespace

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
};

struct ConvGpuState {
  DType dtype = DType::kF32;
  FilterDesc w;  // (K, C, k, k) in NHWC order, i.e. memory (K, k, k, C): the layer's OHWI kernel
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, DType>, ConvPlan> plans;  // (N, H, W, dtype)
  const ConvPlan* last_forward = nullptr;
  const ConvPlan* last_backward = nullptr;
  Tensor dz;  // dy masked by ReLU: the layer's own buffer (dy belongs to the next layer)
};

namespace {

void destroy_state(ConvGpuState* s) { delete s; }

ConvDesc make_conv(DType dtype) {
  ConvDesc d = make_conv_desc();
  // pad 0, stride 1, dilation 1 ("valid"); cross-correlation is what Keras (and the CPU
  // path) call convolution. Accumulation in f32 for both storage types.
  MF_GPU_CHECK(cudnnSetConvolution2dDescriptor(d.get(), 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  MF_GPU_CHECK(cudnnSetConvolutionMathType(d.get(), requested_math(dtype)));
  return d;
}

// The workspace the algorithm search may use: the limit or, when the device cannot give
// that much (under --gpu-memory-limit), the size it had before, which the algorithms other
// layers already chose need (a failed growth may have released it, so it is asked for again).
std::pair<void*, std::size_t> search_workspace(GpuContext& ctx) {
  const std::size_t limit = conv_options().workspace_limit, before = ctx.workspace_size();
  try {
    return {ctx.workspace(limit), limit};
  } catch (const OutOfMemoryError&) {
    return {ctx.workspace(before), before};
  }
}

// Chooses from cuDNN's candidate list (sorted fastest first, by timing or by the
// heuristics' estimate) the first that succeeded, fits the workspace limit, is
// deterministic when conv_options().deterministic asks for that and, when FP32
// must stay FMA-only, was measured with FMA math. If no candidate reports FMA math, the
// candidates are tried again forced to FMA. Each is set on the descriptor `conv` with the
// math it will run in and asked its workspace size (`workspace_size(algo, &bytes)`): a
// combination cuDNN cannot run fails there and the next candidate is tried, as is one
// whose workspace the device cannot give. Returns false when none is left (or rethrows the
// out-of-memory error, when that is why).
template <class Perf, class Choice, class SizeFn>
bool choose(const std::vector<Perf>& perf, int count, bool fma_only, cudnnConvolutionDescriptor_t conv,
            SizeFn workspace_size, Choice& choice, GpuContext& ctx) {
  const std::size_t limit = conv_options().workspace_limit;
  const bool deterministic = conv_options().deterministic;
  std::exception_ptr out_of_memory;
  for (int pass = 0; pass < (fma_only ? 2 : 1); ++pass)
    for (int i = 0; i < count; ++i) {
      const Perf& p = perf[static_cast<std::size_t>(i)];
      if (p.status != CUDNN_STATUS_SUCCESS || p.memory > limit) continue;
      if (fma_only && (pass == 0) != (p.mathType == CUDNN_FMA_MATH)) continue;
      if (deterministic && p.determinism != CUDNN_DETERMINISTIC) {
        if (choice.nondeterministic_ms < 0.f) choice.nondeterministic_ms = p.time;
        continue;
      }
      const cudnnMathType_t math = fma_only ? CUDNN_FMA_MATH : p.mathType;
      MF_GPU_CHECK(cudnnSetConvolutionMathType(conv, math));
      std::size_t bytes = 0;
      if (workspace_size(p.algo, &bytes) != CUDNN_STATUS_SUCCESS || bytes > limit) continue;
      // Reserved now, outside any graph capture (growing the workspace synchronises). Under
      // a memory limit it may not fit: then a candidate that needs less is tried.
      if (bytes) {
        try {
          ctx.workspace(bytes);
        } catch (const OutOfMemoryError&) {
          if (!out_of_memory) out_of_memory = std::current_exception();
          continue;
        }
      }
      choice.algo = p.algo;
      choice.math = math;
      choice.workspace = bytes;
      choice.ms = p.time;
      choice.chosen = true;
      return true;
    }
  if (out_of_memory) std::rethrow_exception(out_of_memory);  // the real reason none was chosen
  return false;
}

[[noreturn]] void no_algorithm(const char* direction, const std::string& shape) {
  throw GpuError("cuDNN offers no " + std::string(direction) + (conv_options().deterministic ? " deterministic" : "") +
                     " algorithm it can run for Conv2D input " + shape + " within the workspace limit of " +
                     format_bytes(conv_options().workspace_limit) + " (--workspace-mb)",
                 "choosing a convolution algorithm", "conv2d_gpu.cu");
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

}  // namespace

Conv2D::~Conv2D() = default;

void Conv2D::to(Device device) {
  Layer::to(device);
  gpu_.reset();  // descriptors and choices are per device; made again on first use
}

void Conv2D::set_compute_dtype(DType dtype) {
  Layer::set_compute_dtype(dtype);
  gpu_.reset();  // the choices depend on the data type
}

std::string Conv2D::gpu_config() const {
  if (device_ != Device::kGpu) return "";
  const ConvPlan* p = gpu_ ? (gpu_->last_backward ? gpu_->last_backward : gpu_->last_forward) : nullptr;
  if (!p) return "cuDNN, algorithms not chosen yet (no input seen)";
  std::string s = "cuDNN NHWC " + std::string(dtype_name(compute_dtype_)) + ": fwd " +
                  fwd_algo_name(p->fwd.algo) + " (" + math_name(p->fwd.math) + ")" + determinism_cost(p->fwd, p->timed);
  if (p->bwd_data.chosen)
    s += ", bwd-data " + std::string(bwd_data_algo_name(p->bwd_data.algo)) + " (" + math_name(p->bwd_data.math) + ")" +
         determinism_cost(p->bwd_data, p->timed);
  if (p->bwd_filter.chosen)
    s += ", bwd-filter " + std::string(bwd_filter_algo_name(p->bwd_filter.algo)) + " (" +
         math_name(p->bwd_filter.math) + ")" + determinism_cost(p->bwd_filter, p->timed);
  const std::size_t ws = std::max({p->fwd.workspace, p->bwd_data.workspace, p->bwd_filter.workspace});
  s += "; workspace " + format_bytes(ws) + "; " + (p->timed ? "timed" : "heuristic") +
       (p->deterministic ? ", deterministic" : "") + " for batch " +
       std::to_string(p->n);
  if (gpu_->plans.size() > 1) s += " (+" + std::to_string(gpu_->plans.size() - 1) + " other shapes)";
  return s;
}

void Conv2D::forward_gpu(const Tensor& x, Tensor& y) {
  GpuContext& ctx = GpuContext::current();
  const DType dtype = x.dtype();
  const bool half = dtype == DType::kF16;
  if (!gpu_ || gpu_->dtype != dtype) {
    gpu_ = decltype(gpu_)(new ConvGpuState, &destroy_state);
    gpu_->dtype = dtype;
    gpu_->w = make_filter_desc();
    MF_GPU_CHECK(cudnnSetFilter4dDescriptor(gpu_->w.get(), cudnn_type(dtype), CUDNN_TENSOR_NHWC, as_int(filters_),
                                            as_int(in_channels_), as_int(k_), as_int(k_)));
  }
  ConvGpuState& st = *gpu_;
  const std::int64_t n = x.dim(0), h = x.dim(1), w = x.dim(2);
  const void* weight = half ? weight_.half.raw() : weight_.value.raw();
  const void* bias = half ? bias_.half.raw() : bias_.value.raw();
  const auto key = std::make_tuple(n, h, w, dtype);
  auto it = st.plans.find(key);
  if (it == st.plans.end()) {
    if (ctx.capturing())
      throw std::logic_error("Conv2D: new input shape " + x.shape().str() +
                             " met during CUDA graph capture; run one eager step of this shape first");
    ConvPlan p;
    p.n = n, p.h = h, p.w = w;
    p.x = make_tensor_desc();
    p.y = make_tensor_desc();
    MF_GPU_CHECK(cudnnSetTensor4dDescriptor(p.x.get(), CUDNN_TENSOR_NHWC, cudnn_type(dtype), as_int(n),
                                            as_int(in_channels_), as_int(h), as_int(w)));
    MF_GPU_CHECK(cudnnSetTensor4dDescriptor(p.y.get(), CUDNN_TENSOR_NHWC, cudnn_type(dtype), as_int(n),
                                            as_int(filters_), as_int(y.dim(1)), as_int(y.dim(2))));
    p.fwd_conv = make_conv(dtype);
    p.bwd_data_conv = make_conv(dtype);
    p.bwd_filter_conv = make_conv(dtype);
    p.timed = conv_options().find;
    p.deterministic = conv_options().deterministic;
    it = st.plans.emplace(key, std::move(p)).first;
  }
  ConvPlan& p = it->second;
  cudnnHandle_t handle = ctx.cudnn();

  if (!p.fwd.chosen) {
    const bool fma_only = !half && conv_options().fma_math_only;
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
    int count = 0;
    if (p.timed) {
      // Times every candidate on the real buffers: x and w are only read, y is written
      // and then overwritten by the real forward below.
      const auto [ws, ws_bytes] = search_workspace(ctx);
      MF_GPU_CHECK(cudnnFindConvolutionForwardAlgorithmEx(handle, p.x.get(), x.raw(), st.w.get(), weight,
                                                          p.fwd_conv.get(), p.y.get(), y.raw(),
                                                          static_cast<int>(perf.size()), &count, perf.data(), ws,
                                                          ws_bytes));
    } else {
      MF_GPU_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, p.x.get(), st.w.get(), p.fwd_conv.get(), p.y.get(),
                                                          static_cast<int>(perf.size()), &count, perf.data()));
    }
    const auto size = [&](cudnnConvolutionFwdAlgo_t algo, std::size_t* bytes) {
      return cudnnGetConvolutionForwardWorkspaceSize(handle, p.x.get(), st.w.get(), p.fwd_conv.get(), p.y.get(), algo,
                                                     bytes);
    };
    if (!choose(perf, count, fma_only, p.fwd_conv.get(), size, p.fwd, ctx))
      no_algorithm("forward", shape_text(n, h, w, in_channels_, dtype));
  }
  st.last_forward = &p;

  const float one = 1.0f, zero = 0.0f;  // alpha, beta: f32 for f16 data too (f32 compute type)
  void* ws = p.fwd.workspace ? ctx.workspace(p.fwd.workspace) : nullptr;
  MF_GPU_CHECK(cudnnConvolutionForward(handle, &one, p.x.get(), x.raw(), st.w.get(), weight, p.fwd_conv.get(),
                                       p.fwd.algo, ws, p.fwd.workspace, &zero, p.y.get(), y.raw()));
  launch_bias_act_forward(y.raw(), bias, half, y.numel(), filters_, act_ == Activation::kRelu, ctx.stream());
}

void Conv2D::backward_gpu(const Tensor& dy, Tensor& dx) {
  GpuContext& ctx = GpuContext::current();
  const DType dtype = x_.dtype();
  const bool half = dtype == DType::kF16;
  if (!gpu_) throw std::logic_error("Conv2D: GPU backward without a GPU forward");
  ConvGpuState& st = *gpu_;
  const std::int64_t n = x_.dim(0), h = x_.dim(1), w = x_.dim(2);
  auto it = st.plans.find(std::make_tuple(n, h, w, dtype));
  if (it == st.plans.end()) throw std::logic_error("Conv2D: GPU backward for a shape never run forward");
  ConvPlan& p = it->second;
  cudnnHandle_t handle = ctx.cudnn();
  cudaStream_t stream = ctx.stream();
  const void* weight = half ? weight_.half.raw() : weight_.value.raw();

  // dz = dy masked where the output was not positive (ReLU), and db += sum of dz over
  // every output pixel (accumulated, like every parameter gradient).
  ensure(st.dz, dy.shape(), dtype, Device::kGpu);
  const std::int64_t rows = dy.dim(0) * dy.dim(1) * dy.dim(2);
  launch_bias_act_backward(y_.raw(), dy.raw(), st.dz.raw(), bias_.grad.raw(), ctx.reduction_scratch(), half, rows,
                           filters_,
                           act_ == Activation::kRelu, stream);

  const bool fma_only = !half && conv_options().fma_math_only;
  const bool need_filter = !p.bwd_filter.chosen, need_data = dx.defined() && !p.bwd_data.chosen;
  if ((need_filter || need_data) && ctx.capturing())
    throw std::logic_error("Conv2D: backward algorithms for " + x_.shape().str() +
                           " chosen during CUDA graph capture; run one eager step of this shape first");
  if (need_filter) {
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
    int count = 0;
    if (p.timed) {
      // The candidates write their result: into a scratch gradient, never into
      // weight_.grad, which holds what this step has accumulated so far.
      Tensor scratch = Tensor::empty(weight_.value.shape(), dtype, Device::kGpu);
      const auto [ws, ws_bytes] = search_workspace(ctx);
      MF_GPU_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
          handle, p.x.get(), x_.raw(), p.y.get(), st.dz.raw(), p.bwd_filter_conv.get(), st.w.get(), scratch.raw(),
          static_cast<int>(perf.size()), &count, perf.data(), ws, ws_bytes));
      // Find has synchronised: the scratch can go back to the allocator.
    } else {
      MF_GPU_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, p.x.get(), p.y.get(),
                                                                 p.bwd_filter_conv.get(), st.w.get(),
                                                                 static_cast<int>(perf.size()), &count, perf.data()));
    }
    const auto size = [&](cudnnConvolutionBwdFilterAlgo_t algo, std::size_t* bytes) {
      return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, p.x.get(), p.y.get(), p.bwd_filter_conv.get(),
                                                            st.w.get(), algo, bytes);
    };
    if (!choose(perf, count, fma_only, p.bwd_filter_conv.get(), size, p.bwd_filter, ctx))
      no_algorithm("backward-filter", shape_text(n, h, w, in_channels_, dtype));
  }
  if (need_data) {
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
    int count = 0;
    if (p.timed) {
      // dx is written by the candidates, then overwritten by the real call below.
      const auto [ws, ws_bytes] = search_workspace(ctx);
      MF_GPU_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
          handle, st.w.get(), weight, p.y.get(), st.dz.raw(), p.bwd_data_conv.get(), p.x.get(), dx.raw(),
          static_cast<int>(perf.size()), &count, perf.data(), ws, ws_bytes));
    } else {
      MF_GPU_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, st.w.get(), p.y.get(), p.bwd_data_conv.get(),
                                                               p.x.get(), static_cast<int>(perf.size()), &count,
                                                               perf.data()));
    }
    const auto size = [&](cudnnConvolutionBwdDataAlgo_t algo, std::size_t* bytes) {
      return cudnnGetConvolutionBackwardDataWorkspaceSize(handle, st.w.get(), p.y.get(), p.bwd_data_conv.get(),
                                                          p.x.get(), algo, bytes);
    };
    if (!choose(perf, count, fma_only, p.bwd_data_conv.get(), size, p.bwd_data, ctx))
      no_algorithm("backward-data", shape_text(n, h, w, in_channels_, dtype));
  }
  st.last_backward = &p;

  const float one = 1.0f, zero = 0.0f;
  // dW += conv_filter(x, dz): beta = 1 accumulates into the gradient (the optimizer zeroes it).
  void* ws = p.bwd_filter.workspace ? ctx.workspace(p.bwd_filter.workspace) : nullptr;
  MF_GPU_CHECK(cudnnConvolutionBackwardFilter(handle, &one, p.x.get(), x_.raw(), p.y.get(), st.dz.raw(),
                                              p.bwd_filter_conv.get(), p.bwd_filter.algo, ws, p.bwd_filter.workspace,
                                              &one, st.w.get(), weight_.grad.raw()));
  if (!dx.defined()) return;  // the first layer: nothing upstream needs dx
  // dx = conv_data(W, dz): beta = 0 overwrites.
  ws = p.bwd_data.workspace ? ctx.workspace(p.bwd_data.workspace) : nullptr;
  MF_GPU_CHECK(cudnnConvolutionBackwardData(handle, &one, st.w.get(), weight, p.y.get(), st.dz.raw(),
                                            p.bwd_data_conv.get(), p.bwd_data.algo, ws, p.bwd_data.workspace, &zero,
                                            p.x.get(), dx.raw()));
}

}  // namespace mf
