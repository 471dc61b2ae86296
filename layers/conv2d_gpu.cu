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
//
// Should cuDNN offer no f16 algorithm at all for a direction of a layer (its documentation
// promises Tensor Cores only for channel counts that are multiples of 8 and does not say
// what else it offers for C = 1), that direction runs in f32 instead: the f16 operands are
// cast to f32 copies, the convolution uses the f32 master weights, and the result is cast
// back (or, for the filter gradient, added into the f16 gradient). One line on stderr says
// so for the layer, and gpu_config() marks the direction "[f32: no f16 algorithm]".
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
  // An f16 layer's direction for which cuDNN offered no f16 algorithm: it runs in f32 on
  // copies of its operands (see ConvPlan).
  bool f32 = false;
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
  // The f32 fallback of an f16 layer: descriptors and f32 copies of x, y, dz and dx for the
  // directions cuDNN has no f16 algorithm for (cast in and out around the convolution; the
  // bias, ReLU and the other layers stay f16). Per shape, so that a CUDA graph captured for
  // one shape keeps its buffers when another shape runs.
  bool has_f32 = false;
  TensorDesc x32d, y32d;
  Tensor x32, y32, dz32, dx32;
};

struct ConvGpuState {
  DType dtype = DType::kF32;
  FilterDesc w;  // (K, C, k, k) in NHWC order, i.e. memory (K, k, k, C): the layer's OHWI kernel
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, DType>, ConvPlan> plans;  // (N, H, W, dtype)
  const ConvPlan* last_forward = nullptr;
  const ConvPlan* last_backward = nullptr;
  Tensor dz;  // dy masked by ReLU: the layer's own buffer (dy belongs to the next layer)
  FilterDesc w32;     // the f32 fallback's filter descriptor (the master weights), and
  Tensor dw32;        // its filter gradient, added into the f16 gradient
  bool noted_f32 = false;  // the one line saying that this layer falls back has been printed
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

// Makes plan `p` of an f16 layer ready to run a direction in f32: f32 descriptors of x
// (N, H, W, C), y (N, P, Q, K) and the filter, f32 buffers for the copies, and prints the
// one line per layer saying that this happens. Shapes in NHWC order.
void prepare_f32(ConvGpuState& st, ConvPlan& p, const std::string& layer, const char* direction,
                 std::int64_t c, std::int64_t k, std::int64_t r, std::int64_t out_h, std::int64_t out_w) {
  if (!p.has_f32) {
    p.x32d = make_tensor_desc();
    p.y32d = make_tensor_desc();
    MF_GPU_CHECK(cudnnSetTensor4dDescriptor(p.x32d.get(), CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, as_int(p.n), as_int(c),
                                            as_int(p.h), as_int(p.w)));
    MF_GPU_CHECK(cudnnSetTensor4dDescriptor(p.y32d.get(), CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, as_int(p.n), as_int(k),
                                            as_int(out_h), as_int(out_w)));
    ensure(p.x32, Shape{p.n, p.h, p.w, c}, DType::kF32, Device::kGpu);
    ensure(p.y32, Shape{p.n, out_h, out_w, k}, DType::kF32, Device::kGpu);
    ensure(p.dz32, Shape{p.n, out_h, out_w, k}, DType::kF32, Device::kGpu);
    p.has_f32 = true;
  }
  if (!st.w32) {
    st.w32 = make_filter_desc();
    MF_GPU_CHECK(cudnnSetFilter4dDescriptor(st.w32.get(), CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, as_int(k), as_int(c),
                                            as_int(r), as_int(r)));
    ensure(st.dw32, Shape{k, r, r, c}, DType::kF32, Device::kGpu);
  }
  if (!st.noted_f32) {
    std::fprintf(stderr,
                 "microflow: note: cuDNN offers no f16 %s algorithm for %s, input %s: that layer's convolutions "
                 "without one run in f32 (--verbose lists them); the rest of the model stays f16\n",
                 direction, layer.c_str(), shape_text(p.n, p.h, p.w, c, DType::kF16).c_str());
    st.noted_f32 = true;
  }
}

// The copies around an f32 fallback: f16 -> f32 and back.
void to_f32(const Tensor& from, Tensor& to, cudaStream_t s) {
  launch_cast_f16_to_f32(from.data<Half>(), to.data<float>(), from.numel(), s);
}

// " (f32: no f16 algorithm)" after a direction that fell back.
template <class Algo>
const char* fallback_text(const Choice<Algo>& c) {
  return c.f32 ? " [f32: no f16 algorithm]" : "";
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

  cudaStream_t stream = ctx.stream();
  if (!p.fwd.chosen) {
    // The candidates for the layer's type or, with f32 = true, for its f32 fallback.
    const auto pick = [&](bool f32) {
      const bool fma_only = (f32 || !half) && conv_options().fma_math_only;
      cudnnTensorDescriptor_t xd = f32 ? p.x32d.get() : p.x.get(), yd = f32 ? p.y32d.get() : p.y.get();
      cudnnFilterDescriptor_t wd = f32 ? st.w32.get() : st.w.get();
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
      int count = 0;
      if (p.timed) {
        // Times every candidate on the real buffers: x and w are only read, y is written
        // and then overwritten by the real forward below.
        const auto [ws, ws_bytes] = search_workspace(ctx);
        MF_GPU_CHECK(cudnnFindConvolutionForwardAlgorithmEx(
            handle, xd, f32 ? p.x32.raw() : x.raw(), wd, f32 ? weight_.value.raw() : weight, p.fwd_conv.get(), yd,
            f32 ? p.y32.raw() : y.raw(), static_cast<int>(perf.size()), &count, perf.data(), ws, ws_bytes));
      } else {
        MF_GPU_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, xd, wd, p.fwd_conv.get(), yd,
                                                            static_cast<int>(perf.size()), &count, perf.data()));
      }
      const auto size = [&](cudnnConvolutionFwdAlgo_t algo, std::size_t* bytes) {
        return cudnnGetConvolutionForwardWorkspaceSize(handle, xd, wd, p.fwd_conv.get(), yd, algo, bytes);
      };
      return choose(perf, count, fma_only, p.fwd_conv.get(), size, p.fwd, ctx);
    };
    if (!pick(false)) {
      if (!half) no_algorithm("forward", shape_text(n, h, w, in_channels_, dtype));
      prepare_f32(st, p, label(), "forward", in_channels_, filters_, k_, y.dim(1), y.dim(2));
      to_f32(x, p.x32, stream);  // what Find times on
      p.fwd = {};
      MF_GPU_CHECK(cudnnSetConvolutionMathType(p.fwd_conv.get(), requested_math(DType::kF32)));
      if (!pick(true)) no_algorithm("forward", shape_text(n, h, w, in_channels_, dtype) + " (in f16 or f32)");
      p.fwd.f32 = true;
    }
  }
  st.last_forward = &p;

  const float one = 1.0f, zero = 0.0f;  // alpha, beta: f32 for f16 data too (f32 compute type)
  void* ws = p.fwd.workspace ? ctx.workspace(p.fwd.workspace) : nullptr;
  if (p.fwd.f32) {
    // f16 in, f32 convolution on the master weights, f16 out.
    to_f32(x, p.x32, stream);
    MF_GPU_CHECK(cudnnConvolutionForward(handle, &one, p.x32d.get(), p.x32.raw(), st.w32.get(), weight_.value.raw(),
                                         p.fwd_conv.get(), p.fwd.algo, ws, p.fwd.workspace, &zero, p.y32d.get(),
                                         p.y32.raw()));
    launch_cast_f32_to_f16(p.y32.data<float>(), y.data<Half>(), y.numel(), stream);
  } else {
    MF_GPU_CHECK(cudnnConvolutionForward(handle, &one, p.x.get(), x.raw(), st.w.get(), weight, p.fwd_conv.get(),
                                         p.fwd.algo, ws, p.fwd.workspace, &zero, p.y.get(), y.raw()));
  }
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

  const bool need_filter = !p.bwd_filter.chosen, need_data = dx.defined() && !p.bwd_data.chosen;
  if ((need_filter || need_data) && ctx.capturing())
    throw std::logic_error("Conv2D: backward algorithms for " + x_.shape().str() +
                           " chosen during CUDA graph capture; run one eager step of this shape first");
  const std::int64_t out_h = dy.dim(1), out_w = dy.dim(2);
  // Each direction as forward_gpu does it: the layer's type first, then, for an f16 layer
  // cuDNN has no f16 algorithm for, its f32 fallback (on f32 copies of x and dz).
  const auto fall_back = [&](const char* direction) {
    prepare_f32(st, p, label(), direction, in_channels_, filters_, k_, out_h, out_w);
    to_f32(x_, p.x32, stream);
    to_f32(st.dz, p.dz32, stream);
  };
  if (need_filter) {
    const auto pick = [&](bool f32) {
      const bool fma_only = (f32 || !half) && conv_options().fma_math_only;
      cudnnTensorDescriptor_t xd = f32 ? p.x32d.get() : p.x.get(), dyd = f32 ? p.y32d.get() : p.y.get();
      cudnnFilterDescriptor_t wd = f32 ? st.w32.get() : st.w.get();
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
      int count = 0;
      if (p.timed) {
        // The candidates write their result: into a scratch gradient, never into
        // weight_.grad, which holds what this step has accumulated so far.
        Tensor scratch = Tensor::empty(weight_.value.shape(), f32 ? DType::kF32 : dtype, Device::kGpu);
        const auto [ws, ws_bytes] = search_workspace(ctx);
        MF_GPU_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
            handle, xd, f32 ? p.x32.raw() : x_.raw(), dyd, f32 ? p.dz32.raw() : st.dz.raw(), p.bwd_filter_conv.get(),
            wd, scratch.raw(), static_cast<int>(perf.size()), &count, perf.data(), ws, ws_bytes));
        // Find has synchronised: the scratch can go back to the allocator.
      } else {
        MF_GPU_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, xd, dyd, p.bwd_filter_conv.get(), wd,
                                                                   static_cast<int>(perf.size()), &count,
                                                                   perf.data()));
      }
      const auto size = [&](cudnnConvolutionBwdFilterAlgo_t algo, std::size_t* bytes) {
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, xd, dyd, p.bwd_filter_conv.get(), wd, algo,
                                                              bytes);
      };
      return choose(perf, count, fma_only, p.bwd_filter_conv.get(), size, p.bwd_filter, ctx);
    };
    if (!pick(false)) {
      if (!half) no_algorithm("backward-filter", shape_text(n, h, w, in_channels_, dtype));
      fall_back("backward-filter");
      p.bwd_filter = {};
      MF_GPU_CHECK(cudnnSetConvolutionMathType(p.bwd_filter_conv.get(), requested_math(DType::kF32)));
      if (!pick(true))
        no_algorithm("backward-filter", shape_text(n, h, w, in_channels_, dtype) + " (in f16 or f32)");
      p.bwd_filter.f32 = true;
    }
  }
  if (need_data) {
    const auto pick = [&](bool f32) {
      const bool fma_only = (f32 || !half) && conv_options().fma_math_only;
      cudnnTensorDescriptor_t dxd = f32 ? p.x32d.get() : p.x.get(), dyd = f32 ? p.y32d.get() : p.y.get();
      cudnnFilterDescriptor_t wd = f32 ? st.w32.get() : st.w.get();
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
      int count = 0;
      if (p.timed) {
        // dx (or its f32 copy) is written by the candidates, then overwritten below.
        if (f32) ensure(p.dx32, p.x32.shape(), DType::kF32, Device::kGpu);
        const auto [ws, ws_bytes] = search_workspace(ctx);
        MF_GPU_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
            handle, wd, f32 ? weight_.value.raw() : weight, dyd, f32 ? p.dz32.raw() : st.dz.raw(),
            p.bwd_data_conv.get(), dxd, f32 ? p.dx32.raw() : dx.raw(), static_cast<int>(perf.size()), &count,
            perf.data(), ws, ws_bytes));
      } else {
        MF_GPU_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, wd, dyd, p.bwd_data_conv.get(), dxd,
                                                                 static_cast<int>(perf.size()), &count, perf.data()));
      }
      const auto size = [&](cudnnConvolutionBwdDataAlgo_t algo, std::size_t* bytes) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(handle, wd, dyd, p.bwd_data_conv.get(), dxd, algo, bytes);
      };
      return choose(perf, count, fma_only, p.bwd_data_conv.get(), size, p.bwd_data, ctx);
    };
    if (!pick(false)) {
      if (!half) no_algorithm("backward-data", shape_text(n, h, w, in_channels_, dtype));
      fall_back("backward-data");
      p.bwd_data = {};
      MF_GPU_CHECK(cudnnSetConvolutionMathType(p.bwd_data_conv.get(), requested_math(DType::kF32)));
      if (!pick(true)) no_algorithm("backward-data", shape_text(n, h, w, in_channels_, dtype) + " (in f16 or f32)");
      p.bwd_data.f32 = true;
    }
  }
  st.last_backward = &p;

  const float one = 1.0f, zero = 0.0f;
  const bool data_f32 = dx.defined() && p.bwd_data.f32;
  if (p.bwd_filter.f32 || data_f32) to_f32(st.dz, p.dz32, stream);
  // dW += conv_filter(x, dz): beta = 1 accumulates into the gradient (the optimizer zeroes it).
  // In f32 the result goes to a buffer of its own first (beta = 0), then is added in.
  void* ws = p.bwd_filter.workspace ? ctx.workspace(p.bwd_filter.workspace) : nullptr;
  if (p.bwd_filter.f32) {
    to_f32(x_, p.x32, stream);
    MF_GPU_CHECK(cudnnConvolutionBackwardFilter(handle, &one, p.x32d.get(), p.x32.raw(), p.y32d.get(), p.dz32.raw(),
                                                p.bwd_filter_conv.get(), p.bwd_filter.algo, ws,
                                                p.bwd_filter.workspace, &zero, st.w32.get(), st.dw32.raw()));
    launch_add_f32_to_f16(st.dw32.data<float>(), weight_.grad.data<Half>(), st.dw32.numel(), stream);
  } else {
    MF_GPU_CHECK(cudnnConvolutionBackwardFilter(handle, &one, p.x.get(), x_.raw(), p.y.get(), st.dz.raw(),
                                                p.bwd_filter_conv.get(), p.bwd_filter.algo, ws,
                                                p.bwd_filter.workspace, &one, st.w.get(), weight_.grad.raw()));
  }
  if (!dx.defined()) return;  // the first layer: nothing upstream needs dx
  // dx = conv_data(W, dz): beta = 0 overwrites.
  ws = p.bwd_data.workspace ? ctx.workspace(p.bwd_data.workspace) : nullptr;
  if (data_f32) {
    ensure(p.dx32, p.x32.shape(), DType::kF32, Device::kGpu);
    MF_GPU_CHECK(cudnnConvolutionBackwardData(handle, &one, st.w32.get(), weight_.value.raw(), p.y32d.get(),
                                              p.dz32.raw(), p.bwd_data_conv.get(), p.bwd_data.algo, ws,
                                              p.bwd_data.workspace, &zero, p.x32d.get(), p.dx32.raw()));
    launch_cast_f32_to_f16(p.dx32.data<float>(), dx.data<Half>(), dx.numel(), stream);
  } else {
    MF_GPU_CHECK(cudnnConvolutionBackwardData(handle, &one, st.w.get(), weight, p.y.get(), st.dz.raw(),
                                              p.bwd_data_conv.get(), p.bwd_data.algo, ws, p.bwd_data.workspace,
                                              &zero, p.x.get(), dx.raw()));
  }
}

}  // namespace mf
