// gpu_runtime.h: the host-side face of the GPU for code that must not include CUDA headers
// (tensor/, apps/, tests): is there a GPU, device memory, copies. In a CPU-only build every
// call that needs a GPU throws NoGpuError saying so.
#pragma once
#include <cstddef>
#include <string>

struct CUstream_st;  // cudaStream_t is CUstream_st*: declared here so hosts need no CUDA header

namespace mf {

using GpuStream = CUstream_st*;  // nullptr: the legacy default stream

struct GpuStatus {
  bool available = false;
  int device_count = 0;
  std::string reason;  // why not available: "built without CUDA", the driver's message, ...
};

// Queried once (cudaGetDeviceCount); any error there means "no GPU", with the reason kept.
const GpuStatus& gpu_status();
inline bool gpu_available() { return gpu_status().available; }

struct GpuDeviceInfo {
  std::string name;
  int major = 0, minor = 0;        // compute capability
  int multiprocessors = 0;
  std::size_t total_memory = 0, free_memory = 0;  // bytes
};
// Properties of visible device `index`. Throws NoGpuError without a GPU.
GpuDeviceInfo gpu_device_info(int index);

// Makes device `index` current for this thread (honours CUDA_VISIBLE_DEVICES: indices are
// of the visible devices). Throws NoGpuError or std::invalid_argument for a bad index.
void select_gpu(int index);
int current_gpu();

// The stream all of a model's GPU work is queued on (created on first use; one per
// process). Training captures it into a CUDA graph, so nothing else may use it then.
GpuStream compute_stream();

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };
// Asynchronous on `stream` (pinned host memory makes it truly asynchronous).
void gpu_copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, GpuStream stream);
// Waits for all work on the current device.
void gpu_synchronize();
void gpu_stream_synchronize(GpuStream stream);
void gpu_memset_async(void* dst, int value, std::size_t bytes, GpuStream stream);

// Page-locked host memory, for asynchronous copies (the prefetch pipeline).
void* pinned_alloc(std::size_t bytes);
void pinned_free(void* p);

}  // namespace mf
