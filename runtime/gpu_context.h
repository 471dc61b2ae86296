// gpu_context.h: the per-process GPU context the layers run in: the compute stream, the
// cuBLAS and cuDNN handles bound to it, and one workspace shared by all cuDNN calls. It only
// grows (before any graph capture): to the --workspace-mb limit when cuDNN times algorithms
// (cudnnFind*), else to the largest size a chosen algorithm needs; release_workspace() frees it.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>

#include "runtime/cuda_raii.h"

namespace mf {

class GpuContext {
 public:
  // The process's context, created on first use on the device current then (select_gpu
  // once, before any GPU work; it is never moved to another device). Throws NoGpuError
  // without a GPU.
  static GpuContext& current();

  cudaStream_t stream() const { return stream_; }  // == compute_stream()
  cublasHandle_t cublas() const { return cublas_.get(); }
  std::size_t cublas_workspace_size() const { return cublas_workspace_.size(); }
  cudnnHandle_t cudnn() const { return cudnn_.get(); }

  // A device workspace of at least `bytes` (shared: valid until the next call that grows
  // it). Growing synchronises the stream, so call it outside graph capture (layers size
  // their workspace when they first meet a shape, in the eager warm-up step).
  void* workspace(std::size_t bytes);
  std::size_t workspace_size() const { return workspace_bytes_; }
  // Frees the workspace once the stream's work is done (layers ask for their size at every
  // call, so the next one allocates it again). For measurements that must start from a
  // device holding nothing, such as the memory-limit benchmark.
  void release_workspace();

  // The scratch of the deterministic reductions (kernels/gpu/launchers.h, reduction
  // scratch), for work on the compute stream: at least `bytes`, zeroed when it is made or
  // grown. Its first caller is an eager step (sizes come from the kernels, which the runtime
  // does not know); growing it during a graph capture throws std::logic_error.
  void* reduction_scratch(std::size_t bytes);

  // True while the compute stream is being captured into a CUDA graph (also after an
  // error has invalidated that capture, until it is ended).
  bool capturing() const;

  GpuContext(const GpuContext&) = delete;
  GpuContext& operator=(const GpuContext&) = delete;

 private:
  GpuContext();
  cudaStream_t stream_ = nullptr;
  CublasHandle cublas_;
  CudnnHandle cudnn_;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  DeviceBuffer<unsigned char> cublas_workspace_;
  DeviceBuffer<unsigned char> reduction_scratch_;
};

}  // namespace mf
