// gpu_context.cpp: creating the handles, binding them to the compute stream, the workspace.
#include "runtime/gpu_context.h"

#include <stdexcept>

#include "runtime/device_allocator.h"
#include "runtime/gpu_runtime.h"

namespace mf {

GpuContext& GpuContext::current() {
  static GpuContext* ctx = new GpuContext();  // lives as long as the process (handles outlive tensors)
  return *ctx;
}

GpuContext::GpuContext() {
  stream_ = compute_stream();  // throws NoGpuError without a GPU
  cublasHandle_t b = nullptr;
  MF_GPU_CHECK(cublasCreate(&b));
  cublas_.reset(b);
  MF_GPU_CHECK(cublasSetStream(b, stream_));
  // cuBLAS must not allocate its own workspace while a graph is being captured: give it
  // one up front, of the size the cuBLAS guide recommends (cublasSetWorkspace): 32 MiB on
  // Hopper (sm_90) and later, whose kernels may use more, 4 MiB before.
  int device = 0, major = 0;
  MF_GPU_CHECK(cudaGetDevice(&device));
  MF_GPU_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  cublas_workspace_ = DeviceBuffer<unsigned char>(major >= 9 ? (32u << 20) : (4u << 20));
  MF_GPU_CHECK(cublasSetWorkspace(b, cublas_workspace_.get(), cublas_workspace_.size()));
  cudnnHandle_t d = nullptr;
  MF_GPU_CHECK(cudnnCreate(&d));
  cudnn_.reset(d);
  MF_GPU_CHECK(cudnnSetStream(d, stream_));
}

void* GpuContext::reduction_scratch(std::size_t bytes) {
  if (bytes <= reduction_scratch_.size()) return reduction_scratch_.get();
  if (capturing())
    throw std::logic_error("the reduction scratch was first asked for during a CUDA graph capture: run the step "
                           "eagerly once first");
  MF_GPU_CHECK(cudaStreamSynchronize(stream_));  // the old scratch may still be in use
  reduction_scratch_ = DeviceBuffer<unsigned char>(bytes);
  MF_GPU_CHECK(cudaMemsetAsync(reduction_scratch_.get(), 0, reduction_scratch_.size(), stream_));
  MF_GPU_CHECK(cudaStreamSynchronize(stream_));
  return reduction_scratch_.get();
}

void* GpuContext::workspace(std::size_t bytes) {
  if (bytes <= workspace_bytes_) return workspace_;
  MF_GPU_CHECK(cudaStreamSynchronize(stream_));  // the old workspace may still be in use
  DeviceAllocator& a = DeviceAllocator::instance();
  void* grown = a.allocate(bytes);  // first: if this throws, the old workspace stays
  if (workspace_) a.deallocate(workspace_);
  workspace_ = grown;
  workspace_bytes_ = bytes;
  return workspace_;
}

void GpuContext::release_workspace() {
  if (!workspace_) return;
  MF_GPU_CHECK(cudaStreamSynchronize(stream_));
  DeviceAllocator::instance().deallocate(workspace_);
  workspace_ = nullptr;
  workspace_bytes_ = 0;
}

bool GpuContext::capturing() const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MF_GPU_CHECK(cudaStreamIsCapturing(stream_, &status));
  return status != cudaStreamCaptureStatusNone;  // an invalidated capture counts: it is still open
}

}  // namespace mf
