// device_allocator.cpp: the caching device allocator (see device_allocator.h).
#include "runtime/device_allocator.h"

#include <cstdint>
#include <string>

#include "runtime/errors.h"
#include "runtime/gpu_runtime.h"

#if MF_WITH_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda_check.h"
#endif

namespace mf {

DeviceAllocator& DeviceAllocator::instance() {
  static DeviceAllocator* a = new DeviceAllocator();  // never destroyed: outlives every tensor
  return *a;
}

DeviceAllocator::~DeviceAllocator() { release_cached(); }

std::size_t DeviceAllocator::round_size(std::size_t bytes) {
  // 512-byte granules keep the free lists short; blocks above 1 MiB round to 64 KiB.
  const std::size_t g = bytes > (1u << 20) ? (64u << 10) : 512u;
  return bytes == 0 ? g : (bytes + g - 1) / g * g;
}

void DeviceAllocator::set_limit(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  limit_ = bytes;
}
std::size_t DeviceAllocator::limit() const { std::lock_guard<std::mutex> l(mu_); return limit_; }
std::size_t DeviceAllocator::in_use() const { std::lock_guard<std::mutex> l(mu_); return in_use_; }
std::size_t DeviceAllocator::peak() const { std::lock_guard<std::mutex> l(mu_); return peak_; }
std::size_t DeviceAllocator::reserved() const { std::lock_guard<std::mutex> l(mu_); return reserved_; }
void DeviceAllocator::reset_peak() { std::lock_guard<std::mutex> l(mu_); peak_ = in_use_; }

#if MF_WITH_CUDA

void* DeviceAllocator::allocate(std::size_t bytes) {
  if (!gpu_available()) throw NoGpuError("GPU memory requested but " + gpu_status().reason);
  std::lock_guard<std::mutex> lock(mu_);
  // A size near SIZE_MAX (a negative count cast to size_t) would wrap when rounded up.
  if (bytes > SIZE_MAX / 2)
    throw OutOfMemoryError("GPU memory request of " + format_bytes(bytes) + " is larger than any device",
                           bytes, in_use_, limit_);
  const std::size_t size = round_size(bytes);
  if (limit_ != 0 && in_use_ + size > limit_)
    throw OutOfMemoryError("GPU memory limit reached: need " + format_bytes(size) + " more, " +
                               format_bytes(in_use_) + " in use, limit " + format_bytes(limit_),
                           size, in_use_, limit_);
  // Reuse the smallest cached block that fits, unless it would waste more than half or
  // (being larger than asked) take the bytes handed out past the limit.
  auto it = free_.lower_bound(size);
  if (it != free_.end() && it->first <= 2 * size && (limit_ == 0 || in_use_ + it->first <= limit_)) {
    void* p = it->second;
    const std::size_t got = it->first;
    free_.erase(it);
    live_[p] = got;
    in_use_ += got;
    if (in_use_ > peak_) peak_ = in_use_;
    return p;
  }
  // New memory from the driver. Under a limit, all that is held counts, the cache too: the
  // limit is device memory, as its flag says, and a cache of blocks of sizes no longer asked
  // for (a batch size that changed) would otherwise hold up to twice the limit. The cache
  // goes back first when it stands in the way; then in use + size <= limit (checked above).
  if (limit_ != 0 && reserved_ + size > limit_) release_cached_locked();
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, size);
  if (e == cudaErrorMemoryAllocation && !free_.empty()) {
    cudaGetLastError();
    release_cached_locked();  // give the cache back to the driver and try once more
    e = cudaMalloc(&p, size);
  }
  if (e != cudaSuccess && e != cudaErrorMemoryAllocation) {
    // Not a lack of memory: an earlier kernel fault, a call forbidden during graph
    // capture, a lost device. Reported as what it is.
    cudaGetLastError();
    throw GpuError(cudaGetErrorString(e), "cudaMalloc(" + format_bytes(size) + ")", "device_allocator.cpp");
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    std::size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cudaGetLastError();
    throw OutOfMemoryError(std::string("cudaMalloc of ") + format_bytes(size) + " failed (" +
                               cudaGetErrorString(e) + "): " + format_bytes(in_use_) +
                               " in use by microflow, " + format_bytes(free_b) + " free of " +
                               format_bytes(total_b) + " on the device",
                           size, in_use_, limit_);
  }
  reserved_ += size;
  live_[p] = size;
  in_use_ += size;
  if (in_use_ > peak_) peak_ = in_use_;
  return p;
}

void DeviceAllocator::deallocate(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) return;  // not ours: ignore rather than corrupt the lists
  in_use_ -= it->second;
  free_.emplace(it->second, p);
  live_.erase(it);
}

void DeviceAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked();
}

// cudaFree waits for the device, so no queued work still uses a block it frees.
void DeviceAllocator::release_cached_locked() {
  for (auto& [s, p] : free_) {
    MF_GPU_WARN(cudaFree(p));
    reserved_ -= s;
  }
  free_.clear();
}

#else  // CPU-only build

void* DeviceAllocator::allocate(std::size_t) {
  throw NoGpuError("GPU memory requested but " + gpu_status().reason);
}
void DeviceAllocator::deallocate(void*) {}
void DeviceAllocator::release_cached() {}
void DeviceAllocator::release_cached_locked() {}

#endif

}  // namespace mf
