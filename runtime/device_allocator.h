// device_allocator.h: a caching allocator for device memory with an optional limit.
//
// cudaMalloc/cudaFree are slow and synchronise the device, so freed blocks are kept in
// per-size free lists and handed out again. A limit (train_mnist --gpu-memory-limit) caps
// the device memory held, cached blocks included (the cache is given back when it stands
// in the way); needing more than the limit in use, or cudaMalloc failing even after the
// cache is emptied, throws OutOfMemoryError with the numbers. The article's "limit GPU memory
// growth", made explicit: nothing is grabbed up front.
//
// Frees are stream-ordered on a single stream: a freed block is reused by later work on
// the same stream, which is safe because that stream runs in order. Work on other
// streams must keep its buffers alive itself (the prefetch pipeline owns its buffers).
#pragma once
#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>

namespace mf {

class DeviceAllocator {
 public:
  // The allocator of the current device's process (one per process; device 0 .. n-1 share
  // it after select_gpu, which is called once at start-up).
  static DeviceAllocator& instance();

  // At least `bytes` of device memory, 256-byte aligned. Throws OutOfMemoryError.
  void* allocate(std::size_t bytes);
  void deallocate(void* p);

  void set_limit(std::size_t bytes);  // 0: no limit
  std::size_t limit() const;
  std::size_t in_use() const;     // bytes handed out now (rounded block sizes)
  std::size_t peak() const;       // most bytes handed out at once since reset_peak()
  std::size_t reserved() const;   // bytes held from cudaMalloc: in use plus cached
  void reset_peak();
  void release_cached();          // cudaFree every cached block

  ~DeviceAllocator();

 private:
  DeviceAllocator() = default;
  static std::size_t round_size(std::size_t bytes);
  void release_cached_locked();  // release_cached, with mu_ held

  mutable std::mutex mu_;
  std::multimap<std::size_t, void*> free_;           // size -> block
  std::unordered_map<void*, std::size_t> live_;      // block -> size
  std::size_t limit_ = 0, in_use_ = 0, peak_ = 0, reserved_ = 0;
};

}  // namespace mf
