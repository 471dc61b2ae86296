// tensor.h: Tensor = shape + dtype + device + shared storage.
//
// A Tensor is a handle: copying it shares the storage (like a shared_ptr); clone() and
// to() make real copies, and nothing ever copies between host and device behind your
// back. Data are row-major and contiguous. Host memory is 64-byte aligned (AVX-512 rows);
// device memory comes from the caching DeviceAllocator.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/gpu_runtime.h"
#include "tensor/dtype.h"
#include "tensor/shape.h"

namespace mf {

// A block of memory on one device, freed when the last Tensor using it goes. Throws
// OutOfMemoryError when the memory cannot be had (host or device).
class Storage {
 public:
  Storage(std::size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false

  // Uninitialised memory. Memory that cannot be had, host or device, throws
  // OutOfMemoryError naming where, this tensor's dtype, shape and size: "out of host memory
  // allocating f32 (16384, 32, 26, 26) on cpu (1.29 GiB)"; the programs add what to try.
  // A byte count past size_t throws std::overflow_error (nbytes()).
  static Tensor empty(const Shape& shape, DType dtype = DType::kF32, Device device = Device::kCpu);
  static Tensor zeros(const Shape& shape, DType dtype = DType::kF32, Device device = Device::kCpu);
  // A host f32 tensor holding `values` (values.size() must equal shape.numel()).
  static Tensor from_vector(const Shape& shape, const std::vector<float>& values);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  std::int64_t dim(int i) const { return shape_[i]; }
  int rank() const { return shape_.rank(); }
  std::int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  // Throws std::overflow_error when the byte count does not fit in size_t (as numel() does
  // for the element count): a wrapped size would get a buffer far too small.
  std::size_t nbytes() const {
    std::size_t n = 0;
    if (__builtin_mul_overflow(static_cast<std::size_t>(numel()), dtype_size(dtype_), &n))
      throw std::overflow_error("tensor of shape " + shape_.str() + " has more bytes than size_t can count");
    return n;
  }
  bool is_cpu() const { return device_ == Device::kCpu; }
  bool is_gpu() const { return device_ == Device::kGpu; }

  // Typed pointer to the first element; throws if T does not match dtype(). On a GPU
  // tensor the pointer is a device pointer (for kernels, never for the host to read).
  template <class T> T* data() {
    check_type(DTypeOf<T>::value);
    return static_cast<T*>(raw());
  }
  template <class T> const T* data() const {
    check_type(DTypeOf<T>::value);
    return static_cast<const T*>(raw());
  }
  void* raw() const {
    return storage_ ? static_cast<char*>(storage_->data()) + offset_ : nullptr;
  }

  // A copy on `device` (a plain clone if already there). Host<->device copies are
  // synchronous: this is the explicit, visible copy; pipelines use copy_from_async.
  Tensor to(Device device) const;
  // A copy converted to `dtype` (f32 <-> f16 with round-to-nearest-even; u8 -> f32), on
  // the same device.
  Tensor to(DType dtype) const;
  Tensor clone() const;

  // Views sharing this tensor's storage.
  Tensor reshape(const Shape& shape) const;             // same numel; the tensor must be defined
  Tensor slice(std::int64_t begin, std::int64_t end) const;  // rows [begin, end) of dim 0

  // Copies src (same shape and dtype, any devices) into this tensor. src may overlap this
  // tensor (views of one buffer), on the GPU too, where that costs a temporary and a wait.
  void copy_from(const Tensor& src);
  void copy_from_async(const Tensor& src, GpuStream stream);
  void fill_zero();
  void fill_zero_async(GpuStream stream);

  // "f32 (64, 32, 26, 26) on gpu"
  std::string describe() const;
  static std::string describe(const Shape& shape, DType dtype, Device device);
  // Host f32 contents as a vector (copies from the device when needed; f16 is widened).
  std::vector<float> to_vector() const;
  // True when both are views of the same storage and offset (same buffer).
  bool same_buffer(const Tensor& o) const { return storage_ == o.storage_ && offset_ == o.offset_; }
  // True when both are defined and views of the same storage, at any offsets: writing one
  // may change the other (a slice or reshape of a tensor shares its storage).
  bool shares_storage(const Tensor& o) const { return storage_ != nullptr && storage_ == o.storage_; }
  // True when both are views of one storage whose bytes intersect (an empty view overlaps
  // nothing): writing one changes what the other holds.
  bool overlaps(const Tensor& o) const {
    if (!shares_storage(o) || nbytes() == 0 || o.nbytes() == 0) return false;
    const char* a = static_cast<const char*>(raw());
    const char* b = static_cast<const char*>(o.raw());
    return a < b + o.nbytes() && b < a + nbytes();
  }

 private:
  friend void ensure(Tensor& t, const Shape& shape, DType dtype, Device device);
  void check_type(DType want) const;
  Shape shape_;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
  std::shared_ptr<Storage> storage_;
  std::size_t offset_ = 0;  // bytes from storage_->data()
};

// Makes `t` a tensor of this shape, dtype and device: unchanged when it is one already (a
// view at an offset stays where it is), else reusing its storage when that is on the same
// device and large enough (the view then starts at the storage's first byte), and
// allocating otherwise. Layers keep their outputs and gradients in such buffers, so a
// training step allocates nothing after the first, a smaller last batch reuses the front
// of the full batch's buffers, and a captured CUDA graph sees the same addresses at every
// replay.
void ensure(Tensor& t, const Shape& shape, DType dtype, Device device);

}  // namespace mf
