// runtime.cpp: runtime/gpu_runtime.h and the device allocator for the CPU emulation of
// CUDA. "Device" memory is host memory, so copies are memmove and every launch has finished
// when it returns.
#include <cstdlib>
#include <cstring>
#include <new>

#include "runtime/device_allocator.h"
#include "runtime/gpu_runtime.h"
#include "test/emulator/streams.h"

namespace mf {

// No graphs here (gpu_runtime.h offers none): all work runs when it is queued.
bool emulator::enqueue(CUstream_st*, std::function<void()> work) {
  work();
  return true;
}
bool emulator::capturing(CUstream_st*) { return false; }
bool emulator::may_synchronize(CUstream_st*) { return true; }
int emulator::take_last_error() { return 0; }  // no call here fails: a bad launch throws

const GpuStatus& gpu_status() {
  static const GpuStatus status{true, 1, ""};
  return status;
}
GpuDeviceInfo gpu_device_info(int) {
  GpuDeviceInfo info;
  info.name = "CPU emulation of CUDA";
  return info;
}
void select_gpu(int) {}
int current_gpu() { return 0; }
GpuStream compute_stream() { return nullptr; }
void gpu_copy_async(void* dst, const void* src, std::size_t bytes, CopyKind, GpuStream) {
  if (bytes) std::memmove(dst, src, bytes);
}
void gpu_synchronize() {}
void gpu_stream_synchronize(GpuStream) {}
void gpu_memset_async(void* dst, int value, std::size_t bytes, GpuStream) {
  if (bytes) std::memset(dst, value, bytes);
}
void* pinned_alloc(std::size_t bytes) { return std::malloc(bytes ? bytes : 1); }
void pinned_free(void* p) { std::free(p); }

DeviceAllocator& DeviceAllocator::instance() {
  static DeviceAllocator allocator;
  return allocator;
}
// The exact size asked for (no rounding up as the real allocator does), so that under
// AddressSanitizer a kernel reading or writing one element too far is caught. Aligned to
// 256 bytes like cudaMalloc, and filled with garbage like fresh device memory.
void* DeviceAllocator::allocate(std::size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 256, bytes ? bytes : 1) != 0) throw std::bad_alloc();
  std::memset(p, 0xcd, bytes);
  return p;
}
void DeviceAllocator::deallocate(void* p) { std::free(p); }
DeviceAllocator::~DeviceAllocator() = default;

}  // namespace mf
