// gpu_runtime.cpp: device discovery, selection, copies and pinned memory; in a CPU-only
// build each GPU call throws NoGpuError("built without CUDA").
#include "runtime/gpu_runtime.h"

#include <stdexcept>
#include <string>

#include "runtime/errors.h"

#if MF_WITH_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda_check.h"
#endif

namespace mf {

#if MF_WITH_CUDA

const GpuStatus& gpu_status() {
  static const GpuStatus status = [] {
    GpuStatus s;
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      // On a machine without an NVIDIA driver this is "CUDA driver version is insufficient
      // for CUDA runtime version": that means "no GPU here", whatever the wording.
      s.reason = std::string("no usable CUDA device: ") + cudaGetErrorString(e);
      cudaGetLastError();  // clear the sticky error so later queries start clean
    } else if (n == 0) {
      s.reason = "no CUDA device found (check CUDA_VISIBLE_DEVICES)";
    } else {
      s.available = true;
      s.device_count = n;
    }
    return s;
  }();
  return status;
}

static void require_gpu() {
  if (!gpu_available()) throw NoGpuError("GPU requested but " + gpu_status().reason);
}

void select_gpu(int index) {
  require_gpu();
  if (index < 0 || index >= gpu_status().device_count)
    throw std::invalid_argument("--gpu " + std::to_string(index) + ": only " +
                                std::to_string(gpu_status().device_count) +
                                " visible CUDA device(s) (numbered from 0)");
  MF_GPU_CHECK(cudaSetDevice(index));
}

GpuDeviceInfo gpu_device_info(int index) {
  require_gpu();
  cudaDeviceProp prop{};
  MF_GPU_CHECK(cudaGetDeviceProperties(&prop, index));
  GpuDeviceInfo info;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  info.total_memory = prop.totalGlobalMem;
  int cur = 0;
  MF_GPU_CHECK(cudaGetDevice(&cur));
  if (cur == index) MF_GPU_CHECK(cudaMemGetInfo(&info.free_memory, &info.total_memory));
  return info;
}

int current_gpu() {
  require_gpu();
  int d = 0;
  MF_GPU_CHECK(cudaGetDevice(&d));
  return d;
}

static cudaMemcpyKind to_cuda(CopyKind k) {
  switch (k) {
    case CopyKind::kHostToDevice: return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost: return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice: return cudaMemcpyDeviceToDevice;
  }
  return cudaMemcpyDefault;
}

GpuStream compute_stream() {
  require_gpu();
  static cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    MF_GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }();
  return stream;
}

void gpu_copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, GpuStream stream) {
  if (bytes == 0) return;
  MF_GPU_CHECK(cudaMemcpyAsync(dst, src, bytes, to_cuda(kind), stream));
}
void gpu_synchronize() { MF_GPU_CHECK(cudaDeviceSynchronize()); }
void gpu_stream_synchronize(GpuStream stream) { MF_GPU_CHECK(cudaStreamSynchronize(stream)); }
void gpu_memset_async(void* dst, int value, std::size_t bytes, GpuStream stream) {
  if (bytes == 0) return;
  MF_GPU_CHECK(cudaMemsetAsync(dst, value, bytes, stream));
}

void* pinned_alloc(std::size_t bytes) {
  require_gpu();
  void* p = nullptr;
  if (cudaMallocHost(&p, bytes) != cudaSuccess) {
    cudaGetLastError();
    throw OutOfMemoryError("could not allocate " + format_bytes(bytes) + " of pinned host memory",
                           bytes, 0, 0);
  }
  return p;
}
void pinned_free(void* p) {
  if (p) MF_GPU_WARN(cudaFreeHost(p));
}

#else  // CPU-only build

const GpuStatus& gpu_status() {
  static const GpuStatus s{false, 0, "microflow was built without CUDA (CPU-only build)"};
  return s;
}
[[noreturn]] static void no_gpu() { throw NoGpuError("GPU requested but " + gpu_status().reason); }
void select_gpu(int) { no_gpu(); }
GpuStream compute_stream() { no_gpu(); }
GpuDeviceInfo gpu_device_info(int) { no_gpu(); }
int current_gpu() { no_gpu(); }
void gpu_copy_async(void*, const void*, std::size_t, CopyKind, GpuStream) { no_gpu(); }
void gpu_synchronize() { no_gpu(); }
void gpu_stream_synchronize(GpuStream) { no_gpu(); }
void gpu_memset_async(void*, int, std::size_t, GpuStream) { no_gpu(); }
void* pinned_alloc(std::size_t) { no_gpu(); }
void pinned_free(void*) {}

#endif

}  // namespace mf
