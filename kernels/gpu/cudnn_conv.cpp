// cudnn_conv.cpp: cuDNN's descriptors, the choice of algorithms and the calls, for one
// convolution layer (cudnn_conv.h says when and why).
#include "kernels/gpu/cudnn_conv.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/gpu/launchers.h"
#include "runtime/cuda_check.h"
#include "runtime/errors.h"
#include "runtime/gpu_context.h"

namespace mf {

namespace {

cudnnDataType_t cudnn_type(DType t) { return t == DType::kF16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT; }

// The math mode the descriptors start with: f16 -> Tensor Cores; f32 -> cuDNN's default
// (which may use TF32), or plain FMA when the tests ask for bit-honest FP32.
cudnnMathType_t requested_math(DType dtype, const KernelOptions& o) {
  if (dtype == DType::kF16) return CUDNN_TENSOR_OP_MATH;
  return o.fma_math_only ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
}

int as_int(std::int64_t v) { return static_cast<int>(v); }

std::string shape_text(std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c, DType dtype) {
  return std::string(dtype_name(dtype)) + " (" + std::to_string(n) + ", " + std::to_string(h) + ", " +
         std::to_string(w) + ", " + std::to_string(c) + ")";
}

ConvDesc make_conv(DType dtype, const KernelOptions& o) {
  ConvDesc d = make_conv_desc();
  // pad 0, stride 1, dilation 1 ("valid"); cross-correlation is what Keras (and the CPU
  // path) call convolution. Accumulation in f32 for both storage types.
  MF_GPU_CHECK(cudnnSetConvolution2dDescriptor(d.get(), 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  MF_GPU_CHECK(cudnnSetConvolutionMathType(d.get(), requested_math(dtype, o)));
  return d;
}

// The workspace the algorithm search may use: the limit or, when the device cannot give
// that much (under --gpu-memory-limit), the size it had before, which the algorithms other
// layers already chose need (a failed growth may have released it, so it is asked for again).
std::pair<void*, std::size_t> search_workspace(GpuContext& ctx, const KernelOptions& o) {
  const std::size_t limit = o.workspace_limit, before = ctx.workspace_size();
  try {
    return {ctx.workspace(limit), limit};
  } catch (const OutOfMemoryError&) {
    return {ctx.workspace(before), before};
  }
}

// Chooses from cuDNN's candidate list (sorted fastest first, by timing or by the
// heuristics' estimate) the first that succeeded, fits the workspace limit, is
// deterministic when o.deterministic asks for that and, when FP32
// must stay FMA-only, was measured with FMA math. If no candidate reports FMA math, the
// candidates are tried again forced to FMA. Each is set on the descriptor `conv` with the
// math it will run in and asked its workspace size (`workspace_size(algo, &bytes)`): a
// combination cuDNN cannot run fails there and the next candidate is tried, as is one
// whose workspace the device cannot give. Returns false when none is left (or rethrows the
// out-of-memory error, when that is why).
template <class Perf, class Choice, class SizeFn>
bool choose(const std::vector<Perf>& perf, int count, bool fma_only, cudnnConvolutionDescriptor_t conv,
            SizeFn workspace_size, Choice& choice, GpuContext& ctx, const KernelOptions& o) {
  const std::size_t limit = o.workspace_limit;
  const bool deterministic = o.deterministic;
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

[[noreturn]] void no_algorithm(const char* direction, const std::string& shape, const KernelOptions& o) {
  throw GpuError("cuDNN offers no " + std::string(direction) + (o.deterministic ? " deterministic" : "") +
                     " algorithm it can run for Conv2D input " + shape + " within the workspace limit of " +
                     format_bytes(o.workspace_limit) + " (--workspace-mb)",
                 "choosing a convolution algorithm", "cudnn_conv.cpp");
}

// Makes plan `p` of an f16 layer ready to run a direction in f32: f32 descriptors of x
// (N, H, W, C), y (N, P, Q, K) and the filter, f32 buffers for the copies, and prints the
// one line per layer saying that this happens. Shapes in NHWC order.
void prepare_f32(ConvGpuState& st, ConvPlan& p, const char* direction, std::int64_t out_h, std::int64_t out_w) {
  const std::int64_t c = st.c, k = st.k, r = st.r;
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
                 direction, st.layer.c_str(), shape_text(p.n, p.h, p.w, c, DType::kF16).c_str());
    st.noted_f32 = true;
  }
}

// The copies around an f32 fallback: f16 -> f32 and back.
void to_f32(const Tensor& from, Tensor& to, cudaStream_t s) {
  launch_cast_f16_to_f32(from.data<Half>(), to.data<float>(), from.numel(), s);
}

}  // namespace

ConvGpuState::ConvGpuState(DType dtype_, std::int64_t c_, std::int64_t k_, std::int64_t r_, std::string layer_)
    : dtype(dtype_), c(c_), k(k_), r(r_), layer(std::move(layer_)), w(make_filter_desc()) {
  MF_GPU_CHECK(cudnnSetFilter4dDescriptor(w.get(), cudnn_type(dtype), CUDNN_TENSOR_NHWC, as_int(k), as_int(c),
                                          as_int(r), as_int(r)));
}

ConvPlan& conv_plan(ConvGpuState& st, const Tensor& x, const Tensor& y, const KernelOptions& o) {
  const DType dtype = x.dtype();
  const std::int64_t n = x.dim(0), h = x.dim(1), w = x.dim(2);
  const auto key = std::make_tuple(n, h, w, dtype);
  auto it = st.plans.find(key);
  if (it != st.plans.end()) return it->second;
  if (GpuContext::current().capturing())
    throw std::logic_error("Conv2D: new input shape " + x.shape().str() +
                           " met during CUDA graph capture; run one eager step of this shape first");
  ConvPlan p;
  p.n = n, p.h = h, p.w = w;
  p.x = make_tensor_desc();
  p.y = make_tensor_desc();
  MF_GPU_CHECK(cudnnSetTensor4dDescriptor(p.x.get(), CUDNN_TENSOR_NHWC, cudnn_type(dtype), as_int(n), as_int(st.c),
                                          as_int(h), as_int(w)));
  MF_GPU_CHECK(cudnnSetTensor4dDescriptor(p.y.get(), CUDNN_TENSOR_NHWC, cudnn_type(dtype), as_int(n), as_int(st.k),
                                          as_int(y.dim(1)), as_int(y.dim(2))));
  p.fwd_conv = make_conv(dtype, o);
  p.bwd_data_conv = make_conv(dtype, o);
  p.bwd_filter_conv = make_conv(dtype, o);
  p.timed = o.find;
  p.deterministic = o.deterministic;
  return st.plans.emplace(key, std::move(p)).first->second;
}

void conv_forward(ConvGpuState& st, ConvPlan& p, const Tensor& x, const void* weight, const Tensor& master, Tensor& y,
                  const KernelOptions& o) {
  GpuContext& ctx = GpuContext::current();
  const DType dtype = x.dtype();
  const bool half = dtype == DType::kF16;
  cudnnHandle_t handle = ctx.cudnn();
  cudaStream_t stream = ctx.stream();
  if (!p.fwd.chosen) {
    // The candidates for the layer's type or, with f32 = true, for its f32 fallback.
    const auto pick = [&](bool f32) {
      const bool fma_only = (f32 || !half) && o.fma_math_only;
      cudnnTensorDescriptor_t xd = f32 ? p.x32d.get() : p.x.get(), yd = f32 ? p.y32d.get() : p.y.get();
      cudnnFilterDescriptor_t wd = f32 ? st.w32.get() : st.w.get();
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
      int count = 0;
      if (p.timed) {
        // Times every candidate on the real buffers: x and w are only read, y is written
        // and then overwritten by the real forward below.
        const auto [ws, ws_bytes] = search_workspace(ctx, o);
        MF_GPU_CHECK(cudnnFindConvolutionForwardAlgorithmEx(
            handle, xd, f32 ? p.x32.raw() : x.raw(), wd, f32 ? master.raw() : weight, p.fwd_conv.get(), yd,
            f32 ? p.y32.raw() : y.raw(), static_cast<int>(perf.size()), &count, perf.data(), ws, ws_bytes));
      } else {
        MF_GPU_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, xd, wd, p.fwd_conv.get(), yd,
                                                            static_cast<int>(perf.size()), &count, perf.data()));
      }
      const auto size = [&](cudnnConvolutionFwdAlgo_t algo, std::size_t* bytes) {
        return cudnnGetConvolutionForwardWorkspaceSize(handle, xd, wd, p.fwd_conv.get(), yd, algo, bytes);
      };
      return choose(perf, count, fma_only, p.fwd_conv.get(), size, p.fwd, ctx, o);
    };
    const std::string shape = shape_text(p.n, p.h, p.w, st.c, dtype);
    if (!pick(false)) {
      if (!half) no_algorithm("forward", shape, o);
      prepare_f32(st, p, "forward", y.dim(1), y.dim(2));
      to_f32(x, p.x32, stream);  // what Find times on
      p.fwd = {};
      MF_GPU_CHECK(cudnnSetConvolutionMathType(p.fwd_conv.get(), requested_math(DType::kF32, o)));
      if (!pick(true)) no_algorithm("forward", shape + " (in f16 or f32)", o);
      p.fwd.f32 = true;
    }
  }
  st.last_forward = &p;

  const float one = 1.0f, zero = 0.0f;  // alpha, beta: f32 for f16 data too (f32 compute type)
  void* ws = p.fwd.workspace ? ctx.workspace(p.fwd.workspace) : nullptr;
  if (p.fwd.f32) {
    // f16 in, f32 convolution on the master weights, f16 out.
    to_f32(x, p.x32, stream);
    MF_GPU_CHECK(cudnnConvolutionForward(handle, &one, p.x32d.get(), p.x32.raw(), st.w32.get(), master.raw(),
                                         p.fwd_conv.get(), p.fwd.algo, ws, p.fwd.workspace, &zero, p.y32d.get(),
                                         p.y32.raw()));
    launch_cast_f32_to_f16(p.y32.data<float>(), y.data<Half>(), y.numel(), stream);
  } else {
    MF_GPU_CHECK(cudnnConvolutionForward(handle, &one, p.x.get(), x.raw(), st.w.get(), weight, p.fwd_conv.get(),
                                         p.fwd.algo, ws, p.fwd.workspace, &zero, p.y.get(), y.raw()));
  }
}

void conv_backward(ConvGpuState& st, ConvPlan& p, const Tensor& x, const void* weight, const Tensor& master,
                   Tensor& grad, Tensor& dx, const KernelOptions& o) {
  GpuContext& ctx = GpuContext::current();
  const DType dtype = x.dtype();
  const bool half = dtype == DType::kF16;
  cudnnHandle_t handle = ctx.cudnn();
  cudaStream_t stream = ctx.stream();
  const std::int64_t out_h = st.dz.dim(1), out_w = st.dz.dim(2);
  const bool need_filter = !p.bwd_filter.chosen, need_data = dx.defined() && !p.bwd_data.chosen;
  if ((need_filter || need_data) && ctx.capturing())
    throw std::logic_error("Conv2D: backward algorithms for " + x.shape().str() +
                           " chosen during CUDA graph capture; run one eager step of this shape first");
  // Each direction as conv_forward does it: the layer's type first, then, for an f16 layer
  // cuDNN has no f16 algorithm for, its f32 fallback (on f32 copies of x and dz).
  const auto fall_back = [&](const char* direction) {
    prepare_f32(st, p, direction, out_h, out_w);
    to_f32(x, p.x32, stream);
    to_f32(st.dz, p.dz32, stream);
  };
  if (need_filter) {
    const auto pick = [&](bool f32) {
      const bool fma_only = (f32 || !half) && o.fma_math_only;
      cudnnTensorDescriptor_t xd = f32 ? p.x32d.get() : p.x.get(), dyd = f32 ? p.y32d.get() : p.y.get();
      cudnnFilterDescriptor_t wd = f32 ? st.w32.get() : st.w.get();
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
      int count = 0;
      if (p.timed) {
        // The candidates write their result: into a scratch gradient, never into
        // the layer's gradient, which holds what this step has accumulated so far.
        Tensor scratch = Tensor::empty(master.shape(), f32 ? DType::kF32 : dtype, Device::kGpu);
        const auto [ws, ws_bytes] = search_workspace(ctx, o);
        MF_GPU_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
            handle, xd, f32 ? p.x32.raw() : x.raw(), dyd, f32 ? p.dz32.raw() : st.dz.raw(), p.bwd_filter_conv.get(),
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
      return choose(perf, count, fma_only, p.bwd_filter_conv.get(), size, p.bwd_filter, ctx, o);
    };
    if (!pick(false)) {
      if (!half) no_algorithm("backward-filter", shape_text(p.n, p.h, p.w, st.c, dtype), o);
      fall_back("backward-filter");
      p.bwd_filter = {};
      MF_GPU_CHECK(cudnnSetConvolutionMathType(p.bwd_filter_conv.get(), requested_math(DType::kF32, o)));
      if (!pick(true))
        no_algorithm("backward-filter", shape_text(p.n, p.h, p.w, st.c, dtype) + " (in f16 or f32)", o);
      p.bwd_filter.f32 = true;
    }
  }
  if (need_data) {
    const auto pick = [&](bool f32) {
      const bool fma_only = (f32 || !half) && o.fma_math_only;
      cudnnTensorDescriptor_t dxd = f32 ? p.x32d.get() : p.x.get(), dyd = f32 ? p.y32d.get() : p.y.get();
      cudnnFilterDescriptor_t wd = f32 ? st.w32.get() : st.w.get();
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
      int count = 0;
      if (p.timed) {
        // dx (or its f32 copy) is written by the candidates, then overwritten below.
        if (f32) ensure(p.dx32, p.x32.shape(), DType::kF32, Device::kGpu);
        const auto [ws, ws_bytes] = search_workspace(ctx, o);
        MF_GPU_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
            handle, wd, f32 ? master.raw() : weight, dyd, f32 ? p.dz32.raw() : st.dz.raw(),
            p.bwd_data_conv.get(), dxd, f32 ? p.dx32.raw() : dx.raw(), static_cast<int>(perf.size()), &count,
            perf.data(), ws, ws_bytes));
      } else {
        MF_GPU_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, wd, dyd, p.bwd_data_conv.get(), dxd,
                                                                 static_cast<int>(perf.size()), &count, perf.data()));
      }
      const auto size = [&](cudnnConvolutionBwdDataAlgo_t algo, std::size_t* bytes) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(handle, wd, dyd, p.bwd_data_conv.get(), dxd, algo, bytes);
      };
      return choose(perf, count, fma_only, p.bwd_data_conv.get(), size, p.bwd_data, ctx, o);
    };
    if (!pick(false)) {
      if (!half) no_algorithm("backward-data", shape_text(p.n, p.h, p.w, st.c, dtype), o);
      fall_back("backward-data");
      p.bwd_data = {};
      MF_GPU_CHECK(cudnnSetConvolutionMathType(p.bwd_data_conv.get(), requested_math(DType::kF32, o)));
      if (!pick(true)) no_algorithm("backward-data", shape_text(p.n, p.h, p.w, st.c, dtype) + " (in f16 or f32)", o);
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
    to_f32(x, p.x32, stream);
    MF_GPU_CHECK(cudnnConvolutionBackwardFilter(handle, &one, p.x32d.get(), p.x32.raw(), p.y32d.get(), p.dz32.raw(),
                                                p.bwd_filter_conv.get(), p.bwd_filter.algo, ws,
                                                p.bwd_filter.workspace, &zero, st.w32.get(), st.dw32.raw()));
    launch_add_f32_to_f16(st.dw32.data<float>(), grad.data<Half>(), st.dw32.numel(), stream);
  } else {
    MF_GPU_CHECK(cudnnConvolutionBackwardFilter(handle, &one, p.x.get(), x.raw(), p.y.get(), st.dz.raw(),
                                                p.bwd_filter_conv.get(), p.bwd_filter.algo, ws,
                                                p.bwd_filter.workspace, &one, st.w.get(), grad.raw()));
  }
  if (!dx.defined()) return;  // the first layer: nothing upstream needs dx
  // dx = conv_data(W, dz): beta = 0 overwrites.
  ws = p.bwd_data.workspace ? ctx.workspace(p.bwd_data.workspace) : nullptr;
  if (data_f32) {
    ensure(p.dx32, p.x32.shape(), DType::kF32, Device::kGpu);
    MF_GPU_CHECK(cudnnConvolutionBackwardData(handle, &one, st.w32.get(), master.raw(), p.y32d.get(),
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
