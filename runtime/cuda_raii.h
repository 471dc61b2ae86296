// cuda_raii.h: owners for CUDA streams and events, cuBLAS and cuDNN handles and
// descriptors, device buffers and pinned host buffers. Each is move-only and releases in
// its destructor (with MF_GPU_WARN: destructors never throw).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <memory>
#include <type_traits>
#include <utility>

#include "runtime/cuda_check.h"
#include "runtime/gpu_runtime.h"

namespace mf {

struct StreamDestroy { void operator()(cudaStream_t s) const { MF_GPU_WARN(cudaStreamDestroy(s)); } };
struct EventDestroy { void operator()(cudaEvent_t e) const { MF_GPU_WARN(cudaEventDestroy(e)); } };
struct GraphDestroy { void operator()(cudaGraph_t g) const { MF_GPU_WARN(cudaGraphDestroy(g)); } };
struct GraphExecDestroy { void operator()(cudaGraphExec_t g) const { MF_GPU_WARN(cudaGraphExecDestroy(g)); } };
struct CublasDestroy { void operator()(cublasHandle_t h) const { MF_GPU_WARN(cublasDestroy(h)); } };
struct CudnnDestroy { void operator()(cudnnHandle_t h) const { MF_GPU_WARN(cudnnDestroy(h)); } };
struct TensorDescDestroy {
  void operator()(cudnnTensorDescriptor_t d) const { MF_GPU_WARN(cudnnDestroyTensorDescriptor(d)); }
};
struct FilterDescDestroy {
  void operator()(cudnnFilterDescriptor_t d) const { MF_GPU_WARN(cudnnDestroyFilterDescriptor(d)); }
};
struct ConvDescDestroy {
  void operator()(cudnnConvolutionDescriptor_t d) const { MF_GPU_WARN(cudnnDestroyConvolutionDescriptor(d)); }
};

using Stream = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDestroy>;
using Event = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDestroy>;
using Graph = std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, GraphDestroy>;
using GraphExec = std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, GraphExecDestroy>;
using CublasHandle = std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, CublasDestroy>;
using CudnnHandle = std::unique_ptr<std::remove_pointer_t<cudnnHandle_t>, CudnnDestroy>;
using TensorDesc = std::unique_ptr<std::remove_pointer_t<cudnnTensorDescriptor_t>, TensorDescDestroy>;
using FilterDesc = std::unique_ptr<std::remove_pointer_t<cudnnFilterDescriptor_t>, FilterDescDestroy>;
using ConvDesc = std::unique_ptr<std::remove_pointer_t<cudnnConvolutionDescriptor_t>, ConvDescDestroy>;

inline Stream make_stream() {
  cudaStream_t s = nullptr;
  MF_GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return Stream(s);
}
inline Event make_event(bool timing = true) {
  cudaEvent_t e = nullptr;
  MF_GPU_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return Event(e);
}
inline TensorDesc make_tensor_desc() {
  cudnnTensorDescriptor_t d = nullptr;
  MF_GPU_CHECK(cudnnCreateTensorDescriptor(&d));
  return TensorDesc(d);
}
inline FilterDesc make_filter_desc() {
  cudnnFilterDescriptor_t d = nullptr;
  MF_GPU_CHECK(cudnnCreateFilterDescriptor(&d));
  return FilterDesc(d);
}
inline ConvDesc make_conv_desc() {
  cudnnConvolutionDescriptor_t d = nullptr;
  MF_GPU_CHECK(cudnnCreateConvolutionDescriptor(&d));
  return ConvDesc(d);
}

// n elements of device memory from cudaMalloc directly (not the caching allocator); for
// long-lived buffers of the GPU machinery itself. Move-only.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (n) MF_GPU_CHECK(cudaMalloc(&p_, n * sizeof(T)));
  }
  ~DeviceBuffer() {
    if (p_) MF_GPU_WARN(cudaFree(p_));
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (p_) MF_GPU_WARN(cudaFree(p_));
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

// Times GPU work on a stream with a pair of events: start(), enqueue work, stop_seconds()
// (waits for the stop event).
class EventTimer {
 public:
  explicit EventTimer(cudaStream_t stream) : stream_(stream), start_(make_event()), stop_(make_event()) {}
  void start() { MF_GPU_CHECK(cudaEventRecord(start_.get(), stream_)); }
  double stop_seconds() {
    MF_GPU_CHECK(cudaEventRecord(stop_.get(), stream_));
    MF_GPU_CHECK(cudaEventSynchronize(stop_.get()));
    float ms = 0;
    MF_GPU_CHECK(cudaEventElapsedTime(&ms, start_.get(), stop_.get()));
    return ms * 1e-3;
  }

 private:
  cudaStream_t stream_;
  Event start_, stop_;
};

// Page-locked host memory (a copy from it is truly asynchronous), freed with its owner.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes) : p_(bytes ? pinned_alloc(bytes) : nullptr), bytes_(bytes) {}
  ~PinnedBuffer() { pinned_free(p_); }
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      pinned_free(p_);
      p_ = std::exchange(o.p_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  template <class T> T* as() const { return static_cast<T*>(p_); }
  std::size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace mf
